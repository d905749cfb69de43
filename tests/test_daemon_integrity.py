#!/usr/bin/env python3
"""Nobody in the middle: a tampering proxy between daemons. After the handshake every
frame carries an HMAC tag over its sequence number (docs/cluster.md, "Security"); this
flips a byte, replays a frame, and cuts a connection halfway, on the heartbeat link (node
1 -> coordinator, both directions) and on a job's link (coordinator -> node 2, through
node 2's --advertise address). Each time the receiver drops the connection and names why,
the node rejoins, and the job recovers as from a lost node.

  test_daemon_integrity.py BUILD_DIR/src
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import JOB_FROM, JOB_TO, start, stop_all, token_file  # noqa: E402
from harness import check, finish  # noqa: E402

BIN = sys.argv[1]
NEREUSD = os.path.join(BIN, "nereusd")
NEREUS = os.path.join(BIN, "nereus")
work = tempfile.mkdtemp(prefix="nereus-integrity-")
TOKEN = token_file(work, "token", "a-token-for-the-integrity-tests")
procs = []


class Proxy:
    """A frame-aware TCP proxy (4-byte little-endian length, then the body). Connection i
    gets plans[i] (or none): (direction, frame index from the connection's start, action),
    direction "up" (from the connecting side) or "down", action "flip" (one byte of the
    body), "replay" (the previous frame again, instead of this one) or "cut" (half of this
    frame, then both sockets closed)."""

    def __init__(self, target, plans):
        self.target, self.plans = target, list(plans)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.addr = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.connections = 0
        self.applied = []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                a, _ = self.sock.accept()
            except OSError:
                return
            host, port = self.target.rsplit(":", 1)
            b = socket.create_connection((host, int(port)))
            plan = self.plans[self.connections] if self.connections < len(self.plans) else None
            self.connections += 1
            state = {"closed": False}
            for src, dst, way in ((a, b, "up"), (b, a, "down")):
                threading.Thread(target=self.pump, args=(src, dst, way, plan, a, b, state), daemon=True).start()

    @staticmethod
    def read(s, n):
        out = b""
        while len(out) < n:
            chunk = s.recv(n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return out

    def pump(self, src, dst, way, plan, a, b, state):
        index, previous = 0, None
        try:
            while True:
                head = self.read(src, 4)
                body = self.read(src, int.from_bytes(head, "little"))
                frame = head + body
                if plan and plan[0] == way and plan[1] == index:
                    self.applied.append((way, index, plan[2]))
                    if plan[2] == "flip":
                        mid = 4 + len(body) // 3
                        frame = frame[:mid] + bytes([frame[mid] ^ 0x20]) + frame[mid + 1:]
                    elif plan[2] == "replay" and previous is not None:
                        frame = previous
                    elif plan[2] == "cut":
                        dst.sendall(frame[:len(frame) // 2])
                        raise EOFError
                dst.sendall(frame)
                previous, index = head + body, index + 1
        except (EOFError, OSError):
            pass
        if not state["closed"]:
            state["closed"] = True
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


def daemon(name, *args):
    return start(NEREUSD, TOKEN, work, name, "--metrics", "127.0.0.1:0", *args, procs=procs)


def text(log):
    log.seek(0)
    return log.read()


def wait_for(log, pattern, timeout=15, count=1):
    end = time.time() + timeout
    while time.time() < end:
        found = re.findall(pattern, text(log))
        if len(found) >= count:
            return found
        time.sleep(0.05)
    return None


def status(addr):
    r = subprocess.run([NEREUS, "cluster", "status", "--coordinator", addr, "--token-file", TOKEN, "--json"],
                       capture_output=True, text=True, timeout=30)
    return json.loads(r.stdout) if r.returncode == 0 and r.stdout else {}


def member(j, rank):
    return next((m for m in j.get("members", []) if m["rank"] == rank), {})


def metric(addr, pattern):
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    m = re.search(pattern, data.decode())
    return int(m.group(1)) if m else 0


try:
    coord = daemon("coordinator", "--coordinator-mode", "--nodes", "3", "--listen", "127.0.0.1:0", "--devices", "host:2:256MiB")
    m = wait_for(coord, r"listening on (127\.0\.0\.1:\d+), metrics on (127\.0\.0\.1:\d+)")
    check(m is not None, "the coordinator starts")
    if m is None:
        raise SystemExit(finish("daemon-integrity"))
    addr, coord_metrics = m[0]

    # Node 1 reaches the coordinator through the proxy. Its frames up: hello 0,
    # authenticate 1, then (tagged) join 2, heartbeats 3, 4, ...; down: challenge 0, welcome
    # 1, then (tagged) the join's answer 2, heartbeat answers 3, ...
    plans = [("up", 5, "flip"), ("up", 6, "replay"), ("down", 4, "flip"), ("up", 5, "cut")]
    heartbeat_proxy = Proxy(addr, plans)
    node1 = daemon("node1", "--coordinator", heartbeat_proxy.addr, "--node-rank", "1", "--nodes", "3", "--devices", "host:2:256MiB")
    # Node 2 is reached (for jobs and transitions) through a proxy it advertises.
    port2 = socket.socket()
    port2.bind(("127.0.0.1", 0))
    listen2 = "127.0.0.1:%d" % port2.getsockname()[1]
    port2.close()
    # The coordinator opens the job: up hello 0, authenticate 1, job-open 2, peers 3, ...;
    # node 2 answers down challenge 0, welcome 1, ready 2, connected 3, and its first answer
    # inside the graph is frame 4 (the first plan puts nothing on node 2's devices).
    job_proxy = Proxy(listen2, [("down", 4, "flip")])
    node2 = daemon("node2", "--coordinator", addr, "--node-rank", "2", "--nodes", "3", "--devices", "host:2:256MiB",
                   "--listen", listen2, "--advertise", job_proxy.addr)

    # Four tampered connections in a row, each dropped and named; node 1 rejoins each time.
    lines = wait_for(coord, r"node 1 lost: [^\n]*", count=4, timeout=30) or []
    integrity = [l for l in lines if "failed its integrity check" in l]
    check(len(integrity) >= 2, f"the coordinator names the altered and the replayed heartbeat ({lines[:2]})")
    node_side = wait_for(node1, r"lost the coordinator: [^\n]*integrity check[^\n]*")
    check(node_side is not None, "node 1 names an altered answer from the coordinator and rejoins")
    j = {}
    end = time.time() + 20
    while time.time() < end:
        j = status(addr)
        if member(j, 1).get("alive") and member(j, 1).get("joins", 0) >= 5 and member(j, 2).get("alive"):
            break
        time.sleep(0.1)
    check(member(j, 1).get("joins", 0) >= 5 and member(j, 1).get("alive"),
          f"after four tampered connections node 1 is back (joins {member(j, 1).get('joins')})")
    check(len(heartbeat_proxy.applied) == 4, f"the proxy tampered four times ({heartbeat_proxy.applied})")
    drops = metric(coord_metrics, r'nereus_connections_dropped_total\{node="0",reason="integrity"\} (\d+)')
    check(drops >= 2, f"metrics: connections dropped for integrity ({drops})")

    # A job whose graph loses node 2's link to an altered frame: recovered as a lost node.
    r = subprocess.run([NEREUS, "cluster", "job", "--coordinator", addr, "--token-file", TOKEN, "--job", "ppo-tiny",
                        "--plan", json.dumps(JOB_FROM), "--to", json.dumps(JOB_TO), "--json"],
                       capture_output=True, text=True, timeout=300)
    rep = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
    check(job_proxy.applied == [("down", 4, "flip")], f"the proxy altered node 2's first answer in the graph ({job_proxy.applied})")
    failure = (rep.get("failures") or [{}])[0]
    why = failure.get("why", {}).get("2", "")
    check(failure.get("lost_nodes") == [2] and "integrity check" in why,
          f"the job loses node 2 and says why ({failure}, {why[:300]})")
    check(r.returncode == 0 and rep.get("verified") is True and "decision" in failure,
          f"the job recovers from the intact units and every unit verifies ({r.stderr.strip()[-300:]})")
    check(all(p.poll() is None for p in procs), "every daemon still runs")
finally:
    stop_all(procs)
    if os.environ.get("NEREUS_KEEP_LOGS"):
        print("logs kept in", work)
    else:
        shutil.rmtree(work, ignore_errors=True)

finish("daemon-integrity")
