#!/usr/bin/env python3
"""Writes a drift trace (interfaces.md, JSON Lines) of a job growing to a large pool.

Responses grow 16x (exponentially, like examples/traces/length-growth-64gpu.jsonl) while
the pool doubles at fixed steps. Noise is seeded, so the file is reproducible.

  make_growth_trace.py [--steps 1000] [--start-len 512] [--growth 16]
                       [--pools 0:64,150:128,300:256,450:512,600:1024] [--seed 7] > trace.jsonl
"""
import argparse
import json
import random


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--start-len", type=float, default=512)
    ap.add_argument("--growth", type=float, default=16)
    ap.add_argument("--pools", default="0:64,150:128,300:256,450:512,600:1024",
                    help="STEP:GPUS,... the pool from each step on")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    pools = sorted((int(s), int(g)) for s, g in (p.split(":") for p in a.pools.split(",")))
    if not pools or pools[0][0] != 0:
        ap.error("--pools must start at step 0")
    rng = random.Random(a.seed)
    for step in range(a.steps):
        gpus = [g for s, g in pools if s <= step][-1]
        mean = a.start_len * a.growth ** (step / max(1, a.steps - 1)) * rng.uniform(0.97, 1.03)
        print(json.dumps({"step": step, "gpus": gpus, "response_len_mean": round(mean, 1),
                          "response_len_p95": round(mean * 1.16, 1)}))


if __name__ == "__main__":
    main()
