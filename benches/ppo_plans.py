#!/usr/bin/python3
"""Same run, different plans (examples/rlhf/ppo.py): one seed on a fixed plan against the
same seed with one forced transition begun after generation at step 3 — placement only,
PP only, TP and DP — and against another seed with no transition. Reports, per run, the
steps identical to the run without a transition (reward, policy and value loss) and the
largest policy-loss difference; every forced transition is checked with --check-state.

Usage: PYTHONPATH=BUILD/python benches/ppo_plans.py [--steps 20] [--seed 1]
Prints one JSON line. Not part of CI (minutes).
"""
import argparse
import json
import os
import subprocess
import sys

PPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "rlhf", "ppo.py")
RUNS = {
    "placement only (actor/train 4-5 <-> critic/train 6-7)": [
        "3:actor/train=tp=2,pp=1,dp=1,devices=6-7", "3:critic/train=tp=2,pp=1,dp=1,devices=4-5"],
    "PP only (actor/train tp=2 -> tp=2,pp=2; critic/train moved)": [
        "3:actor/train=tp=2,pp=2,dp=1,devices=4-7", "3:critic/train=tp=2,pp=1,dp=1,devices=0-1"],
    "TP and DP (actor/train tp=2 -> tp=1,dp=2)": ["3:actor/train=tp=1,pp=1,dp=2,devices=4-5"],
}


def run(seed, steps, forced=()):
    args = [sys.executable, PPO, "--steps", str(steps), "--seed", str(seed), "--json", "--plan-changes", "none",
            "--capacity", "64MiB", "--check-state"]
    for f in forced:
        args += ["--force-transition", f]
    out = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
    return out


def compare(base, other):
    same = sum(1 for a, b in zip(base, other)
               if (a["reward_mean"], a["policy_loss"], a["value_loss"]) == (b["reward_mean"], b["policy_loss"], b["value_loss"]))
    return same, max(abs(a["policy_loss"] - b["policy_loss"]) for a, b in zip(base, other))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    base = run(a.seed, a.steps)["steps"]
    rows = []
    for name, forced in RUNS.items():
        out = run(a.seed, a.steps, forced)
        same, diff = compare(base, out["steps"])
        t = out["transitions"][0]
        rows.append({"run": name, "identical_steps": same, "max_policy_loss_diff": diff, "state_checks": out["state_checks"],
                     "moved_bytes": t["moved_bytes"], "seconds": t["seconds"], "exposed_seconds": t["exposed_seconds"]})
    same, diff = compare(base, run(a.seed + 1, a.steps)["steps"])
    rows.append({"run": f"seed {a.seed + 1} instead of {a.seed} (no transition)", "identical_steps": same,
                 "max_policy_loss_diff": diff})
    print(json.dumps({"bench": "ppo-plans", "steps": a.steps, "seed": a.seed, "runs": rows}))


if __name__ == "__main__":
    main()
