"""On a GPU machine (benches/gpu/run.sh, from the pack): the Python module over an embedded
job in GPU memory (`memory="cuda"`), computed on by that machine's own torch. Prints one
JSON line ("ok" true when every check held): where the shards live, the verification fill, and a round trip of torch-written
training state through transitions, compared bit for bit on the GPU.

The same checks as tests/test_python.py's on host memory (zero copy, round trip); only the
device differs, which is what this run is for: the torch side of DLPack export of CUDA units
runs nowhere else. With --bin DIR ("member" in the JSON), nereus.Member(memory="cuda") as
node 1 of a cluster job whose node 0 is DIR's nereusd: its step views are the GPU's too."""
import json
import sys
import time

JOB = "ppo-tiny"
BASE = {
    "actor/generate": "tp=2,pp=1,dp=2,devices=0-3",
    "actor/infer": "tp=2,pp=1,dp=1,devices=0-1",
    "critic/infer": "tp=2,pp=1,dp=1,devices=2-3",
    "reference/infer": "tp=2,pp=1,dp=1,devices=0-1",
    "reward/infer": "tp=2,pp=1,dp=1,devices=2-3",
    "actor/train": "tp=4,pp=1,dp=1,devices=0-3",
    "critic/train": "tp=4,pp=1,dp=1,devices=4-7",
}


def plan(**changes):
    p = dict(BASE)
    p.update({k.replace("__", "/"): v for k, v in changes.items()})
    return p


TARGETS = [plan(actor__train="tp=2,pp=1,dp=2,devices=4-7", critic__train="tp=4,pp=1,dp=1,devices=0-3"),
           BASE,
           plan(actor__train="tp=2,pp=2,dp=1,devices=4-7", critic__train="tp=4,pp=1,dp=1,devices=0-3")]


def main(memory):
    import torch
    out = {"python": sys.version.split()[0], "torch": torch.__version__, "memory": memory}
    gpu = memory == "cuda"
    if gpu and not torch.cuda.is_available():
        out["skipped"] = "no CUDA device"
        return out
    import nereus
    gpus = torch.cuda.device_count() if gpu else 1
    device = "cuda" if gpu else "cpu"
    out["gpus"] = gpus
    dtypes = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    job = nereus.Job(JOB, BASE, devices=8, capacity="256MiB", memory=memory, fill=True)
    out["fill_verified"] = job.verify()["ok"]

    # Zero copy: each shard a tensor on its device's GPU (kDLCUDA = 2; on host kDLCPU = 1,
    # device 0), over the unit's own memory.
    def placed(s):
        t = s.data
        where = (2, s.device % gpus) if gpu else (1, 0)
        return (s.__dlpack_device__() == where and t.is_cuda == gpu and (not gpu or t.device.index == where[1])
                and t.data_ptr() == s.data_ptr and t.dtype == dtypes[s.dtype])

    shards = job.units("actor/train")[0].shards(slot=None)
    out["shards_placed"] = all(placed(s) for s in shards)

    # Torch writes random full tensors into the units on the GPU; transitions move them;
    # every shard is compared with its box of the full tensor, bit for bit, on the GPU.
    g = torch.Generator().manual_seed(7)
    shape, dtype = {}, {}
    for u in job.units("actor/train"):
        for s in u.shards(slot=None):
            key, his = (s.tensor, s.slot), [hi for lo, hi in s.box]
            shape[key] = [max(a, b) for a, b in zip(shape[key], his)] if key in shape else his
            dtype[key] = dtypes[s.dtype]
    full = {k: torch.randn(shape[k], generator=g).to(dtype[k]).to(device) for k in shape}

    def index(s):
        return tuple(slice(lo, hi) for lo, hi in s.box)

    def mismatches():
        bad = 0
        for u in job.units("actor/train"):
            for s in u.shards(slot=None):
                got, want = s.data, full[(s.tensor, s.slot)][index(s)].contiguous()
                view = torch.int16 if got.element_size() == 2 else torch.int32
                bad += not torch.equal(got.view(view), want.view(view))
        return bad

    # Torch writes them inside the stage's block and leaves it with its kernels still queued
    # behind a long sleep, without synchronize(): the lease records an event on torch's
    # stream, and end_step's weight sync (which reads these units) waits for it.
    with job.stage("actor/train") as units:
        if gpu:
            torch.cuda._sleep(400_000_000)  # a few hundred ms of GPU time ahead of the copies
        for u in units:
            for s in u.shards(slot=None):
                s.data.copy_(full[(s.tensor, s.slot)][index(s)])
    job.end_step()
    synced = sum(not torch.equal(s.data.view(torch.int16), full[(s.tensor, "param")][index(s)].contiguous().view(torch.int16))
                 for u in job.units("actor/generate") for s in u.shards() if s.dtype == "bf16")
    out["stream_ordering"] = {"generate_mismatches_after_sync": synced}
    if gpu:
        # A side stream named on the block: the workspace it wrote stays the stage's until
        # that stream's kernel ends, and only then goes back to the device's arena.
        g2 = 2 % gpus  # critic/infer's first device
        job.set_workspace("critic/infer", 64 << 20)
        used0 = job.devices()[2]["used"]
        side = torch.cuda.Stream(device=g2)
        with torch.cuda.device(g2), torch.cuda.stream(side):
            with job.stage("critic/infer", stream=side) as units:
                torch.cuda._sleep(400_000_000)
                units[0].workspace(2).data.fill_(0x5a)
        held = job.devices()[2]["used"] > used0
        side.synchronize()
        time.sleep(0.05)
        out["stream_ordering"].update({"workspace_held_while_kernel_runs": held,
                                       "workspace_released_after": job.devices()[2]["used"] == used0})
        job.set_workspace("critic/infer", 0)
    rounds = []
    before = mismatches()
    for target in TARGETS:
        t0 = time.perf_counter()
        report = job.transition(target)
        rounds.append({"completed": report["completed"], "seconds": time.perf_counter() - t0,
                       "moved_bytes": report.get("moved_bytes"), "mismatches": mismatches(),
                       "plan_is_target": job.plan["actor/train"] == target["actor/train"]})
    out["round_trip"] = {"mismatches_before": before, "transitions": rounds}
    order = out["stream_ordering"]
    out["ok"] = (out["fill_verified"] and out["shards_placed"] and before == 0 and synced == 0 and
                 order.get("workspace_held_while_kernel_runs", True) and order.get("workspace_released_after", True) and
                 all(r["completed"] and r["mismatches"] == 0 and r["plan_is_target"] for r in rounds))
    return out


