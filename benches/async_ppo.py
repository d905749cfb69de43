#!/usr/bin/python3
"""Async against sync PPO/GRPO on the example (examples/rlhf/ppo.py --async), same seeds
and step count, in one run:

- learning: mean reward over the last 10% of steps minus the first 10%, per seed, for the
  sync run on its fixed first plan (--plan-changes none, room for the longest responses)
  and the async run (--async: generation on devices 6-7, one-step off-policy);
- time: median training-step seconds and the wall clock of the whole run, each mode;
- weight updates of the async runs: count, how many were switched by the framework
  between decode steps (keep) or by the job at a generation run's start (automatic), and
  the median update and pause seconds.

Both streams share the machine's cores (os.cpu_count() is printed): on 2 cores they
compete for them, so async's wall clock here says little about a GPU cluster, where
generation and training run on different GPUs.

Usage: PYTHONPATH=BUILD/python benches/async_ppo.py [--seeds 1,2,3] [--steps 30]
    [--algorithm ppo|grpo] [--capacity 64MiB]
Prints one JSON line. Not part of CI (minutes per seed).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "rlhf", "ppo.py")


def run(seed, steps, algorithm, capacity, *extra):
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, PPO, "--steps", str(steps), "--seed", str(seed), "--algorithm", algorithm,
                        "--capacity", capacity, "--json", *extra], capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    out = json.loads(r.stdout)
    out["wall_seconds"] = time.perf_counter() - t0
    return out


def gain(steps):
    n = max(1, len(steps) // 10)
    return sum(s["reward_mean"] for s in steps[-n:]) / n - sum(s["reward_mean"] for s in steps[:n]) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--algorithm", default="ppo", choices=("ppo", "grpo"))
    ap.add_argument("--capacity", default="64MiB")
    a = ap.parse_args()
    rows = []
    for seed in [int(s) for s in a.seeds.split(",") if s]:
        sync = run(seed, a.steps, a.algorithm, a.capacity, "--plan-changes", "none")
        asyn = run(seed, a.steps, a.algorithm, a.capacity, "--async")
        row = {"seed": seed}
        for name, out in (("sync", sync), ("async", asyn)):
            if "error" in out:
                row[name] = {"error": out["error"]}
                continue
            row[name] = {"gain": round(gain(out["steps"]), 4),
                         "step_seconds_median": round(statistics.median(s["seconds"] for s in out["steps"]), 3),
                         "wall_seconds": round(out["wall_seconds"], 1)}
        if "error" not in asyn:
            u = asyn["weight_updates"]
            row["async"] |= {"max_staleness_seen": max(s["staleness"] for s in asyn["steps"]),
                             "updates": len(u), "keep": sum(x["pause"] == "keep" for x in u),
                             "automatic": sum(x["automatic"] for x in u),
                             "update_seconds_median": round(statistics.median(x["seconds"] for x in u), 4) if u else None,
                             "paused_seconds_median": round(statistics.median(x["paused_seconds"] for x in u), 5) if u else None,
                             "moved_bytes": u[0]["moved_bytes"] if u else 0}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    ok = [r for r in rows if "error" not in r["sync"] and "error" not in r["async"]]
    summary = {"cpus": os.cpu_count(), "algorithm": a.algorithm, "steps": a.steps, "seeds": rows}
    if ok:
        summary["mean_gain"] = {m: round(statistics.mean(r[m]["gain"] for r in ok), 4) for m in ("sync", "async")}
        summary["async_learns_as_well"] = all(r["async"]["gain"] >= r["sync"]["gain"] for r in ok)
        summary["wall_ratio_async_over_sync"] = round(statistics.median(r["async"]["wall_seconds"] / r["sync"]["wall_seconds"]
                                                                        for r in ok), 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
