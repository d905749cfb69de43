#!/usr/bin/python3
"""The PPO example's figures (examples/rlhf/ppo.py), in one run:

- learning: mean reward over the last 10% of steps against the first 10%, per seed, in
  the default run (the live controller, the default capacity, --check-state), and
  whether each seed's run finished with an admitted plan change and every state check
  passing (issue 40's target: every seed of 1-20, PPO and GRPO);
- the controller's plan changes in those runs: trigger, moved bytes, seconds, and exposed
  seconds against the transition's duration;
- Nereus's cost: median step seconds with Nereus managing the units against the same
  math on plain torch tensors (--no-nereus), both on the fixed first plan (--plan-changes
  none, with room for the longest responses), the first seed, runs alternating
  (--cost-pairs pairs of --cost-steps steps; the median of each side's run medians);
- same math: whether those runs give the same rewards step for step.

Usage: PYTHONPATH=BUILD/python benches/ppo_bench.py [--seeds 1,2,3,4,5 | --seeds 1-20]
    [--steps 50] [--algorithm ppo|grpo] [--actor-train SPEC] [--cost-pairs 3] [--cost-steps 20]
    (--seeds "" skips the learning runs, --cost-pairs 0 the cost runs)
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
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0 and not r.stdout.strip():
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    out = json.loads(r.stdout)
    out["returncode"] = r.returncode
    return out


def seeds_of(text):
    """"1,2,5" or "1-20"."""
    out = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--cost-pairs", type=int, default=3)
    ap.add_argument("--cost-steps", type=int, default=20)
    ap.add_argument("--algorithm", choices=("ppo", "grpo"), default="ppo")
    ap.add_argument("--actor-train", metavar="SPEC", help="the actor's training layout in the learning runs (ppo.py's "
                    "--actor-train), e.g. tp=1,pp=1,fsdp=2,dp=1,devices=4-5")
    a = ap.parse_args()
    layout = ["--actor-train", a.actor_train] if a.actor_train else []
    seeds = seeds_of(a.seeds)
    per_seed, exposed = [], []
    for seed in seeds:
        out = run(seed, a.steps, "--check-state", "--algorithm", a.algorithm, *layout)
        if "error" in out:
            per_seed.append({"seed": seed, "finished": False, "error": out["error"]})
            print(json.dumps(per_seed[-1]), file=sys.stderr, flush=True)
            continue
        steps = out["steps"]
        n = max(1, len(steps) // 10)
        per_seed.append({"seed": seed, "finished": out["returncode"] == 0 and len(steps) == a.steps,
                         "admitted": sum(1 for t in out["transitions"] if t["completed"]),
                         "state_checks": out["state_checks"],
                         "reward_first_10pct": statistics.mean(s["reward_mean"] for s in steps[:n]),
                         "reward_last_10pct": statistics.mean(s["reward_mean"] for s in steps[-n:]),
                         "total_seconds": sum(s["seconds"] for s in steps),
                         "transitions": [{k: t[k] for k in ("step", "trigger", "moved_bytes", "seconds", "exposed_seconds")}
                                         for t in out["transitions"]]})
        print(json.dumps({k: per_seed[-1][k] for k in ("seed", "finished", "admitted", "state_checks")}), file=sys.stderr,
              flush=True)
        exposed += [t["exposed_seconds"] / t["seconds"] for t in out["transitions"] if t["seconds"] > 0]
    fixed = ["--plan-changes", "none", "--capacity", "64MiB", "--algorithm", a.algorithm]
    nereus_runs, plain_runs, identical = [], [], True
    for _ in range(a.cost_pairs):
        nereus = run(seeds[0] if seeds else 1, a.cost_steps, *fixed)["steps"]
        plain = run(seeds[0] if seeds else 1, a.cost_steps, *fixed, "--no-nereus")["steps"]
        nereus_runs.append(statistics.median(s["seconds"] for s in nereus))
        plain_runs.append(statistics.median(s["seconds"] for s in plain))
        identical = identical and [s["reward_mean"] for s in nereus] == [s["reward_mean"] for s in plain]
    nereus_s = statistics.median(nereus_runs) if nereus_runs else None
    plain_s = statistics.median(plain_runs) if plain_runs else None
    ok = [s for s in per_seed if s["finished"] and s["admitted"] >= 1 and s["state_checks"]["failed"] == 0]
    print(json.dumps({"bench": "ppo", "algorithm": a.algorithm, "actor_train": a.actor_train, "steps": a.steps, "seeds": per_seed,
                      "seeds_finished_with_a_change_and_checks_passing": f"{len(ok)} of {len(per_seed)}",
                      "exposed_over_duration_median": statistics.median(exposed) if exposed else None,
                      "exposed_over_duration_max": max(exposed) if exposed else None,
                      "median_step_seconds_nereus": nereus_s, "median_step_seconds_plain": plain_s,
                      "nereus_over_plain": nereus_s / plain_s if nereus_s else None, "cost_runs": {"nereus": nereus_runs, "plain": plain_runs},
                      "rewards_identical_to_plain": identical}))


if __name__ == "__main__":
    main()
