#!/usr/bin/env python3
"""No crash on peer death, under load (benches/soak.sh wraps this; not in CI).

Each cycle starts three daemons (the coordinator is node 0), runs a job of three steps
across them (`nereus cluster job`: load, a plan change through the global transition
graph, two more steps, the check of every unit), and at a random moment of the job (from
the coordinator taking it, over the undisturbed job's length) SIGKILLs or SIGSTOPs node 1
or node 2. The job's plans keep every model-stage on two nodes
or more (tests/daemon_harness.py), so whatever the moment, nothing the survivors hold may
be lost: the job must recover and verify every unit. A cycle counts as

- a crash when a daemon other than the victim, or the client, dies (or a sanitizer
  reports);
- a hang when the job does not answer within its limit;
- verified when the job ends on a collection whose every unit checks against the fill.

stuck_survivors counts surviving daemons that held a job part left behind when they were
stopped (a build that would not stop keeps its units' memory until the daemon restarts;
the daemon says so as it stops).

lost_bytes adds, for every cycle that did not verify, the bytes the undisturbed job
verifies. Detection is from the signal to the coordinator noticing the loss (the job's
`noticed_at`), recovery from noticing to the end of the recovery's transition; both only
for cycles whose job noticed the loss (a signal after the job's end is a miss).

Usage: soak.py BUILD_DIR [CYCLES] [--seed N] [--keep-logs DIR]; one JSON line at the end.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from daemon_harness import JOB_SPREAD, JOB_SPREAD_TO, start, stop_all, token_file  # noqa: E402

SANITIZER = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:")
STUCK = re.compile(r"leaving a transfer that would not stop behind")


def status(nereus, coord, token):
    r = subprocess.run([nereus, "cluster", "status", "--coordinator", coord, "--token-file", token, "--json",
                        "--timeout-ms", "3000"], capture_output=True, text=True, timeout=30)
    return json.loads(r.stdout) if r.returncode == 0 and r.stdout else {}


def start_cluster(nereusd, nereus, token, work, cycle, procs):
    """The coordinator (node 0) and nodes 1, 2, two devices each; their processes and logs."""
    logs = {}
    logs[0] = start(nereusd, token, work, f"c{cycle}-node0", "--coordinator-mode", "--nodes", "3", "--listen", "127.0.0.1:0",
                    "--devices", "host:2:256MiB", procs=procs)
    addr = None
    end = time.time() + 60
    while time.time() < end and addr is None:
        logs[0].seek(0)
        m = re.search(r"listening on (127\.0\.0\.1:\d+)", logs[0].read())
        addr = m.group(1) if m else None
        time.sleep(0.05)
    if addr is None:
        raise RuntimeError("the coordinator did not start")
    for r in (1, 2):
        logs[r] = start(nereusd, token, work, f"c{cycle}-node{r}", "--coordinator", addr, "--node-rank", str(r), "--nodes", "3",
                        "--devices", "host:2:256MiB", procs=procs)
    while time.time() < end:
        if status(nereus, addr, token).get("alive") == 3:
            return addr, dict(zip((0, 1, 2), procs[-3:])), logs
        time.sleep(0.05)
    raise RuntimeError("three daemons did not join within 60 s")


def begun(coordinator_log, timeout=60):
    """Waits for the coordinator to log that it took a job; returns the time it saw it."""
    end = time.time() + timeout
    while time.time() < end:
        coordinator_log.seek(0)
        if re.search(r"request \d+: job begins", coordinator_log.read()):
            return time.time()
        time.sleep(0.01)
    raise RuntimeError("the coordinator did not take the job within 60 s")


def job_command(nereus, addr, token, transport):
    return [nereus, "cluster", "job", "--coordinator", addr, "--token-file", token, "--job", "ppo-tiny", "--json",
            "--plan", json.dumps(JOB_SPREAD), "--to", json.dumps(JOB_SPREAD_TO), "--steps", "3", "--step-seconds", "0.3",
            "--response-len", "128", "--timeout", "30", "--transport", transport]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("cycles", nargs="?", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep-logs", default="")
    ap.add_argument("--transport", default="ucx-tag", choices=["ucx", "ucx-tag"], help="how the job's builds move bytes (cluster job --transport)")
    a = ap.parse_args()
    nereus, nereusd = os.path.join(a.build, "src", "nereus"), os.path.join(a.build, "src", "nereusd")
    rng = random.Random(a.seed)
    work = tempfile.mkdtemp(prefix="nereus-soak-")
    token = token_file(work, "token", "soak-" + os.urandom(8).hex())
    out = {"transport": a.transport, "cycles": 0, "crashes": 0, "hangs": 0, "verified": 0, "lost_bytes": 0, "misses": 0, "stuck_survivors": 0}
    detect, recover, notes = [], [], []
    detect_by = {"SIGKILL": [], "SIGSTOP": []}
    phases = {}  # where the job noticed each loss
    limit = 180
    try:
        # One undisturbed cycle: the job's length (kills land inside it) and its bytes.
        procs = []
        addr, daemons, logs = start_cluster(nereusd, nereus, token, work, 0, procs)
        job = subprocess.Popen(job_command(nereus, addr, token, a.transport), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t0 = begun(logs[0])
        stdout, stderr = job.communicate(timeout=limit)
        length = time.time() - t0
        r = subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr)
        stop_all(procs)
        clean = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
        if r.returncode != 0 or clean.get("verified") is not True:
            raise RuntimeError(f"the undisturbed job failed: {r.stderr.strip()[-400:]}")
        state_bytes = clean.get("verified_bytes", 0)
        print(f"soak: undisturbed job {length:.2f} s, {state_bytes} bytes verified", file=sys.stderr)

        for cycle in range(1, a.cycles + 1):
            procs = []
            addr, daemons, logs = start_cluster(nereusd, nereus, token, work, cycle, procs)
            victim = rng.choice((1, 2))
            sig = rng.choice((signal.SIGKILL, signal.SIGSTOP))
            delay = rng.uniform(0, length)
            job = subprocess.Popen(job_command(nereus, addr, token, a.transport), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            begun(logs[0])  # the moment counts from the coordinator taking the job
            time.sleep(delay)
            struck = time.time()
            daemons[victim].send_signal(sig)
            what = f"cycle {cycle}: {signal.Signals(sig).name} node {victim} at {delay:.2f} s"
            try:
                stdout, stderr = job.communicate(timeout=limit)
            except subprocess.TimeoutExpired:
                job.kill()
                stdout, stderr = job.communicate()
                out["hangs"] += 1
                notes.append(what + ": the job hung")
                stdout = ""
            rep = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
            crashed = job.returncode is not None and job.returncode < 0
            for rank, p in daemons.items():
                if rank != victim and p.poll() is not None:
                    crashed = True
                    notes.append(f"{what}: node {rank} exited with {p.returncode}")
            stop_all(procs)
            for rank, p in daemons.items():
                if rank != victim and p.returncode not in (0, None):
                    crashed = True
                    notes.append(f"{what}: node {rank} stopped with {p.returncode}")
            for rank, log in logs.items():
                log.seek(0)
                text = log.read()
                if rank != victim:
                    out["stuck_survivors"] += bool(STUCK.search(text))
                if SANITIZER.search(text):
                    crashed = True
                    notes.append(f"{what}: a sanitizer report in node {rank}'s log")
            out["crashes"] += crashed
            out["cycles"] += 1
            if rep.get("verified") is True and job.returncode == 0:
                out["verified"] += 1
            else:
                out["lost_bytes"] += state_bytes
                notes.append(f"{what}: not verified ({rep.get('error', stderr.strip()[-300:])})")
            failures = rep.get("failures", [])
            if failures:
                f = failures[0]
                detect.append(f["noticed_at"] - struck)
                detect_by[signal.Signals(sig).name].append(detect[-1])
                if "recovery_seconds" in f:
                    recover.append(f["recovery_seconds"])
                phase = f.get("phase")
            else:
                out["misses"] += 1
                phase = "after the job"
            phases[phase] = phases.get(phase, 0) + 1
            print(f"soak: {what}: {phase}, {'verified' if rep.get('verified') else 'NOT verified'}", file=sys.stderr)
            if a.keep_logs and (crashed or rep.get("verified") is not True):
                os.makedirs(a.keep_logs, exist_ok=True)
                for rank in logs:
                    shutil.copy(os.path.join(work, f"c{cycle}-node{rank}.log"), a.keep_logs)
                with open(os.path.join(a.keep_logs, f"c{cycle}-job.json"), "w") as fh:
                    fh.write(stdout)
    finally:
        stop_all([p for p in locals().get("procs", [])])
        shutil.rmtree(work, ignore_errors=True)

    for n in notes:
        print("soak:", n, file=sys.stderr)
    out["detect_seconds_median"] = round(statistics.median(detect), 4) if detect else None
    out["detect_seconds_max"] = round(max(detect), 4) if detect else None
    for name, xs in detect_by.items():  # end of stream vs the heartbeats' silence (--dead-after-ms 1500)
        out[f"detect_seconds_median_{name.lower()}"] = round(statistics.median(xs), 4) if xs else None
    out["phases"] = phases
    out["recover_seconds_median"] = round(statistics.median(recover), 4) if recover else None
    print(json.dumps(out))
    return 0 if out["crashes"] == 0 and out["hangs"] == 0 and out["verified"] == out["cycles"] else 1


if __name__ == "__main__":
    sys.exit(main())
