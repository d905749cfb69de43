#!/usr/bin/python3
"""The PPO example's figures (examples/rlhf/ppo.py), in one run:

- learning: mean reward over the last 10% of steps against the first 10%, per seed, in
  the default run (the live controller, the default capacity);
- the controller's plan changes in those runs: trigger, moved bytes, seconds, and exposed
  seconds against the transition's duration;
- Nereus's cost: median step seconds with Nereus managing the units against the same
  math on plain torch tensors (--no-nereus), both on the fixed first plan (--plan-changes
  none, with room for the longest responses), the first seed, runs alternating
  (--cost-pairs pairs of --cost-steps steps; the median of each side's run medians);
- same math: whether those runs give the same rewards step for step.

Usage: PYTHONPATH=BUILD/python benches/ppo_bench.py [--seeds 1,2,3,4,5] [--steps 50]
    [--cost-pairs 3] [--cost-steps 20]     (--seeds "" skips the learning runs)
Prints one JSON line. Not part of CI (tens of minutes).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

PPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "rlhf", "ppo.py")


def run(seed, steps, *extra):
    args = [sys.executable, PPO, "--steps", str(steps), "--seed", str(seed), "--json", *extra]
    r = subprocess.run(args, capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--cost-pairs", type=int, default=3)
    ap.add_argument("--cost-steps", type=int, default=20)
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",") if s]
    per_seed, exposed = [], []
    for seed in seeds:
        out = run(seed, a.steps)
        steps = out["steps"]
        n = max(1, len(steps) // 10)
        per_seed.append({"seed": seed,
                         "reward_first_10pct": statistics.mean(s["reward_mean"] for s in steps[:n]),
                         "reward_last_10pct": statistics.mean(s["reward_mean"] for s in steps[-n:]),
                         "total_seconds": sum(s["seconds"] for s in steps),
                         "transitions": [{k: t[k] for k in ("step", "trigger", "moved_bytes", "seconds", "exposed_seconds")}
                                         for t in out["transitions"]]})
        exposed += [t["exposed_seconds"] / t["seconds"] for t in out["transitions"] if t["seconds"] > 0]
    fixed = ["--plan-changes", "none", "--capacity", "64MiB"]
    nereus_runs, plain_runs, identical = [], [], True
    for _ in range(a.cost_pairs):
        nereus = run(seeds[0] if seeds else 1, a.cost_steps, *fixed)["steps"]
        plain = run(seeds[0] if seeds else 1, a.cost_steps, *fixed, "--no-nereus")["steps"]
        nereus_runs.append(statistics.median(s["seconds"] for s in nereus))
        plain_runs.append(statistics.median(s["seconds"] for s in plain))
        identical = identical and [s["reward_mean"] for s in nereus] == [s["reward_mean"] for s in plain]
    nereus_s, plain_s = statistics.median(nereus_runs), statistics.median(plain_runs)
    print(json.dumps({"bench": "ppo", "steps": a.steps, "seeds": per_seed,
                      "exposed_over_duration_median": statistics.median(exposed) if exposed else None,
                      "exposed_over_duration_max": max(exposed) if exposed else None,
                      "median_step_seconds_nereus": nereus_s, "median_step_seconds_plain": plain_s,
                      "nereus_over_plain": nereus_s / plain_s, "cost_runs": {"nereus": nereus_runs, "plain": plain_runs},
                      "rewards_identical_to_plain": identical}))


if __name__ == "__main__":
    main()
