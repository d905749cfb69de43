#!/usr/bin/env python3
"""Writes a drift trace (interfaces.md, JSON Lines) whose inter-node links flap: another
job's traffic comes and goes every few steps, slowing them by a factor, while responses
stay near one length. The case where taking every improving transition does not pay.
Noise is seeded, so the file is reproducible.

  make_link_flap_trace.py [--steps 200] [--gpus 32] [--len 2000] [--period 3] [--slowdown 4]
                          [--seed 3] > trace.jsonl
"""
import argparse
import json
import random


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--gpus", type=int, default=32)
    ap.add_argument("--len", type=float, default=2000, help="mean response length")
    ap.add_argument("--period", type=int, default=3, help="steps between link changes")
    ap.add_argument("--slowdown", type=float, default=4, help="inter-node slowdown while the links are busy")
    ap.add_argument("--seed", type=int, default=3)
    a = ap.parse_args()
    if a.steps < 1 or a.period < 1 or a.gpus < 1 or a.len <= 0 or a.slowdown < 1:
        ap.error("steps, period and gpus must be positive, len positive, slowdown at least 1")
    rng = random.Random(a.seed)
    for step in range(a.steps):
        mean = a.len * rng.uniform(1.0, 1.1)
        busy = (step // a.period) % 2 == 1
        print(json.dumps({"step": step, "gpus": a.gpus, "response_len_mean": round(mean, 1),
                          "response_len_p95": round(mean * 1.16, 1), "link_slowdown": a.slowdown if busy else 1.0}))


if __name__ == "__main__":
    main()
