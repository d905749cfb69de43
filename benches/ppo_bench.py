#!/usr/bin/python3
"""The PPO example's figures (examples/rlhf/ppo.py), in one run:

- learning: mean reward over the last 10% of steps against the first 10%, per seed;
- Nereus's cost: median step seconds with Nereus managing the units against the same
  math on plain torch tensors (--no-nereus), same seed, runs alternating;
- same run, different plans: whether the Nereus run and the plain run of one seed give
  the same rewards step for step (they compute the same math on the same bytes).

Usage: PYTHONPATH=BUILD/python benches/ppo_bench.py [--seeds 1,2,3,4,5] [--steps 40]
Prints one JSON line. Not part of CI (minutes).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

PPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "rlhf", "ppo.py")


def run(seed, steps, plain):
    args = [sys.executable, PPO, "--steps", str(steps), "--seed", str(seed), "--json"] + (["--no-nereus"] if plain else [])
    r = subprocess.run(args, capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["steps"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    per_seed, nereus_s, plain_s, identical = [], [], [], []
    for seed in seeds:
        steps = run(seed, a.steps, plain=False)
        plain = run(seed, a.steps, plain=True)
        n = max(1, len(steps) // 10)
        first = statistics.mean(s["reward_mean"] for s in steps[:n])
        last = statistics.mean(s["reward_mean"] for s in steps[-n:])
        per_seed.append({"seed": seed, "reward_first_10pct": first, "reward_last_10pct": last})
        nereus_s.append(statistics.median(s["seconds"] for s in steps))
        plain_s.append(statistics.median(s["seconds"] for s in plain))
        identical.append([s["reward_mean"] for s in steps] == [s["reward_mean"] for s in plain])
    print(json.dumps({"bench": "ppo", "steps": a.steps, "seeds": per_seed,
                      "median_step_seconds_nereus": statistics.median(nereus_s),
                      "median_step_seconds_plain": statistics.median(plain_s),
                      "nereus_over_plain": statistics.median(nereus_s) / statistics.median(plain_s),
                      "rewards_identical_to_plain": identical}))


if __name__ == "__main__":
    main()
