#!/usr/bin/env python3
"""Every policy of `nereus simulate` on the drift traces, as the markdown table of
docs/controller.md. Usage: benches/controller_table.py NEREUS [TRACES_DIR] [--async-only] (default
examples/traces). One run per row (seed 1); the ratio column is against `static` of the same trace, job and
mode. Async rows (`--mode async`: generation and training as two streams on the pool's halves, plan changes
drain both) are marked `async` in the transitions column; --async-only prints only them."""
import json
import os
import subprocess
import sys

args = [a for a in sys.argv[1:] if a != "--async-only"]
async_only = "--async-only" in sys.argv
nereus = args[0]
traces = args[1] if len(args) > 1 else os.path.join(os.path.dirname(__file__), "..", "examples", "traces")
here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
cases = [  # (trace name, cluster, trace file, jobs, transitions mode)
    ("length-growth-64gpu", "paper-cluster-2-a100", os.path.join(traces, "length-growth-64gpu.jsonl"),
     ["ppo-llama-3.1-8b"], "overlap"),
    ("spot-16-64gpu", "paper-cluster-2-a100", os.path.join(traces, "spot-16-64gpu.jsonl"),
     [os.path.join(here, "examples", "jobs", "ppo-llama-3.1-8b-p256.json"), "ppo-llama-3.1-8b",
      os.path.join(here, "examples", "jobs", "ppo-llama-3.1-8b-p4096.json")], "overlap"),
    ("paper-window-32gpu", "paper-cluster-2-a100", os.path.join(here, "examples", "traces", "paper-window-32gpu.jsonl"),
     [os.path.join(here, "examples", "jobs", "ppo-llama-3.1-8b-p256.json"), "ppo-llama-3.1-8b",
      os.path.join(here, "examples", "jobs", "ppo-llama-3.1-8b-p4096.json")], "overlap"),
    ("link-flap-32gpu", "paper-cluster-2-a100", os.path.join(here, "examples", "traces", "link-flap-32gpu.jsonl"),
     ["ppo-llama-3.1-8b"], "overlap"),
    ("link-flap-32gpu", "paper-cluster-2-a100", os.path.join(here, "examples", "traces", "link-flap-32gpu.jsonl"),
     ["ppo-llama-3.1-8b"], "boundary"),
    ("growth-1024gpu", "paper-cluster-1-mi250x", os.path.join(here, "examples", "traces", "growth-1024gpu.jsonl"),
     ["ppo-llama-3.1-8b"], "overlap"),
    # Mixture of experts: GRPO on Qwen3-30B-A3B, expert-parallel layouts searched.
    ("length-growth-64gpu", "paper-cluster-3-h200", os.path.join(traces, "length-growth-64gpu.jsonl"),
     [os.path.join(here, "examples", "jobs", "grpo-qwen3-30b-a3b.json")], "overlap"),
    ("spot-16-64gpu", "paper-cluster-3-h200", os.path.join(traces, "spot-16-64gpu.jsonl"),
     [os.path.join(here, "examples", "jobs", "grpo-qwen3-30b-a3b.json")], "overlap"),
    # Asynchronous RL (one-step off-policy): the same job and traces as two streams.
    ("length-growth-64gpu", "paper-cluster-2-a100", os.path.join(traces, "length-growth-64gpu.jsonl"),
     ["ppo-llama-3.1-8b"], "async"),
    ("spot-16-64gpu", "paper-cluster-2-a100", os.path.join(traces, "spot-16-64gpu.jsonl"),
     ["ppo-llama-3.1-8b"], "async"),
    ("length-growth-64gpu", "paper-cluster-3-h200", os.path.join(traces, "length-growth-64gpu.jsonl"),
     [os.path.join(here, "examples", "jobs", "grpo-qwen3-30b-a3b.json")], "async"),
]
policies = ["nereus", "static", "static-max", "greedy", "every:3"]
print("| trace | prompts/step | transitions | policy | mean s/step (computing) | vs static | transitions: count, s, exposed s | "
      "failed (OOM) | decision ms median / max | held-out MAPE |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name, cluster, trace, jobs, mode in cases:
    if async_only and mode != "async":
        continue
    for job in jobs:
        prompts = json.load(open(job))["prompts_per_step"] if job.endswith(".json") else 1024
        rows = {}
        for p in policies:
            how = ["--mode", "async"] if mode == "async" else ["--transitions", mode]
            out = subprocess.run([nereus, "simulate", "--cluster", cluster, "--job", job, "--trace", trace, "--policy", p,
                                  *how, "--json"], capture_output=True, text=True)
            if out.returncode != 0:
                print(f"| {name} | {prompts} | {mode} | {p} | error: {out.stderr.strip()} ||||||")
                continue
            rows[p] = json.loads(out.stdout)
        base = rows.get("static", {}).get("mean_step_seconds")
        for p, j in rows.items():
            vs = f"{100 * (j['mean_step_seconds'] / base - 1):+.1f}%" if base else "–"
            print(f"| {name} | {prompts} | {mode} | {p} | {j['mean_step_seconds']:.2f} ({j['mean_compute_seconds']:.2f}) | {vs} | "
                  f"{j['transitions']}, {j['transition_seconds']:.1f}, {j['exposed_transition_seconds']:.1f} | "
                  f"{j['failed_steps']} ({j['oom_steps']}) | {j['decision_ms_median']:.2f} / {j['decision_ms_max']:.1f} | "
                  f"{100 * j['calibration_mape']:.1f}% |")
