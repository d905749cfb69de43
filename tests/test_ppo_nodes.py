#!/usr/bin/env python3
"""examples/rlhf/ppo_nodes.py across two real processes (two nodes of 4 host devices on
loopback; rank 0 is the coordinator), driven by `nereus cluster job --node-steps`: three
PPO steps on the units of each node, gloo for the gradients across nodes, weight sync by
the coordinator after each step. Run twice: once staying on the first plan, once moving
to examples/rlhf/ppo-nodes-moved.json after step 1 (the same layouts elsewhere; the
critic's training state, held only on node 0, crosses to node 1 over UCX). The two must
compute the same thing bit for bit, and --check-state must find the training and
reference state intact across the move.

  test_ppo_nodes.py BUILD_DIR/src EXAMPLES_DIR
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import check, finish  # noqa: E402
from daemon_harness import stop_all, token_file  # noqa: E402

BIN, EXAMPLES = sys.argv[1], sys.argv[2]
NEREUS = os.path.join(BIN, "nereus")
work = tempfile.mkdtemp(prefix="nereus-ppo-nodes-")
TOKEN = token_file(work, "token", "s3cret-token-for-the-ppo-nodes-test")
PLAN = os.path.join(EXAMPLES, "ppo-nodes-plan.json")
MOVED = os.path.join(EXAMPLES, "ppo-nodes-moved.json")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(tag, *job_args):
    coord, gloo = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    procs = []
    for r in (0, 1):
        log = open(os.path.join(work, f"{tag}-{r}.log"), "w")
        procs.append(subprocess.Popen([sys.executable, os.path.join(EXAMPLES, "ppo_nodes.py"), "--coordinator", coord, "--rank", str(r),
                                       "--nodes", "2", "--token-file", TOKEN, "--gloo", gloo, "--check-state", "--plan", PLAN,
                                       "--out", os.path.join(work, f"{tag}-{r}.jsonl")], stdout=log, stderr=subprocess.STDOUT))
    try:
        end = time.time() + 60
        while time.time() < end:  # both nodes joined
            r = subprocess.run([NEREUS, "cluster", "status", "--coordinator", coord, "--token-file", TOKEN, "--json"],
                               capture_output=True, text=True)
            if r.returncode == 0 and json.loads(r.stdout).get("alive") == 2:
                break
            time.sleep(0.2)
        r = subprocess.run([NEREUS, "cluster", "job", "--coordinator", coord, "--token-file", TOKEN, "--job",
                            os.path.join(EXAMPLES, "ppo-tiny-rule.json"), "--plan", PLAN, "--node-steps", "--steps", "3",
                            "--no-verify", "--timeout", "120", "--json", *job_args], capture_output=True, text=True, timeout=600)
        report = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
        codes = [p.wait(60) for p in procs]
    finally:
        stop_all(procs)
    rows = {rank: [json.loads(x) for x in open(os.path.join(work, f"{tag}-{rank}.jsonl"))] for rank in (0, 1)}
    return r.returncode, report, codes, rows, r.stderr


rc, stay, codes, rows, err = run("stay", "--to", PLAN)  # the controller is not asked: the plan stays
check(rc == 0 and "error" not in stay, f"the job on the first plan runs 3 node steps ({stay.get('error')} {err.strip()[-300:]})")
check(codes == [0, 0], f"both framework processes end cleanly ({codes})")
check([x["step"] for x in rows[0]] == [1, 2, 3] and [x["step"] for x in rows[1]] == [1, 2, 3], "each process ran steps 1-3")
check(all(rows[r][0]["adopted_shards"] == rows[r][0]["shards"] > 0 for r in (0, 1)),
      f"step 1 computes on each process's own model tensors: every shard of its units is one "
      f"({[(rows[r][0]['adopted_shards'], rows[r][0]['shards']) for r in (0, 1)]})")
keys = ("reward_mean", "policy_loss", "value_loss", "kl")
check(all(a[k] == b[k] for a, b in zip(rows[0], rows[1]) for k in keys), "both processes computed the same batch and losses")
check(all(all(x[k] == x[k] for k in keys) for x in rows[0]), "the losses are numbers")
sync = [s.get("weight_sync", {}) for s in stay.get("steps", [])]
check(len(sync) == 3 and all(w.get("builds") == 4 and w.get("link_bytes", 0) > 0 for w in sync),
      f"after each step the coordinator synced the actor's and critic's 4 inference/generation units ({sync})")
measured = [s.get("measured", {}) for s in stay.get("steps", [])]
check(all(set(m.get("stage_seconds", {})) == {"actor/generate", "actor/infer", "actor/train", "critic/infer", "critic/train",
                                                "reference/infer"} for m in measured),
      "every model-stage's time reached the coordinator")

rc, moved, codes, moved_rows, err = run("move", "--to", MOVED)
t = (moved.get("steps") or [{}])[0].get("transition", {})
check(rc == 0 and t.get("completed") is True, f"the job moves to the other plan after step 1 ({t.get('error')} {err.strip()[-300:]})")
across = sum(link["bytes"] for link in t.get("links", []) if link["src_node"] != link["dst_node"])
check(across > 0, f"the transition's bytes crossed processes ({across} bytes between nodes; {t.get('links')})")
check(codes == [0, 0], f"both framework processes end cleanly after the move ({codes})")
units = [x["units"] for x in moved_rows[0]]
check(len(units) == 3 and units[0] != units[1] and units[1] == units[2], "node 0 held other units after the transition")
check(moved_rows[0][1]["adopted_shards"] < moved_rows[0][1]["shards"], "the units the transition built live in the arenas")
check(moved_rows[0][-1]["state_checks"] == {"passed": 1, "failed": 0},
      f"--check-state: training and reference state intact across nodes after the move ({moved_rows[0][-1]['state_checks']})")
check([{k: x[k] for k in keys} for x in moved_rows[0]] == [{k: x[k] for k in keys} for x in rows[0]],
      "moving units between nodes changes nothing computed, bit for bit")

# The same move beside step 2 (--overlap): step 2 still computes on the first plan's units,
# step 3 on the moved ones, and nothing computed changes.
rc, over, codes, over_rows, err = run("overlap", "--to", MOVED, "--overlap")
t = (over.get("steps") or [{}])[0].get("transition", {})
check(rc == 0 and t.get("completed") is True and t.get("overlapped") is True and t.get("beside_step") == 2,
      f"the move admitted after step 1 ran beside step 2 ({ {k: t.get(k) for k in ('completed', 'overlapped', 'error')} } "
      f"{err.strip()[-300:]})")
units = [x["units"] for x in over_rows[0]]
check(codes == [0, 0] and len(units) == 3 and units[0] == units[1] != units[2],
      "node 0 computed step 2 on the first plan's units and step 3 on the moved ones")
check(over_rows[0][-1]["state_checks"] == {"passed": 1, "failed": 0},
      f"--check-state: state intact after the overlapped move ({over_rows[0][-1]['state_checks']})")
check([{k: x[k] for k in keys} for x in over_rows[0]] == [{k: x[k] for k in keys} for x in rows[0]],
      "moving units beside a step changes nothing computed, bit for bit")
moved_t = (moved.get("steps") or [{}])[0].get("transition", {})
print(f"move between steps: {moved_t.get('seconds')} s; beside step 2: {t.get('seconds')} s, {t.get('exposed_seconds')} s "
      f"past the step ({t.get('step_end')} s into it)", file=sys.stderr)

finish("ppo-nodes")
