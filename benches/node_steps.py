#!/usr/bin/env python3
"""What a node step costs the control plane (`nereus cluster job --node-steps`,
docs/cluster.md "A framework as a node"): a coordinator and two nodes on loopback run the
same job of N steps, alternately (a) without node steps, (b) with node steps answered by
`nereusd`s (no framework: the stepRun/stepDone round trip alone), and (c) with two Python
framework processes (nereus.Member) that report at once (the hand-off to the framework's
thread and back, the GIL included). The per-step difference to (a), median of --repeat
runs each, measured in one run, is printed as one JSON line.

  node_steps.py BUILD_DIR/src [--steps 50] [--repeat 5] [--smoke]
"""
import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

MEMBER = """
import sys, nereus
m = nereus.Member(coordinator=sys.argv[1], rank=int(sys.argv[2]), nodes=3, token_file=sys.argv[3], devices=2,
                  capacity="256MiB")
print("joined", flush=True)
while True:
    for step in m.steps():
        m.report()  # nothing measured: no calibration, no weight sync
"""


# A fixed plan over the three nodes' six devices (--plan and --to: no transition runs).
PLAN = json.dumps({"actor/generate": "tp=1,pp=1,dp=4,devices=0-3", "actor/infer": "tp=1,pp=1,dp=1,devices=0",
                   "actor/train": "tp=1,pp=1,dp=2,devices=0:1", "critic/infer": "tp=1,pp=1,dp=1,devices=1",
                   "critic/train": "tp=1,pp=1,dp=2,devices=2:3", "reference/infer": "tp=1,pp=1,dp=1,devices=2",
                   "reward/infer": "tp=1,pp=1,dp=1,devices=3"})


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="3 steps, once: that it runs")
    a = ap.parse_args()
    if a.smoke:
        a.steps, a.repeat = 3, 1
    nereusd, nereus = os.path.join(a.bin, "nereusd"), os.path.join(a.bin, "nereus")
    work = tempfile.mkdtemp(prefix="nereus-node-steps-")
    token = os.path.join(work, "token")
    with open(token, "w") as f:
        f.write("a-token-for-the-node-steps-bench\n")
    os.chmod(token, 0o600)
    procs = []

    def start(*cmd):
        p = subprocess.Popen(list(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(p)
        return p

    def alive(addr, n):
        for _ in range(300):
            r = subprocess.run([nereus, "cluster", "status", "--coordinator", addr, "--token-file", token, "--json"],
                               capture_output=True, text=True)
            if r.returncode == 0 and json.loads(r.stdout).get("alive") == n:
                return
            time.sleep(0.1)
        raise SystemExit("node_steps.py: the nodes did not join")

    def job(addr, *extra):
        t0 = time.perf_counter()
        r = subprocess.run([nereus, "cluster", "job", "--coordinator", addr, "--token-file", token, "--job", "ppo-tiny", "--json",
                            "--steps", str(a.steps), "--plan", PLAN, "--to", PLAN, "--no-verify", *extra], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("node_steps.py: the job failed: " + r.stderr.strip()[-400:])
        return time.perf_counter() - t0

    try:
        clusters = {}
        for kind in ("daemons", "frameworks"):
            addr = f"127.0.0.1:{free_port()}"
            start(nereusd, "--coordinator-mode", "--nodes", "3", "--listen", addr, "--token-file", token, "--devices", "host:2:256MiB")
            for r in (1, 2):
                if kind == "daemons":
                    start(nereusd, "--coordinator", addr, "--node-rank", str(r), "--nodes", "3", "--token-file", token,
                          "--devices", "host:2:256MiB")
                else:
                    start(sys.executable, "-c", MEMBER, addr, str(r), token)
            alive(addr, 3)
            clusters[kind] = addr
        runs = {"none": [], "daemons": [], "frameworks": []}
        for _ in range(a.repeat):
            runs["none"].append(job(clusters["daemons"]))
            runs["daemons"].append(job(clusters["daemons"], "--node-steps"))
            runs["frameworks"].append(job(clusters["frameworks"], "--node-steps"))
        med = {k: statistics.median(v) for k, v in runs.items()}
        out = {"steps": a.steps, "repeat": a.repeat, "job_seconds_median": med,
               "node_step_ms_daemons": 1e3 * (med["daemons"] - med["none"]) / a.steps,
               "node_step_ms_frameworks": 1e3 * (med["frameworks"] - med["none"]) / a.steps}
        print(json.dumps(out))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
