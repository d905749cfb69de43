#!/usr/bin/env python3
"""benches/gpu/member_job.sh on host memory: the GPU pack's framework-node job (gpu_member,
a framework whose units are its own memory, carved out of one block per device's GPU),
which runs on a GPU only when one is lent, kept from rotting here. Both transports: the
default two-sided builds, and gets (whose remote keys for the framework's buffers are
their own regions, not the arenas').

  test_member_job.py BUILD_DIR SCRIPT"""
import json
import subprocess
import sys
import os

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import check, finish  # noqa: E402

build, script = sys.argv[1], sys.argv[2]
for transport in ("", "ucx"):
    r = subprocess.run(["bash", script, "host", build, "", transport], capture_output=True, text=True, timeout=240)
    name = transport or "default"
    try:
        out = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        check(False, f"{name}: one JSON line ({r.stdout[-300:]} {r.stderr[-300:]})")
        continue
    job, member = out["job"], out["member"]
    check(job.get("rc") == 0 and job.get("verified") is True and job.get("moved_bytes", 0) > 0,
          f"{name}: the job ends verified after moving the framework's units ({job})")
    n = member.get("adopted", 0)
    check(n > 0 and member.get("step1_views_adopted") == n, f"{name}: step 1 computes on every adopted buffer ({member})")
    check(member.get("steps") == 2 and member.get("views", 0) > n, f"{name}: two steps, the second on the moved units ({member})")
    check(member.get("views_on_their_gpu") == member.get("views") == member.get("views_holding_the_fill"),
          f"{name}: every view is of the node's memory kind and holds the fill ({member})")
finish("member-job")