def member(memory, bindir):
    """nereus.Member as node 1 of a two-node job whose node 0 is a nereusd coordinator, both
    on `memory` devices (docs/cluster.md, "A framework as a node"): every shard of its steps
    is that memory (kDLCUDA on its device's GPU), torch computes on it in place, and the
    job, transitions included, ends verified."""
    import os
    import re
    import subprocess
    import tempfile
    import torch
    import nereus
    gpu = memory == "cuda"
    gpus = torch.cuda.device_count() if gpu else 1
    work = tempfile.mkdtemp(prefix="nereus-torch-member-")
    token = os.path.join(work, "token")
    with open(token, "w") as f:
        f.write(f"torch-member-{os.getpid()}-token")
    os.chmod(token, 0o600)
    log = open(os.path.join(work, "d0.log"), "w+")
    d0 = subprocess.Popen([os.path.join(bindir, "nereusd"), "--token-file", token, "--coordinator-mode", "--nodes", "2",
                           "--listen", "127.0.0.1:0", "--devices", f"{memory}:2:512MiB"], stdout=log, stderr=subprocess.STDOUT)
    out = {"memory": memory}
    try:
        addr = None
        for _ in range(200):
            log.seek(0)
            found = re.search(r"listening on (127\.0\.0\.1:\d+)", log.read())
            if found or d0.poll() is not None:
                addr = found and found.group(1)
                break
            time.sleep(0.05)
        if not addr:
            log.seek(0)
            return {"error": "the coordinator did not start: " + log.read()[-300:]}
        m = nereus.Member(coordinator=addr, rank=1, nodes=2, token_file=token, devices=2, capacity="512MiB", memory=memory)
        job = subprocess.Popen([os.path.join(bindir, "nereus"), "cluster", "job", "--coordinator", addr, "--token-file", token,
                                "--job", JOB, "--node-steps", "--steps", "2", "--response-len", "128", "--response-len-after",
                                "2048", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        steps, shards, placed, total = 0, 0, 0, 0
        for step in m.steps(timeout=120):
            steps += 1
            for u in step.units:
                for s in u.shards(slot=None):
                    t = s.data
                    where = (2, (s.device - 2) % gpus) if gpu else (1, 0)  # node 1's device i is on GPU i mod GPUs
                    shards += 1
                    placed += (s.__dlpack_device__() == where and t.is_cuda == gpu and t.data_ptr() == s.data_ptr
                               and (not gpu or t.device.index == where[1]))
                    total += int(t.reshape(-1).view(torch.uint8).sum())  # torch reads the unit in place, on its device
            m.report(stage_seconds={})
        stdout, stderr = job.communicate(timeout=120)
        try:
            rep = json.loads(stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            rep = {"error": (stdout + stderr)[-300:]}
        out.update(steps=steps, shards=shards, shards_placed=placed, byte_sum=total, verified=rep.get("verified"),
                   error=rep.get("error"))
        out["ok"] = steps == 2 and shards > 0 and placed == shards and total > 0 and rep.get("verified") is True
        return out
    finally:
        d0.kill()
        d0.wait()


if __name__ == "__main__":
    # --host: the same checks on host memory, so that this script is tested where no GPU is.
    # --bin DIR: where nereus and nereusd are, for the Member's job (run.sh: the pack).
    memory = "host" if "--host" in sys.argv[1:] else "cuda"
    try:
        result = main(memory)
    except Exception as e:  # one JSON line whatever happens: run.sh embeds it
        result = {"error": f"{type(e).__name__}: {e}"}
    if "--bin" in sys.argv[1:] and "skipped" not in result:
        try:
            result["member"] = member(memory, sys.argv[sys.argv.index("--bin") + 1])
        except Exception as e:
            result["member"] = {"error": f"{type(e).__name__}: {e}"}
        result["ok"] = bool(result.get("ok") and result["member"].get("ok"))
    print(json.dumps(result))
    sys.exit(0 if result.get("ok") or "skipped" in result else 1)
