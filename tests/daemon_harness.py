"""What the daemon tests share: a token file, starting nereusd, stopping them all, an HTTP
GET (the metrics endpoints), and the job plans across three daemons of two devices each."""
import os
import signal
import socket
import subprocess

# A job's plans across three daemons (GPUs 0-1 on node 0, 2-3 on node 1, 4-5 on node 2).
JOB_FROM = {"actor/generate": "tp=1,pp=1,dp=4,devices=0-3", "actor/infer": "tp=1,pp=1,dp=1,devices=0",
            "actor/train": "tp=1,pp=1,dp=2,devices=0:1", "critic/infer": "tp=1,pp=1,dp=1,devices=1",
            "critic/train": "tp=1,pp=1,dp=2,devices=2:3", "reference/infer": "tp=1,pp=1,dp=1,devices=2",
            "reward/infer": "tp=1,pp=1,dp=1,devices=3"}
JOB_TO = {"actor/generate": "tp=2,pp=1,dp=2,devices=2-5", "actor/infer": "tp=1,pp=1,dp=2,devices=4:5",
          "actor/train": "tp=2,pp=1,dp=2,devices=2-5", "critic/infer": "tp=1,pp=1,dp=1,devices=3",
          "critic/train": "tp=1,pp=2,dp=2,devices=2-5", "reference/infer": "tp=2,pp=1,dp=1,devices=4:5",
          "reward/infer": "tp=1,pp=1,dp=1,devices=1"}

# Plans that keep every model-stage's replicas on two nodes or more, so the job survives
# losing node 1 or node 2 at any moment: from JOB_SPREAD, through the graph to
# JOB_SPREAD_TO, or after it.
JOB_SPREAD = {"actor/generate": "tp=2,pp=1,dp=2,devices=0-1:4-5", "actor/infer": "tp=1,pp=1,dp=2,devices=0:4",
              "actor/train": "tp=1,pp=1,dp=2,devices=1:5", "critic/infer": "tp=1,pp=1,dp=2,devices=2:4",
              "critic/train": "tp=1,pp=1,dp=2,devices=3:5", "reference/infer": "tp=1,pp=1,dp=2,devices=2:5",
              "reward/infer": "tp=1,pp=1,dp=2,devices=3:4"}
JOB_SPREAD_TO = {"actor/generate": "tp=2,pp=1,dp=2,devices=0-1:2-3", "actor/infer": "tp=1,pp=1,dp=2,devices=1:3",
                 "actor/train": "tp=1,pp=1,dp=2,devices=0:4", "critic/infer": "tp=1,pp=1,dp=2,devices=1:5",
                 "critic/train": "tp=1,pp=1,dp=2,devices=2:4", "reference/infer": "tp=1,pp=1,dp=2,devices=0:3",
                 "reward/infer": "tp=1,pp=1,dp=2,devices=1:2"}


def token_file(work, name, secret):
    """A secret in a mode-600 file under `work`."""
    path = os.path.join(work, name)
    with open(path, "w") as f:
        f.write(secret + "\n")
    os.chmod(path, 0o600)
    return path


def start(nereusd, token, work, name, *args, env=None, procs=None):
    """Starts a daemon with its stderr in WORK/NAME.log; returns the open log."""
    log = open(os.path.join(work, name + ".log"), "w+")
    p = subprocess.Popen([nereusd, "--token-file", token, *args], stdout=subprocess.DEVNULL, stderr=log,
                         env={**os.environ, **(env or {})})
    if procs is not None:
        procs.append(p)
    return log


def stop_all(procs):
    """SIGTERM, then SIGKILL what does not end within 10 s (a stopped one is continued first)."""
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            except ProcessLookupError:
                pass


def http_get(addr, path):
    """GET path from HOST:PORT over HTTP/1.0: the whole answer as text."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data.decode()
