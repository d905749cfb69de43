#!/usr/bin/env python3
"""Integration tests of `nereus bench transition`: real bytes through the local
transport and through UCX across 2 and 4 processes, verified against the fill of
sharding.md (by the bench and, from --dump files, independently here), and faults."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import check, check_perfetto, check_plot, finish  # noqa: E402
from shards import check_dump, expert_holders  # noqa: E402

NEREUS = sys.argv[1]



def bench(*args, timeout=240):
    p = subprocess.run([NEREUS, "bench", "transition", *args, "--json"], capture_output=True, text=True, timeout=timeout)
    out = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {}
    return p.returncode, out, p.stderr


# --perfetto: a track per destination device and per link; every copied byte in one
# transfer event; with --procs 2 the workers' transfers merged into the one file.
with tempfile.TemporaryDirectory() as d:
    for extra in [[], ["--transport", "ucx", "--procs", "2"]]:
        path = os.path.join(d, "t.json")
        svg = os.path.join(d, "links.svg")
        rc, j, err = bench("--model", "tiny-llama", "--from", "tp=4,pp=1,dp=1", "--to", "tp=2,pp=1,dp=2", "--repeat", "1",
                           "--perfetto", path, "--plot", svg, *extra)
        if rc == 0:
            check_plot(svg, [" → "])
        check(rc == 0 and os.path.exists(path), f"bench transition --perfetto {extra} ({err.strip()[-200:]})")
        if rc == 0:
            xs = check_perfetto(path, 3 if extra else 2)  # device tracks per worker, then the links
            byte_sum = sum(e["args"]["bytes"] for e in xs if e["pid"] != 2)
            check(byte_sum == j.get("copied_bytes"), f"perfetto {extra}: every copied byte in a transfer event "
                  f"({byte_sum} of {j.get('copied_bytes')})")
            check(all(e["args"]["transport"] in ("local", "local copy", "ucx") for e in xs), "perfetto: each transfer names its transport")
            if extra:
                check({e["args"]["process"] for e in xs} == {0, 1}, "perfetto: both workers' transfers merged")

# The JSON's transports: every copied byte under the transport that moved it, by the
# executors' own rule (with --procs 2, devices 0-1 are worker 0's: a copy between them is
# local, not ucx).
for extra, names in [(["--transport", "local"], {"local", "local copy"}), (["--transport", "ucx"], {"ucx", "local copy"}),
                     (["--transport", "ucx", "--procs", "2"], {"local", "ucx", "local copy"})]:
    rc, j, err = bench("--model", "tiny-llama", "--from", "tp=2,pp=1,dp=1", "--to", "tp=1,pp=1,dp=4", "--train",
                       "--repeat", "1", *extra)
    t = j.get("transports", {})
    total = sum(v.get("bytes", 0) for v in t.values())
    check(rc == 0 and set(t) == names and total == j.get("moved_bytes", 0) + j.get("local_bytes", 0) - j.get("kept_bytes", 0)
          and all(v.get("gbps", 0) > 0 for v in t.values()),
          f"bench JSON transports {extra}: {sorted(t)}, {total} bytes ({err.strip()[-200:]})")

# Local transport, training slots, fused packing, explicit PP partition.
for model, src, dst in [("tiny-llama", "tp=4,pp=1,dp=1,packing=fused", "tp=2,pp=2,dp=1,partition=2/4"),
                        ("tiny-qwen2-tied", "tp=2,pp=2,dp=1", "tp=4,pp=1,dp=2,packing=fused"),
                        ("tiny-llama-value", "tp=1,pp=2,dp=1", "tp=2,pp=1,dp=2")]:  # a score head
    rc, j, err = bench("--model", model, "--from", src, "--to", dst, "--train", "--verify", "--repeat", "2")
    check(rc == 0 and j.get("verified") is True, f"local {model} {src} -> {dst} verified ({err.strip()})")
    for k in ["seconds_median", "seconds_min", "moved_bytes", "gbps", "verified", "transport", "procs"]:
        check(k in j, f"bench JSON has {k}")

with tempfile.TemporaryDirectory() as d:
    rc, j, err = bench("--model", "tiny-llama", "--from", "tp=2,pp=1,dp=1", "--to", "tp=1,pp=2,dp=1,packing=fused",
                       "--train", "--dump", d, "--repeat", "1")
    check(rc == 0, f"local bench with --dump ({err.strip()})")
    check_dump(NEREUS, d, "tiny-llama")

with tempfile.TemporaryDirectory() as d:  # a value model: score.weight replicated on the last stage
    rc, j, err = bench("--model", "tiny-llama-value", "--from", "tp=4,pp=1,dp=1", "--to", "tp=2,pp=2,dp=1",
                       "--train", "--dump", d, "--repeat", "1")
    check(rc == 0, f"local bench of a score-head model with --dump ({err.strip()})")
    check_dump(NEREUS, d, "tiny-llama-value")
    files = json.load(open(os.path.join(d, "manifest.json")))["files"]
    score = sorted((f["device"], f["slot"]) for f in files if f.get("tensor") == "score.weight")
    check(score == sorted((dev, s) for dev in (2, 3) for s in ("param", "master", "exp_avg", "exp_avg_sq"))
          and all(f["box"] == [[0, 1], [0, 128]] for f in files if f.get("tensor") == "score.weight")
          and not any(f.get("tensor") == "lm_head.weight" for f in files),
          "score.weight [1, 128] whole on both TP ranks of the last stage, every training slot; no lm_head")

# FSDP (fsdp=F) to TP/PP and back, with training slots, locally and across processes.
for extra, src, dst in [([], "tp=2,pp=1,fsdp=2,dp=1", "tp=1,pp=2,dp=2,devices=2-5,packing=fused"),
                        ([], "tp=4,pp=1,dp=1", "tp=1,pp=1,fsdp=3,dp=1,devices=1-3"),
                        (["--transport", "ucx", "--procs", "2"], "tp=1,pp=2,dp=1", "tp=2,pp=1,fsdp=2,dp=1,devices=1-4"),
                        (["--transport", "ucx", "--procs", "2"], "tp=2,pp=1,fsdp=2,dp=1", "tp=4,pp=1,dp=1,devices=2-5")]:
    rc, j, err = bench("--model", "tiny-llama", "--from", src, "--to", dst, "--train", "--verify", "--repeat", "2", *extra)
    check(rc == 0 and j.get("verified") is True and j.get("moved_bytes", 0) > 0,
          f"FSDP {src} -> {dst} {extra}: every byte verified ({err.strip()[-300:]})")


def fsdp_chunk(lo, hi, F, f):
    """torch.chunk's f-th of F pieces of rows [lo, hi): ceil(n/F) rows each, the last short or empty."""
    n = hi - lo
    c = -(-n // F)
    return [lo + min(f * c, n), lo + min((f + 1) * c, n)]


with tempfile.TemporaryDirectory() as d:  # the dumped FSDP shards sit where sharding.md's FSDP rule puts them
    rc, j, err = bench("--model", "tiny-llama", "--from", "tp=1,pp=2,dp=1", "--to", "tp=2,pp=1,fsdp=3,dp=1,devices=2-7",
                       "--train", "--dump", d, "--repeat", "1")
    check(rc == 0, f"local bench into FSDP with --dump ({err.strip()[-300:]})")
    check_dump(NEREUS, d, "tiny-llama")
    files = json.load(open(os.path.join(d, "manifest.json")))["files"]
    got = {(f["device"], f["tensor"]): f["box"] for f in files if f["slot"] == "exp_avg"}
    rows_q, H = 0, 0
    for f in files:
        if f["tensor"] == "model.layers.0.self_attn.q_proj.weight":
            rows_q = max(rows_q, f["box"][0][1])
            H = f["box"][1][1]
    want = {}
    for fc in range(3):
        for r in range(2):
            dev = 2 + fc * 2 + r  # R[(s·fsdp + f)·tp + r]
            q = fsdp_chunk(r * rows_q // 2, (r + 1) * rows_q // 2, 3, fc)
            o = fsdp_chunk(0, H, 3, fc)
            if q[1] > q[0]:
                want[(dev, "model.layers.0.self_attn.q_proj.weight")] = [q, [0, H]]
            if o[1] > o[0]:
                want[(dev, "model.layers.0.self_attn.o_proj.weight")] = [o, [r * rows_q // 2, (r + 1) * rows_q // 2]]
    picked = {k: v for k, v in got.items() if k[1] in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.o_proj.weight")}
    check(picked == want and len(want) == 12, f"FSDP shards (q_proj by rows, o_proj's rows under TP columns) as torch.chunk cuts them: {picked}")

# Megatron packing (a trainer's own buffers: interleaved linear_qkv, [gate; up]
# linear_fc1) to vLLM's fused packing and back, verified, and its dump recomputed here.
for model, extra, src, dst in [
        ("tiny-llama", [], "tp=2,pp=1,dp=1,packing=megatron", "tp=1,pp=2,dp=2,devices=2-5,packing=fused"),
        ("tiny-qwen3-moe", [], "tp=1,pp=1,ep=4,etp=1,dp=1,packing=megatron", "tp=2,pp=1,dp=2,devices=2-5,packing=fused"),
        ("tiny-llama", ["--transport", "ucx", "--procs", "2"], "tp=2,pp=1,dp=2,packing=fused", "tp=1,pp=2,dp=1,devices=4-5,packing=megatron")]:
    rc, j, err = bench("--model", model, "--from", src, "--to", dst, "--train", "--verify", "--repeat", "2", *extra)
    check(rc == 0 and j.get("verified") is True, f"Megatron {src} -> {dst} {extra}: every byte verified ({err.strip()[-300:]})")
with tempfile.TemporaryDirectory() as d:
    rc, j, err = bench("--model", "tiny-llama", "--from", "tp=2,pp=1,dp=1", "--to", "tp=1,pp=1,dp=1,devices=3,packing=megatron",
                       "--train", "--dump", d, "--repeat", "1")
    check(rc == 0, f"local bench into Megatron packing with --dump ({err.strip()[-300:]})")
    check_dump(NEREUS, d, "tiny-llama")
    files = json.load(open(os.path.join(d, "manifest.json")))["files"]
    qkv = next((f for f in files if f["device"] == 3 and f.get("buffer") == "decoder.layers.0.self_attention.linear_qkv.weight"
                and f["slot"] == "param"), None)
    order = [(p["tensor"].split(".")[-2], p["box"][0]) for p in qkv["parts"]] if qkv else []
    # tiny-llama: 8 heads, 2 kv heads of 16 rows: per group 4 q heads (64 rows), then k, then v.
    check(order == [("q_proj", [0, 64]), ("k_proj", [0, 16]), ("v_proj", [0, 16]),
                     ("q_proj", [64, 128]), ("k_proj", [16, 32]), ("v_proj", [16, 32])],
          f"linear_qkv interleaves each query group's q, k and v rows: {order}")

# UCX across 2 and 4 processes.
for procs, model, src, dst in [(2, "tiny-llama", "tp=4,pp=1,dp=1,packing=fused", "tp=2,pp=1,dp=2"),
                               (4, "tiny-qwen2-tied", "tp=2,pp=2,dp=1,partition=3/2", "tp=4,pp=1,dp=1,packing=fused"),
                               (4, "tiny-llama", "tp=2,pp=1,dp=2", "tp=8,pp=1,dp=1")]:
    rc, j, err = bench("--model", model, "--from", src, "--to", dst, "--train", "--verify", "--transport", "ucx",
                       "--procs", str(procs), "--repeat", "2")
    check(rc == 0 and j.get("verified") is True and j.get("procs") == procs,
          f"ucx --procs {procs} {model} {src} -> {dst} verified ({err.strip()[-300:]})")
# The same across processes as two-sided tagged messages (both ends post, matched by tag),
# in one process too (every link a message to itself); small chunks: many messages a link.
for procs, model, src, dst in [(1, "tiny-llama", "tp=4,pp=1,dp=1,packing=fused", "tp=2,pp=1,dp=2"),
                               (2, "tiny-llama", "tp=4,pp=1,dp=1,packing=fused", "tp=2,pp=1,dp=2"),
                               (4, "tiny-qwen2-tied", "tp=2,pp=2,dp=1,partition=3/2", "tp=4,pp=1,dp=1,packing=fused")]:
    rc, j, err = bench("--model", model, "--from", src, "--to", dst, "--train", "--verify", "--transport", "ucx-tag",
                       "--procs", str(procs), "--repeat", "2", "--chunk-bytes", "65536")
    check(rc == 0 and j.get("verified") is True and j.get("procs") == procs and "ucx-tag" in j.get("transports", {}),
          f"ucx-tag --procs {procs} {model} {src} -> {dst} verified ({err.strip()[-300:]})")
# The same in rounds (each round's messages posted together, as NCCL needs): every process
# derives the rounds alone, so a disagreement would hang or land bytes in the wrong place.
for procs in [2, 4]:
    rc, j, err = bench("--model", "tiny-qwen2-tied", "--from", "tp=2,pp=2,dp=1,partition=3/2", "--to", "tp=4,pp=1,dp=1,packing=fused",
                       "--train", "--verify", "--transport", "ucx-tag", "--rounds", "--procs", str(procs), "--repeat", "2",
                       "--chunk-bytes", "65536")
    check(rc == 0 and j.get("verified") is True and "ucx-tag" in j.get("transports", {}),
          f"ucx-tag --rounds --procs {procs} verified ({err.strip()[-300:]})")
# Each link its path (--transport auto): local copies inside a worker, UCX gets across; in one
# process every link is a local copy.
for procs, want in [(1, {"local"}), (2, {"local", "ucx"})]:
    rc, j, err = bench("--model", "tiny-llama", "--from", "tp=4,pp=1,dp=1,packing=fused", "--to", "tp=2,pp=1,dp=2",
                       "--train", "--verify", "--transport", "auto", "--procs", str(procs), "--repeat", "2")
    got = set(j.get("transports", {})) - {"local copy"}
    check(rc == 0 and j.get("verified") is True and got == want and all(v["bytes"] > 0 for v in j["transports"].values()),
          f"auto --procs {procs}: verified, links moved by {sorted(got)} (want {sorted(want)}) ({err.strip()[-300:]})")
    if procs == 1:
        check("memcpy_gbps" in j, "auto in one process reports memcpy_gbps as local does")
with tempfile.TemporaryDirectory() as d:
    rc, j, err = bench("--model", "tiny-qwen2-tied", "--from", "tp=4,pp=1,dp=1", "--to", "tp=2,pp=2,dp=1,packing=fused",
                       "--train", "--transport", "ucx", "--procs", "2", "--dump", d, "--repeat", "1")
    check(rc == 0, f"ucx bench with --dump ({err.strip()[-300:]})")
    check_dump(NEREUS, d, "tiny-qwen2-tied")

# Mixture of experts: EP training layouts to TP (fused, vLLM's w13/w2) generation layouts and
# back, local and over UCX, verified; the dumped experts sit where sharding.md's expert
# rule puts them (recomputed here from the layout alone).
# DeepSeek-V3-style models (MLA, shared experts, the float32 router bias) too: real bytes
# with training slots and fused packing, locally and across processes, every byte verified.
UCX2 = ["--transport", "ucx", "--procs", "2"]
for model, extra, src, dst, flag in [
        ("tiny-qwen3-moe", [], "tp=1,pp=2,ep=4,etp=1,dp=1", "tp=2,pp=1,dp=4,packing=fused", "--sync"),
        ("tiny-qwen3-moe", [], "tp=2,pp=1,dp=2", "tp=1,pp=2,ep=2,etp=1,dp=1", "--train"),
        ("tiny-qwen3-moe", UCX2, "tp=2,pp=2,ep=2,etp=4,dp=1", "tp=2,pp=1,ep=2,etp=1,dp=2,packing=fused", "--train"),
        ("tiny-deepseek-v3", [], "tp=4,pp=1,dp=1", "tp=1,pp=3,ep=2,etp=1,dp=1", "--train"),
        ("tiny-deepseek-v3", UCX2, "tp=2,pp=1,ep=2,etp=1,dp=1", "tp=4,pp=1,dp=1,packing=fused", "--sync")]:
    rc, j, err = bench("--model", model, "--from", src, "--to", dst, flag, "--verify", "--repeat", "1", *extra)
    check(rc == 0 and j.get("verified") is True, f"{model} {extra} {src} -> {dst} {flag} verified ({err.strip()[-300:]})")
with tempfile.TemporaryDirectory() as d:
    # Target tp=2,ep=2,etp=1 on devices 0-3: 4 groups of the 6 experts (1, 2, 1, 2 of them).
    rc, j, err = bench("--model", "tiny-qwen3-moe", "--from", "tp=4,pp=1,dp=1", "--to", "tp=2,pp=1,ep=2,etp=1,dp=1",
                       "--train", "--dump", d, "--repeat", "1", "--transport", "ucx", "--procs", "2")
    check(rc == 0, f"MoE ucx bench with --dump ({err.strip()[-300:]})")
    check_dump(NEREUS, d, "tiny-qwen3-moe")
    files = json.load(open(os.path.join(d, "manifest.json")))["files"]
    held = {}
    for f in files:
        if ".experts." in f.get("tensor", "") and f["slot"] == "param" and ".layers.2." in f["tensor"]:
            held.setdefault(int(f["tensor"].split(".experts.")[1].split(".")[0]), set()).add(f["device"])
    want = expert_holders(6, 2, [0, 1, 2, 3], ep=2, etp=1)
    check(held == {x: set(devs) for x, devs in want.items()}, f"experts on the devices sharding.md names ({held})")
    check(not any(".layers.0.mlp.experts." in f.get("tensor", "") for f in files), "layer 0 (mlp_only_layers) has no experts")

# A DeepSeek-V3-style dump recomputed in full from the manifest, the bias files float32
# whatever the slot.
with tempfile.TemporaryDirectory() as d:
    rc, j, err = bench("--model", "tiny-deepseek-v3", "--from", "tp=4,pp=1,dp=1", "--to", "tp=2,pp=1,ep=2,etp=1,dp=1",
                       "--train", "--dump", d, "--repeat", "1", "--transport", "ucx", "--procs", "2")
    check(rc == 0, f"MLA ucx bench with --dump ({err.strip()[-300:]})")
    check_dump(NEREUS, d, "tiny-deepseek-v3", sample=1 << 30)
    files = json.load(open(os.path.join(d, "manifest.json")))["files"]
    bias = [f for f in files if f.get("tensor", "").endswith("e_score_correction_bias")]
    check(bias and all(f["dtype"] == "f32" for f in bias), f"the router's bias is float32 in every slot ({len(bias)} files)")
    check(all(f["dtype"] == "bf16" for f in files if f["slot"] == "param" and f not in bias),
          "every other param is the config's bf16")

# FP8 (dtype=fp8): a bf16 source quantized where it is read (by the sender, before the
# run), and FP8 units moved as they are, locally and across processes (gets and tagged
# messages), fused too; every dumped byte and scale recomputed here by an independent
# quantizer (shards.fp8_expected).
FP8 = "tp=2,pp=1,dp=1,devices=1-2,dtype=fp8"
for extra, src, dst, flag in [
        ([], "tp=1,pp=1,dp=1", FP8, "--sync"),
        (["--transport", "ucx-tag", "--procs", "2"], "tp=1,pp=1,dp=1", FP8, "--sync"),
        (UCX2, "tp=2,pp=1,ep=2,etp=1,dp=1", "tp=2,pp=1,ep=2,dp=2,devices=0-7,dtype=fp8,packing=fused", "--sync"),
        ([], "tp=2,pp=1,dp=1,dtype=fp8", "tp=1,pp=1,dp=2,devices=2-3,dtype=fp8", None),
        (UCX2, "tp=2,pp=1,dp=1,dtype=fp8,packing=fused", "tp=1,pp=1,ep=2,etp=1,dp=1,devices=2-3,dtype=fp8", None)]:
    with tempfile.TemporaryDirectory() as d:
        rc, j, err = bench("--model", "tiny-deepseek-v3", "--from", src, "--to", dst, *([flag] if flag else []), "--verify",
                           "--dump", d, "--repeat", "2", *extra)
        check(rc == 0 and j.get("verified") is True and ("quantize_seconds_median" in j) == (flag is not None),
              f"FP8 {extra} {src} -> {dst}: verified, quantized iff bf16 ({err.strip()[-300:]})")
        if rc == 0:
            check_dump(NEREUS, d, "tiny-deepseek-v3", sample=1 << 30)
            files = json.load(open(os.path.join(d, "manifest.json")))["files"]
            fp8 = [f for f in files if f["dtype"] == "f8_e4m3"]
            scales = [f for f in files if f["file"].endswith("weight_scale_inv@param.bin")]
            check(fp8 and len(fp8) == len(scales) and all(f["dtype"] == "f32" for f in scales)
                  and not any(f["dtype"] == "f8_e4m3" for f in files if "layernorm" in f["file"] or "mlp.gate.weight" in f["file"]),
                  f"FP8 dump: each quantized weight beside its float32 scales, norms and router as they were ({len(fp8)} FP8)")

# A worker dies mid-transition: a clear error in bounded time, sources intact. The bound is on
# detection (run start -> failure known), not on the whole command, whose setup and source
# verification under sanitizers on a loaded CI machine can take a minute by themselves.
rc, j, err = bench("--model", "tiny-llama", "--from", "tp=4,pp=1,dp=1", "--to", "tp=2,pp=1,dp=2", "--train",
                   "--transport", "ucx", "--procs", "4", "--repeat", "50", "--inject-kill-worker", "1", timeout=300)
check(rc == 1, f"dead worker: exit 1 (rc={rc})")
check("worker 1" in j.get("error", "") and "signal 9" in j.get("error", ""), f"dead worker named: {j.get('error')}")
check(j.get("verified_sources") is True, "surviving workers' sources still verify")
check(0 < j.get("failure_detected_seconds", -1) < 20, f"failure detected within 20 s of the run ({j.get('failure_detected_seconds')})")
# The same with tagged messages: receives posted for the dead worker's sends are cancelled.
for procs in (2, 4):
    rc, j, err = bench("--model", "tiny-llama", "--from", "tp=4,pp=1,dp=1", "--to", "tp=2,pp=1,dp=2", "--train",
                       "--transport", "ucx-tag", "--procs", str(procs), "--repeat", "50", "--inject-kill-worker", "1",
                       timeout=300)
    check(rc == 1 and "worker 1" in j.get("error", "") and "signal 9" in j.get("error", ""),
          f"ucx-tag --procs {procs}, dead worker: exit 1, named ({rc}, {j.get('error')})")
    check(j.get("verified_sources") is True and 0 < j.get("failure_detected_seconds", -1) < 20,
          f"ucx-tag --procs {procs}: survivors' sources verify, failure known in {j.get('failure_detected_seconds')} s")

# Bad input: refused before anything runs, exit 2 (a run that fails exits 1).
p = subprocess.run([NEREUS, "bench", "transition", "--model", "tiny-llama", "--from", "tp=2,pp=1,dp=1", "--to",
                    "tp=1,pp=1,dp=2", "--capacity", "1MiB"], capture_output=True, text=True, timeout=60)
check(p.returncode == 1 and "cannot allocate" in p.stderr, f"capacity too small: one clear error ({p.stderr.strip()})")
# Units larger than this machine's free memory: refused before any byte is allocated, not
# killed by the kernel mid-fill (941 GB of Qwen3-235B-A22B shards, every worker here).
for extra in [[], ["--transport", "ucx", "--procs", "2"]]:
    p = subprocess.run([NEREUS, "bench", "transition", "--model", "qwen3-235b-a22b", "--from", "tp=8,pp=1,dp=1", "--to",
                        "tp=4,pp=2,dp=1", *extra], capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and "of host memory but this machine has" in p.stderr and len(p.stderr.strip().splitlines()) == 1,
          f"units beyond the machine's memory {extra}: one clear error ({p.stderr.strip()[-300:]})")
# GPU units where no GPU is (this machine; the GPU suite runs them where one is): one line.
for extra, flag in [(["--transport", "cuda"], "--transport cuda: "), (["--transport", "cuda", "--procs", "2"], "--transport cuda: "),
                    (["--memory", "cuda", "--transport", "ucx-tag", "--procs", "2"], "--memory cuda: "),
                    (["--transport", "nccl"], "--transport nccl: "), (["--transport", "nccl", "--procs", "2"], "--transport nccl: ")]:
    p = subprocess.run([NEREUS, "bench", "transition", "--model", "tiny-llama", "--from", "tp=2,pp=1,dp=1", "--to",
                        "tp=1,pp=1,dp=2", *extra], capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and flag in p.stderr and len(p.stderr.strip().splitlines()) == 1,
          f"{extra} without a GPU: one clear error ({p.stderr.strip()[-300:]})")
# Emulated machines and what crosses them are for GPU memory beside CUDA IPC: one line each.
for extra, want in [(["--transport", "ucx", "--procs", "2", "--nodes", "2"], "--nodes emulates machines"),
                    (["--transport", "ucx", "--procs", "2", "--across", "nccl"], "--across nccl is for the links"),
                    (["--transport", "auto", "--procs", "2", "--nodes", "3"], "--nodes 3 must be between 1 and --procs (2)")]:
    p = subprocess.run([NEREUS, "bench", "transition", "--model", "tiny-llama", "--from", "tp=2,pp=1,dp=1", "--to",
                        "tp=1,pp=1,dp=2", *extra], capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and want in p.stderr and len(p.stderr.strip().splitlines()) == 1, f"{extra}: one clear error ({p.stderr.strip()})")
p = subprocess.run([NEREUS, "bench", "transition", "--model", "tiny-llama", "--from", "tp=2,pp=1,dp=1", "--to",
                    "tp=1,pp=1,dp=2", "--procs", "2"], capture_output=True, text=True, timeout=60)
check(p.returncode == 2 and "--transport ucx" in p.stderr, f"local with --procs 2 refused ({p.stderr.strip()})")
p = subprocess.run([NEREUS, "bench", "transition", "--model", "tiny-llama", "--from", "tp=2,pp=1,dp=1", "--to",
                    "tp=1,pp=1,dp=2", "--transport", "local", "--daemons", "127.0.0.1:1"], capture_output=True, text=True, timeout=60)
check(p.returncode == 2 and "--transport local" in p.stderr and len(p.stderr.strip().splitlines()) == 1,
      f"local with --daemons refused in one line, before any daemon is asked ({p.stderr.strip()})")

finish("bench")
