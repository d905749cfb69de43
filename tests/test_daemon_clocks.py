#!/usr/bin/env python3
"""Timelines across daemons whose clocks disagree: two of three nereusd run with their
clocks shifted by +30 s and −12.5 s ($NEREUS_CLOCK_SKEW_SECONDS). The heartbeats measure
each offset; `bench transition --daemons --perfetto --plot` and `cluster job --perfetto`
put every node's transfers on the coordinator's clock, so they fall inside the run or the
transition that moved them, not 30 s away.

  test_daemon_clocks.py BUILD_DIR/src
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import JOB_FROM, JOB_TO, start, stop_all, token_file  # noqa: E402
from harness import check, check_perfetto, check_plot, finish  # noqa: E402

BIN = sys.argv[1]
NEREUSD = os.path.join(BIN, "nereusd")
NEREUS = os.path.join(BIN, "nereus")
work = tempfile.mkdtemp(prefix="nereus-clocks-")
TOKEN = token_file(work, "token", "a-token-for-the-clock-tests")
SKEW = {1: 30.0, 2: -12.5}
procs = []


def daemon(name, *args, skew=None):
    return start(NEREUSD, TOKEN, work, name, *args, env={"NEREUS_CLOCK_SKEW_SECONDS": str(skew)} if skew is not None else None,
                 procs=procs)


def nereus(*args, timeout=300):
    r = subprocess.run([NEREUS, *args, "--token-file", TOKEN], capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def status(addr):
    rc, out, _ = nereus("cluster", "status", "--coordinator", addr, "--json")
    return json.loads(out) if rc == 0 and out else {}


def us(seconds):
    return seconds * 1e6


try:
    log = daemon("coordinator", "--coordinator-mode", "--nodes", "3", "--listen", "127.0.0.1:0", "--devices", "host:2:64MiB")
    addr = None
    for _ in range(200):
        log.seek(0)
        m = re.search(r"listening on (127\.0\.0\.1:\d+)", log.read())
        if m:
            addr = m.group(1)
            break
        time.sleep(0.05)
    check(addr is not None, "the coordinator starts")
    if addr is None:
        raise SystemExit(finish("daemon-clocks"))
    for r, skew in SKEW.items():
        daemon(f"node{r}", "--coordinator", addr, "--node-rank", str(r), "--nodes", "3", "--devices", "host:2:64MiB", skew=skew)

    # The heartbeats measure each node's clock (the second beat follows the first at once).
    j = {}
    end = time.time() + 15
    while time.time() < end:
        j = status(addr)
        if j.get("alive") == 3 and all(m["clock_rtt_ms"] is not None for m in j["members"]):
            break
        time.sleep(0.05)
    members = {m["rank"]: m for m in j.get("members", [])}
    check(len(members) == 3, f"three daemons joined ({j})")
    if len(members) == 3:
        check(members[0]["clock_offset_ms"] == 0, "the coordinator's own offset is 0")
        for r, skew in SKEW.items():
            m = members[r]
            err = abs(m["clock_offset_ms"] + skew * 1e3)
            # The estimate is off by at most half its round trip (plus scheduling noise).
            check(err <= m["clock_rtt_ms"] / 2 + 5, f"node {r}: offset {m['clock_offset_ms']:.3f} ms for a clock "
                  f"{skew:+} s ahead (error {err:.3f} ms, rtt {m['clock_rtt_ms']:.3f} ms)")
    rc, out, err = nereus("cluster", "status", "--coordinator", addr)
    check(rc == 0 and "clock offset" in out and re.search(r"-(2999\d|3000\d)\.\d+ ms", out) is not None, f"cluster status shows the clock offsets ({out.strip()[-300:]})")

    # bench transition --daemons: every node's transfers within the last run's window.
    trace = os.path.join(work, "t.json")
    svg = os.path.join(work, "links.svg")
    rc, out, err = nereus("bench", "transition", "--daemons", addr, "--model", "tiny-llama", "--from", "tp=2,pp=1,dp=1",
                          "--to", "tp=2,pp=1,dp=3", "--train", "--repeat", "2", "--perfetto", trace, "--plot", svg, "--json")
    rep = json.loads(out.strip().splitlines()[-1]) if rc == 0 and out.strip() else {}
    check(rc == 0 and os.path.exists(trace), f"bench transition --daemons --perfetto --plot ({err.strip()[-300:]})")
    check("timings" not in rep and len(rep.get("clocks", [])) == 3, "the report gives each node's clock, not the raw timings")
    if rc == 0:
        xs = check_perfetto(trace, 4)  # a device group per node, and the links
        devices = [e for e in xs if e["pid"] != 2]
        check(sum(e["args"]["bytes"] for e in devices) == rep.get("copied_bytes"), "every copied byte in one transfer event")
        # The run took at most the slowest repeat; the offsets are good to a few ms here.
        slowest = us(max(rep.get("seconds_median", 0), rep.get("seconds_min", 0)) * 2 + 0.005)
        late = [e for e in devices if e["ts"] + e["dur"] > slowest]
        # (node 0 keeps its replica: the new ones are built on nodes 1 and 2)
        check({e["args"]["process"] for e in devices} == {1, 2} and not late,
              f"both skewed nodes' transfers fall inside the run ({len(late)} of {len(devices)} after {slowest:.0f} us)")
        check_plot(svg, [" → "])

    # cluster job --perfetto: every node's transfers inside the coordinator's transition phase.
    jt = os.path.join(work, "job.json")
    rc, out, err = nereus("cluster", "job", "--coordinator", addr, "--job", "ppo-tiny", "--plan", json.dumps(JOB_FROM),
                          "--to", json.dumps(JOB_TO), "--perfetto", jt, "--json")
    rep = json.loads(out.strip().splitlines()[-1]) if rc == 0 and out.strip() else {}
    check(rc == 0 and rep.get("verified") is True and "perfetto" not in rep, f"cluster job --perfetto ({err.strip()[-300:]})")
    if rc == 0:
        xs = check_perfetto(jt, 4)  # the coordinator and three nodes
        phases = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in xs if e["pid"] == 1 and e["tid"] == 1}
        check(set(phases) >= {"connect", "load", "transition", "verify"}, f"the coordinator's phases ({sorted(phases)})")
        graph = [e for e in xs if e["pid"] == 1 and "graph_node" in e.get("args", {})]
        transition = rep["steps"][0]["transition"]
        check(len(graph) == transition["builds"] + transition["destroys"],
              f"one event per graph node ({len(graph)})")
        moved = [e for e in xs if e["pid"] >= 10]
        check(sum(e["args"]["bytes"] for e in moved) == transition["copied_bytes"],
              "every byte the transition copied in one node's transfer event")
        lo, hi = phases.get("transition", (0, 0))
        outside = [e for e in moved if e["ts"] < lo - 5000 or e["ts"] + e["dur"] > hi + 5000]
        check({e["pid"] for e in moved} == {10, 11, 12} and not outside,
              f"all three nodes' transfers inside the transition phase ({len(outside)} of {len(moved)} outside)")
finally:
    stop_all(procs)
    shutil.rmtree(work, ignore_errors=True)

finish("daemon-clocks")
