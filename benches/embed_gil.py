#!/usr/bin/python3
"""Does a Python stage computing in the interpreter slow a transition down?

Times the same transition (actor/train tp=4 -> tp=2,dp=2 and back, the actor's params and
Adam state, on 8 host devices, begun after the step's actor/train ran) with the Python
threads idle and with one Python thread
busy in `with job.stage("critic/infer")` (pure-Python arithmetic that holds the GIL but
for the interpreter's switches), alternating, in one run. The runtime's copy threads never
take the GIL, so the ratio should stay near 1.

Usage: PYTHONPATH=BUILD/python benches/embed_gil.py [--rounds N] [--smoke] [--model M]
Prints one JSON line: median seconds idle and busy, and busy/idle.
"""
import argparse
import json
import statistics
import sys
import threading
import time

import nereus

BASE = {
    "actor/generate": "tp=2,pp=1,dp=2,devices=0-3",
    "actor/infer": "tp=2,pp=1,dp=1,devices=0-1",
    "critic/infer": "tp=2,pp=1,dp=1,devices=2-3",
    "reference/infer": "tp=2,pp=1,dp=1,devices=0-1",
    "reward/infer": "tp=2,pp=1,dp=1,devices=2-3",
    "actor/train": "tp=4,pp=1,dp=1,devices=4-7",
    "critic/train": "tp=4,pp=1,dp=1,devices=0-3",
}
SPLIT = dict(BASE, **{"actor/train": "tp=2,pp=1,dp=2,devices=4-7"})


def timed_transition(job, target, busy):
    stop, entered = threading.Event(), threading.Event()

    def spin():
        with job.stage("critic/infer"):
            entered.set()
            x = 0
            while not stop.is_set():
                x += sum(range(500))

    # actor/train has run this step, so the transition moves what it wrote (a build of a
    # trained model begun before its training stage ran would wait for it).
    with job.stage("actor/train"):
        pass
    worker = None
    if busy:
        worker = threading.Thread(target=spin)
        worker.start()
        entered.wait()
    t0 = time.perf_counter()
    # begin + wait: mid-step (a stage is held), so it takes effect at the next step.
    report = job.begin_transition(target).wait()
    seconds = time.perf_counter() - t0
    if worker:
        stop.set()
        worker.join()
    job.end_step()
    assert report["completed"], report
    return seconds, report["seconds"], report["moved_bytes"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="2 rounds of the tiny job (CI)")
    ap.add_argument("--job", default="ppo-tiny")
    ap.add_argument("--capacity", default="256MiB")
    a = ap.parse_args()
    rounds = 2 if a.smoke else a.rounds
    job = nereus.Job(a.job, BASE, devices=8, capacity=a.capacity, copy_threads=2)
    times = {False: [], True: []}
    inside = {False: [], True: []}
    moved = 0
    plans = [SPLIT, BASE]
    k = 0
    for _ in range(rounds):
        for busy in (False, True):
            s, runtime_s, moved = timed_transition(job, plans[k % 2], busy)
            times[busy].append(s)
            inside[busy].append(runtime_s)
            k += 1
    idle, busy = statistics.median(times[False]), statistics.median(times[True])
    r_idle, r_busy = statistics.median(inside[False]), statistics.median(inside[True])
    # wall: begin_transition() to wait() returning in Python (includes getting the GIL
    # back, up to one switch interval); runtime: the report's own begin-to-last-node time.
    print(json.dumps({"bench": "embed_gil", "job": a.job, "rounds": rounds, "moved_bytes": moved,
                      "wall_idle_s": idle, "wall_busy_s": busy, "wall_busy_over_idle": busy / idle,
                      "runtime_idle_s": r_idle, "runtime_busy_s": r_busy, "runtime_busy_over_idle": r_busy / r_idle,
                      "switch_interval_s": sys.getswitchinterval()}))


if __name__ == "__main__":
    main()
