#!/usr/bin/env python3
"""A framework process as its node of a cluster, for test_member.py: joins through
nereus.Member, and at each step reads every unit it holds with torch (the stage's work),
checks the first elements of every shard against the fill recomputed independently
(shards.py), reports per-stage seconds, and writes what it saw as one JSON line a step.

  member_node.py NEREUS COORDINATOR RANK NODES TOKEN OUT [--die-at-step K] [--report-stage NAME]
      [--step-sleep S] [--adopt STAGE,... --adopt-plan PLAN_JSON] [--streams [--generation-sleep S]
      [--die-stream generation|training]]

--streams: an async job's framework, one thread per stream (generation, training), each
reporting its own steps (report(stream=...)) while the other computes.

--adopt: the framework's own tensors back these model-stages' units on this node in the
initial plan (nereus.Member(adopt=...)); it writes the fill into them itself, so the bytes
the job moves and checks are the framework's.
"""
import argparse
import ctypes
import json
import os
import queue
import re
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import http_get  # noqa: E402
from shards import expected_bytes, fill_box, model_shapes  # noqa: E402

import nereus  # noqa: E402
import torch  # noqa: E402

ap = argparse.ArgumentParser()
for a in ["nereus", "coordinator", "rank", "nodes", "token", "out"]:
    ap.add_argument(a)
ap.add_argument("--die-at-step", type=int, default=-1)
ap.add_argument("--report-stage", default="")  # a bad report: a time for this name
ap.add_argument("--step-sleep", type=float, default=0.0)  # each step takes at least this long
ap.add_argument("--streams", action="store_true")
ap.add_argument("--generation-sleep", type=float, default=0.0)  # with --streams: each generation step takes this long
ap.add_argument("--die-stream", default="")  # --die-at-step K dies in that stream's step K only
ap.add_argument("--adopt", default="")
ap.add_argument("--adopt-plan", default="")
ap.add_argument("--adopt-claims-cuda", action="store_true")  # the adopted tensors say they are GPU memory (an error)
args = ap.parse_args()

shapes = model_shapes(args.nereus, "tiny-llama")  # every role of ppo-tiny
PER = 2  # devices per node


def own_tensors(stages, plan):
    """The framework's tensors for this node's shards of `stages` in `plan`, holding the fill
    of sharding.md (computed here, independently), as adopt= entries."""
    probe = nereus.Job("ppo-tiny", json.loads(plan), devices=PER * int(args.nodes), capacity="64MiB")
    entries = []
    for stage in stages:
        for u in probe.units(stage):
            for s in u.shards(None):
                if s.device // PER != int(args.rank):
                    continue
                width = 4 if s.dtype == "f32" else 2
                shape = shapes[s.tensor]
                data = fill_box(s.tensor, s.slot, [list(r) for r in s.box], shape[1] if len(shape) > 1 else 1, width)
                t = torch.empty_like(s.data)
                t.view(-1).view(torch.uint8)[:] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
                entries.append({"stage": stage, "replica": u.replica, "device": s.device, "buffer": s.tensor, "slot": s.slot,
                                "tensor": t})
    return entries


adopt = own_tensors(args.adopt.split(","), args.adopt_plan) if args.adopt else []


class ClaimsCuda:
    """A host tensor that says it is on GPU 0 (what Member(adopt=) reads of a tensor)."""
    def __init__(self, t):
        self.t = t
        self.device = type("Device", (), {"type": "cuda", "index": 0})()

    def __getattr__(self, name):
        return getattr(self.t, name)


if args.adopt_claims_cuda:
    adopt = [dict(e, tensor=ClaimsCuda(e["tensor"])) for e in adopt]
owned = {e["tensor"].data_ptr() for e in adopt}
m = nereus.Member(coordinator=args.coordinator, rank=int(args.rank), nodes=int(args.nodes), token_file=args.token,
                  devices=PER, capacity="256MiB", metrics="127.0.0.1:0", adopt=adopt)
out = open(args.out, "w")
out.write(json.dumps({"listening": m.listening, "metrics": m.metrics_listening}) + "\n")
out.flush()


def first_elements_match(shard, k=8):
    """The first k elements of the shard's first row against the fill of sharding.md."""
    width = 4 if shard.dtype == "f32" else 2
    box = [list(r) for r in shard.box]
    shape = shapes[shard.tensor]
    cols = shape[1] if len(shape) > 1 else 1
    if len(box) > 1:
        sub = [[box[0][0], box[0][0] + 1], [box[1][0], min(box[1][1], box[1][0] + k)]]
    else:
        sub = [[box[0][0], min(box[0][1], box[0][0] + k)]]
    want = expected_bytes(shard.tensor, shard.slot, sub, cols, width)
    return ctypes.string_at(shard.data_ptr, len(want)) == want


written = threading.Lock()


def write(record):
    with written:
        out.write(json.dumps(record) + "\n")
        out.flush()


def run(step):
    """The stage's work on the step's units, then its report."""
    write({"began": step.step, "stream": step.stream})
    began = time.time()
    seen = {"step": step.step, "stream": step.stream, "weight_version": step.weight_version,
            "replicas": dict(step.replicas), "units": []}
    seconds = {}
    for u in step.units:
        t0 = time.perf_counter()
        ok, checked, total, framework = True, 0, 0.0, 0
        for shard in u.shards(None):
            total += float(shard.data.float().sum())  # the stage's work: torch reads the unit's memory in place
            ok = ok and first_elements_match(shard)
            checked += 1
            framework += shard.data_ptr in owned  # the framework's own tensor is the unit's memory
        seconds[u.model_stage] = max(seconds.get(u.model_stage, 0.0), time.perf_counter() - t0)
        seen["units"].append({"id": u.id, "model_stage": u.model_stage, "replica": u.replica, "devices": list(u.devices),
                              "layout": u.layout, "shards": checked, "fill_ok": ok, "adopted": framework})
    time.sleep(args.step_sleep + (args.generation_sleep if step.stream == "generation" else 0.0))
    if step.step == args.die_at_step and args.die_stream in ("", step.stream):
        os.kill(os.getpid(), signal.SIGKILL)  # at the step's end, before reporting
    seen["began_at"], seen["ended_at"] = began, time.time()
    if args.report_stage:
        seconds[args.report_stage] = 1.0
    seen["seconds"] = seconds
    write(seen)
    m.report(stage_seconds=seconds, response_len_mean=step.response_len, response_len_p95=1.5 * step.response_len,
             stream=step.stream if args.streams else None)


if args.streams:
    # One worker per stream; at most one step of each is in hand (the coordinator sends a
    # stream's next step after its report), so the main thread asks for the next step only
    # while a stream is free.
    free = threading.Semaphore(2)
    work = {"generation": queue.Queue(), "training": queue.Queue()}

    def worker(q):
        while (step := q.get()) is not None:
            run(step)
            free.release()

    threads = [threading.Thread(target=worker, args=(q,)) for q in work.values()]
    for t in threads:
        t.start()
    while True:
        free.acquire()
        step = m.next_step(timeout=120)
        if step is None:
            break
        work[step.stream].put(step)
    for q in work.values():
        q.put(None)
    for t in threads:
        t.join()
else:
    for step in m.steps(timeout=120):
        run(step)
# The node's metrics, read while it still is a node: builds it took part in count as runs.
text = http_get(m.metrics_listening, "/metrics")
runs = re.search(r'^nereus_transition_runs_total\{node="%s"\} (\d+)' % args.rank, text, re.M)
out.write(json.dumps({"ended": True, "runs": int(runs.group(1)) if runs else None}) + "\n")
out.close()
