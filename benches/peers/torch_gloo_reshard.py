#!/usr/bin/python3
"""The peer to beat: a TP reshard done the way RLHF frameworks do it today, with
torch.distributed (gloo): every rank all-gathers each tensor of its TP group, then
slices out its new shard. Same model and layouts as `nereus bench transition`.

usage: /usr/bin/python3 benches/peers/torch_gloo_reshard.py --nereus build/src/nereus \
         --model llama-3.2-1b --from-tp 4 --to-tp 2 [--repeat 3]
Needs Debian's python3-torch. Prints one JSON object. Runs on loopback only.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def split_axis(name):
    if any(k in name for k in ("embed_tokens", "lm_head", "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")):
        return 0
    if "o_proj" in name or "down_proj" in name:
        return 1
    return None  # replicated (norms)


def part(n, k, i):
    return i * n // k, (i + 1) * n // k


def rows_of(name, shape, tp, r, cfg):
    """Shard range along the split axis (heads for attention, kv replication aside)."""
    hd = cfg["head_dim"]
    if "q_proj" in name or "o_proj" in name:
        a, b = part(cfg["num_attention_heads"], tp, r)
        return a * hd, b * hd
    if "k_proj" in name or "v_proj" in name:
        nkv = cfg["num_key_value_heads"]
        if tp <= nkv:
            a, b = part(nkv, tp, r)
        else:
            a = r * nkv // tp
            b = a + 1
        return a * hd, b * hd
    axis = split_axis(name)
    return part(shape[axis], tp, r)


def worker(rank, world, args, tensors, cfg, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    # Source shards of this rank (tp = world, one unit), float16 stands in for bf16 bytes.
    shards = {}
    for name, shape in tensors:
        axis = split_axis(name)
        if axis is None:
            shards[name] = torch.ones(shape, dtype=torch.float16)
            continue
        a, b = rows_of(name, shape, args.from_tp, rank, cfg)
        s = list(shape)
        s[axis] = b - a
        shards[name] = torch.full(s, float(rank), dtype=torch.float16)
    times = []
    for _ in range(args.repeat):
        dist.barrier()
        t0 = time.perf_counter()
        new = {}
        for name, shape in tensors:
            axis = split_axis(name)
            if axis is None:
                new[name] = shards[name]
                continue
            parts = [torch.empty_like(shards[name]) if rows_of(name, shape, args.from_tp, q, cfg) == rows_of(name, shape, args.from_tp, rank, cfg)
                     else torch.empty([*(shards[name].shape[:axis]), rows_of(name, shape, args.from_tp, q, cfg)[1] - rows_of(name, shape, args.from_tp, q, cfg)[0], *(shards[name].shape[axis + 1:])], dtype=torch.float16)
                     for q in range(world)]
            dist.all_gather(parts, shards[name])
            full = torch.cat(parts, dim=axis)
            a, b = rows_of(name, shape, args.to_tp, rank % args.to_tp, cfg)
            new[name] = full.narrow(axis, a, b - a).contiguous()
        dist.barrier()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put(times)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nereus", default="build/src/nereus")
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--from-tp", type=int, default=4)
    ap.add_argument("--to-tp", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--port", type=int, default=29517)
    args = ap.parse_args()
    info = json.loads(subprocess.run([args.nereus, "model", "--model", args.model, "--tensors", "--json"],
                                     capture_output=True, text=True, check=True).stdout)
    cfg = {"head_dim": info["head_dim"], "num_attention_heads": info["num_attention_heads"],
           "num_key_value_heads": info["num_key_value_heads"]}
    tensors = [(t["name"], t["shape"]) for t in info["tensors"]]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.start_processes(worker, args=(args.from_tp, args, tensors, cfg, q), nprocs=args.from_tp, join=True,
                       start_method="spawn")
    times = sorted(q.get())
    print(json.dumps({"peer": "torch.distributed gloo all-gather + slice", "procs": args.from_tp,
                      "model": args.model, "from_tp": args.from_tp, "to_tp": args.to_tp,
                      "seconds_median": times[len(times) // 2], "seconds_min": times[0]}))


if __name__ == "__main__":
    main()
