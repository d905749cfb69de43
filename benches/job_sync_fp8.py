#!/usr/bin/python3
"""What an FP8 generation stage costs a job's weight sync.

A GRPO job on 4 host devices (actor/train on device 1, actor/generate on device 0, tp=1
each) ends steps with the weight sync actor/train -> actor/generate, once with the
generation stage in bf16 and once in FP8 (`dtype=fp8`: the sync quantizes the trained
bf16 blocks where they are read, into staging beside them, then copies FP8 bytes and
scales), in one run. Every unit is filled with sharding.md's fill and checked after the
last sync (`job.verify()`: FP8 units must hold the fill quantized).

Usage: PYTHONPATH=BUILD/python benches/job_sync_fp8.py [--model M] [--steps N] [--copy-threads T]
Prints one JSON line: per dtype the median sync seconds (the first sync, which faults in
the staging's pages, is listed but not in the median), the generation unit's bytes, and
fp8/bf16 of the medians.
"""
import argparse
import json
import os
import statistics
import tempfile
import time

import nereus


def syncs(model, fp8, steps, threads):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "grpo.json")
        with open(path, "w") as f:
            json.dump({"algorithm": "grpo", "prompts_per_step": 4, "samples_per_prompt": 2, "prompt_len": 16,
                       "max_response_len": 32, "models": {"actor": model, "reference": model, "reward": "rule"}}, f)
        plan = {"actor/generate": "tp=1,pp=1,dp=1,devices=0" + (",dtype=fp8" if fp8 else ""),
                "actor/infer": "tp=1,pp=1,dp=1,devices=2", "reference/infer": "tp=1,pp=1,dp=1,devices=3",
                "actor/train": "tp=1,pp=1,dp=1,devices=1"}
        job = nereus.Job(path, plan, devices=4, capacity="9GiB", copy_threads=threads, fill=True)
    times = []
    for _ in range(steps):
        for stage in job.model_stages:
            with job.stage(stage):
                pass  # the stage ran: actor/train now holds the next policy version
        t0 = time.perf_counter()
        job.end_step()
        times.append(time.perf_counter() - t0)
    check = job.verify()
    if not check["ok"]:
        raise SystemExit(f"after the syncs: {check['first_error']}")
    unit = sum(b["nbytes"] for u in job.units("actor/generate") for b in u.buffers())
    return {"median_s": statistics.median(times[1:]), "first_s": times[0], "unit_bytes": unit,
            "seconds": [round(t, 4) for t in times]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--copy-threads", type=int, default=2)
    a = ap.parse_args()
    out = {"model": a.model, "copy_threads": a.copy_threads}
    for name, fp8 in (("bf16", False), ("fp8", True)):
        out[name] = syncs(a.model, fp8, a.steps, a.copy_threads)
    out["fp8_over_bf16"] = round(out["fp8"]["median_s"] / out["bf16"]["median_s"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
