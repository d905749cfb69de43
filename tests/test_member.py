#!/usr/bin/env python3
"""Framework processes as nodes (nereus.Member, `cluster job --node-steps`), across real
processes on loopback: a coordinator nereusd and two Python framework processes, each its
node with the units on its devices. Each step the frameworks read their units in place
(torch through DLPack), check them against the fill recomputed independently, and report
stage times, which reach the controller; a transition between steps hands them other
units; a framework killed mid-step is recovered from; a report naming no model-stage is
one clear error.

  test_member.py BUILD_DIR/src
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import check, finish  # noqa: E402
from daemon_harness import JOB_FROM, JOB_SPREAD, JOB_SPREAD_TO, JOB_TO, start, stop_all, token_file  # noqa: E402

# An async job's plans: generation (devices 3 and 5, one on each framework's node) apart
# from training; every model-stage but generation keeps a unit off node 2. ASYNC_TO moves
# generation onto devices 4-5 (tp=2).
ASYNC_PLAN = {"actor/generate": "tp=1,pp=1,dp=2,devices=3:5", "actor/infer": "tp=1,pp=1,dp=1,devices=0",
              "actor/train": "tp=1,pp=1,dp=2,devices=0:2", "critic/infer": "tp=1,pp=1,dp=1,devices=1",
              "critic/train": "tp=1,pp=1,dp=2,devices=1:2", "reference/infer": "tp=1,pp=1,dp=2,devices=1:4",
              "reward/infer": "tp=1,pp=1,dp=1,devices=0"}
ASYNC_TO = dict(ASYNC_PLAN, **{"actor/generate": "tp=2,pp=1,dp=1,devices=4-5"})

BIN = sys.argv[1]
NEREUSD = os.path.join(BIN, "nereusd")
NEREUS = os.path.join(BIN, "nereus")
work = tempfile.mkdtemp(prefix="nereus-member-")
TOKEN = token_file(work, "token", "s3cret-token-for-the-member-tests")
procs = []


def coordinator(name):
    log = start(NEREUSD, TOKEN, work, name, "--coordinator-mode", "--nodes", "3", "--listen", "127.0.0.1:0",
                "--devices", "host:2:256MiB", procs=procs)
    end = time.time() + 10
    while time.time() < end:
        log.seek(0)
        m = re.search(r"listening on (127\.0\.0\.1:\d+)", log.read())
        if m:
            return m.group(1)
        time.sleep(0.05)
    raise SystemExit(f"the coordinator did not start: {open(log.name).read()}")


def members(addr, tag, extra=None):
    """Two framework processes, ranks 1 and 2; their JSON lines go to WORK/TAG-R.jsonl. The
    last ones leave first (their job ended): ranks 1 and 2 must be free to join."""
    for p in procs[1:]:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            stop_all([p])
    out = {}
    for r in (1, 2):
        path = os.path.join(work, f"{tag}-{r}.jsonl")
        log = open(os.path.join(work, f"{tag}-{r}.log"), "w")
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "member_node.py"), NEREUS, addr, str(r), "3", TOKEN, path,
                                       *((extra or {}).get(r, []))], stdout=log, stderr=subprocess.STDOUT))
        out[r] = path
    return out


def lines(path):
    try:
        return [json.loads(x) for x in open(path) if x.strip()]
    except FileNotFoundError:
        return []


def ended(path, timeout=30):
    """Waits until a framework wrote its last line (its steps() ended)."""
    end = time.time() + timeout
    while time.time() < end and not (lines(path) and lines(path)[-1].get("ended")):
        time.sleep(0.05)


def wait_alive(addr, n, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        r = subprocess.run([NEREUS, "cluster", "status", "--coordinator", addr, "--token-file", TOKEN, "--json"],
                           capture_output=True, text=True)
        if r.returncode == 0 and json.loads(r.stdout).get("alive") == n:
            return True
        time.sleep(0.1)
    return False


def job(addr, *args):
    r = subprocess.run([NEREUS, "cluster", "job", "--coordinator", addr, "--token-file", TOKEN, "--job", "ppo-tiny", "--json",
                        "--node-steps", *args], capture_output=True, text=True, timeout=300)
    return r.returncode, (json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}), r.stderr


def units_by_stage(seen):
    out = {}
    for u in seen["units"]:
        out.setdefault(u["model_stage"], []).append(u)
    return out


def member_errors():
    """The Python API's errors: each one line naming what is wrong."""
    import nereus
    try:
        nereus.Member(coordinator="127.0.0.1:1", rank=1, nodes=2, token_file="/no/such/token")
        check(False, "a missing token file is refused")
    except nereus.Error as e:
        check("/no/such/token" in str(e), f"a missing token file is named ({e})")
    try:
        nereus.Member(coordinator="127.0.0.1:1", rank=1, nodes=2, token_file=TOKEN, memory="tpu")
        check(False, "memory other than host or cuda is refused")
    except nereus.Error as e:
        check("'tpu'" in str(e), f"memory other than host or cuda is named ({e})")
    m = nereus.Member(coordinator="127.0.0.1:1", rank=1, nodes=2, token_file=TOKEN, join_timeout_ms=300)
    try:
        m.report(stage_seconds={"actor/train": 1.0})
        check(False, "a report without a step is refused")
    except nereus.Error as e:
        check("no step to report" in str(e), f"a report without a step is refused ({e})")
    try:
        m.report(stage_seconds={"actor/train": 1.0}, stream="generation")
        check(False, "a report for a stream without a step is refused")
    except nereus.Error as e:
        check("no generation step to report" in str(e), f"a report for a stream without a step is refused ({e})")
    try:
        m.report(stream="sideways")
        check(False, "an unknown stream is refused")
    except nereus.Error as e:
        check("'sideways'" in str(e), f"an unknown stream is named ({e})")
    try:
        m.next_step(timeout=30)
        check(False, "a node that cannot join ends next_step()")
    except nereus.Error as e:
        check("node stopped" in str(e) and "127.0.0.1:1" in str(e), f"a node that cannot join says why ({e})")
    check(not m.running, "and it is no longer running")


try:
    member_errors()

    # 1. Two steps on JOB_FROM, then JOB_TO: the frameworks see the units a transition built.
    # Node 1's framework backs its critic/train and reference/infer units of JOB_FROM with
    # tensors of its own holding the fill it wrote itself: JOB_TO reads them across
    # processes (critic/train onto devices 4-5, reference/infer onto 4:5), weight sync reads
    # critic/train into node 0's critic/infer, and the job's check verifies what arrived.
    addr = coordinator("coordinator")
    adopted = ["critic/train", "reference/infer"]
    files = members(addr, "move", {1: ["--adopt", ",".join(adopted), "--adopt-plan", json.dumps(JOB_FROM)]})
    check(wait_alive(addr, 3), "two framework processes joined as nodes 1 and 2")
    rc, rep, err = job(addr, "--plan", json.dumps(JOB_FROM), "--to", json.dumps(JOB_TO), "--steps", "2")
    check(rc == 0 and rep.get("verified") is True, f"the job over framework nodes ends verified (rc {rc}, {err.strip()[-300:]})")
    # Each framework node serves its metrics as nereusd does (builds count as runs); the
    # framework reads them itself before it leaves (member_node.py).
    for r in (1, 2):
        ended(files[r])
    runs = lines(files[1])[-1].get("runs") if lines(files[1]) else None
    check(runs is not None and runs > 0, f"node 1's framework serves its metrics, builds counted ({runs})")
    steps = rep.get("steps", [])
    check(len(steps) == 2 and "transition" in steps[0], "step 1 runs, then the transition to the --to plan")
    between = steps[0].get("transition", {}).get("seconds") if steps else None
    measured = steps[0].get("measured", {}) if steps else {}
    check(sorted(measured.get("nodes", [])) == [0, 1, 2], f"every node answered the step ({measured.get('nodes')})")
    seen = {r: lines(p) for r, p in files.items()}
    for r in (1, 2):
        got = [x for x in seen[r] if "step" in x]
        check([x["step"] for x in got] == [1, 2], f"node {r}'s framework ran steps 1 and 2 ({[x.get('step') for x in got]})")
        check(seen[r] and seen[r][-1].get("ended") is True, f"node {r}'s steps() ended with the job")
        check(all(u["fill_ok"] and u["shards"] > 0 for x in got for u in x["units"]),
              f"node {r}: every shard it read matches the fill recomputed independently")
        for x in got:
            plan = JOB_FROM if x["step"] == 1 else JOB_TO
            want = {}
            for stage, spec in plan.items():
                dp = int(spec.split("dp=")[1].split(",")[0])
                check(x["replicas"].get(stage) == dp, f"node {r} step {x['step']}: {stage} has {dp} replicas")
                ids = []
                for g in spec.split("devices=")[1].split(":"):
                    lo, _, hi = g.partition("-")
                    ids += list(range(int(lo), int(hi or lo) + 1))
                per = len(ids) // dp  # replica i holds the i-th run of `per` devices
                for rep_i in range(dp):
                    devs = ids[rep_i * per:(rep_i + 1) * per]
                    if any(d // 2 == r for d in devs):
                        want.setdefault(stage, []).append((rep_i, devs))
            have = {s: sorted((u["replica"], u["devices"]) for u in us) for s, us in units_by_stage(x).items()}
            check(have == {s: sorted(v) for s, v in want.items()},
                  f"node {r} step {x['step']}: it holds exactly the plan's units with a GPU on it")
    first = [x for x in seen[1] if x.get("step") == 1]
    own = {u["model_stage"]: (u["adopted"], u["shards"]) for x in first for u in x["units"] if u["model_stage"] in adopted}
    check(sorted(own) == adopted and all(a == n > 0 for a, n in own.values()),
          f"node 1's step 1: every shard of its adopted units is the framework's own tensor ({own})")
    later = [u for x in seen[1] if x.get("step") == 2 for u in x["units"]]
    check(later and not any(u["adopted"] for u in later), "after the transition its units live in the node's arenas")
    # The stage times reach the controller: the slowest node's per model-stage.
    fw = {}
    for r in (1, 2):
        for x in seen[r]:
            if x.get("step") == 1:
                for s, t in x["seconds"].items():
                    fw[s] = max(fw.get(s, 0.0), t)
    got = measured.get("stage_seconds", {})
    check(fw and all(abs(got.get(s, -1) - t) < 1e-9 for s, t in fw.items()),
          f"step 1's measured times are the slowest framework's ({got} vs {fw})")
    check(measured.get("response_len_p95", 0) > measured.get("response_len_mean", 0) > 0, "the frameworks' response lengths are reported")
    # A training stage a framework reported a time for trained: after the step, every other
    # stage of its model got the trained params (the fill again here). In JOB_FROM only
    # critic/train is on a framework's node (node 0 is a plain nereusd), and critic/infer
    # has one unit.
    sync = steps[0].get("weight_sync", {}) if steps else {}
    trained = {s.split("/")[0] for s in fw if s.endswith("/train")}
    units_synced = sum(int(JOB_FROM[s].split("dp=")[1].split(",")[0]) for s in JOB_FROM
                       if s.split("/")[0] in trained and not s.endswith("/train"))
    check(trained == {"critic"} and sync.get("builds") == units_synced == 1 and sync.get("link_bytes", 0) > 0,
          f"weight sync after step 1 rebuilt the critic's inference unit from critic/train ({sync})")

    # 1b. --overlap: the move to JOB_TO admitted after step 1 runs beside step 2, whose
    # frameworks (1 s a step) still compute on JOB_FROM's units; step 3 has JOB_TO's.
    sleepy = {r: ["--step-sleep", "1.0"] for r in (1, 2)}
    files = members(addr, "overlap", sleepy)
    check(wait_alive(addr, 3), "the frameworks joined for the overlapped transition")
    rc, rep, err = job(addr, "--plan", json.dumps(JOB_FROM), "--to", json.dumps(JOB_TO), "--steps", "3", "--overlap")
    steps = rep.get("steps", [])
    t = steps[0].get("transition", {}) if steps else {}
    check(rc == 0 and rep.get("verified") is True and t.get("completed") is True and t.get("overlapped") is True
          and t.get("beside_step") == 2, f"the transition admitted after step 1 ran beside step 2 and the job verifies "
          f"({ {k: t.get(k) for k in ('completed', 'overlapped', 'beside_step', 'error')} }, {err.strip()[-300:]})")
    for r in (1, 2):
        ended(files[r])
        got = [x for x in lines(files[r]) if "step" in x]
        plans = []
        for x in got:
            have = {s: sorted((u["replica"], u["devices"]) for u in us) for s, us in units_by_stage(x).items()}
            plans.append(have)
        check(len(got) == 3 and plans[0] == plans[1] and plans[1] != plans[2],
              f"node {r}'s framework computed step 2 on the old units, step 3 on the new ones")
    during = [n for n in t.get("graph_nodes", []) if n["start"] < t.get("step_end", 0)]  # graph nodes' clock
    early = [n for n in during if n["kind"] != "destroy"]
    late = [n for n in during if n not in early]
    check(early and not late and not any("/train " in n["unit"] for n in early),
          f"builds that read no training state ran during step 2, nothing else did "
          f"({[(n['kind'], n['unit'], round(n['start'], 3)) for n in early + late]}, step ended at {t.get('step_end')} s)")
    check(0 <= t.get("exposed_seconds", -1) < t.get("seconds", 0),
          f"part of the transition hid behind step 2 (exposed {t.get('exposed_seconds')} s of {t.get('seconds')} s)")
    print(f"JOB_FROM -> JOB_TO between steps: {between} s; beside step 2: {t.get('exposed_seconds')} s past the step",
          file=sys.stderr)

    # 2. The controller decides from what the frameworks measured.
    files = members(addr, "ctl")
    check(wait_alive(addr, 3), "the frameworks joined again")
    rc, rep, err = job(addr, "--steps", "3", "--response-len", "64", "--response-len-after", "256")
    steps = rep.get("steps", [])
    check(rc == 0 and rep.get("verified") is True and len(steps) == 3, f"a controller-driven job over frameworks verifies ({err.strip()[-300:]})")
    check(all("decision" in s and "measured" in s for s in steps), "every step has the frameworks' measurements and a decision")

    # 3. A report naming no model-stage: one clear error, the coordinator keeps serving.
    files = members(addr, "bad", {1: ["--report-stage", "actor/dance"]})
    check(wait_alive(addr, 3), "the frameworks joined for the bad report")
    rc, rep, err = job(addr, "--steps", "2")
    text = rep.get("error", "") + err
    check(rc == 1 and "node 1 reported a time for 'actor/dance'" in text, f"a bad report is named ({text.strip()[-300:]})")

    # 3b. Framework memory for a plan the job does not load (node 2 adopts JOB_TO's
    # reference/infer on devices 4-5; JOB_FROM has it on device 2): named at the first step.
    files = members(addr, "unadopted", {2: ["--adopt", "reference/infer", "--adopt-plan", json.dumps(JOB_TO)]})
    check(wait_alive(addr, 3), "the frameworks joined for the unmatched adoption")
    rc, rep, err = job(addr, "--plan", json.dumps(JOB_FROM), "--steps", "1")
    text = rep.get("error", "") + err
    check(rc == 1 and "node 2: adopt: the initial plan has no buffer" in text and "of 'reference/infer'" in text,
          f"framework memory no loaded unit takes is named (rc {rc}, {text.strip()[-300:]}, {str(rep)[-300:]})")

    # 3c. Framework memory of another kind than the node's devices (node 1's tensors say they
    # are CUDA memory; its devices are host memory): one error naming the buffer at jobOpen.
    files = members(addr, "wrong-kind", {1: ["--adopt", "reference/infer", "--adopt-plan", json.dumps(JOB_FROM),
                                             "--adopt-claims-cuda"]})
    check(wait_alive(addr, 3), "the frameworks joined for the adoption of the wrong kind")
    rc, rep, err = job(addr, "--plan", json.dumps(JOB_FROM), "--steps", "1")
    text = rep.get("error", "") + err
    check(rc == 1 and re.search(r"node 1: adopt: device \d+ is host memory, and the framework's buffer \S+ cuda memory", text),
          f"framework memory of another kind than the devices is named (rc {rc}, {text.strip()[-300:]})")

    # 3d. An async job (--mode async): each framework runs generation and training on two
    # threads, each reporting its own stream; generation steps run on the weight version of
    # a whole update, at most one version behind, and the move to ASYNC_TO after step 1
    # drains generation first.
    stop_all(procs[1:])
    streams = {r: ["--streams", "--generation-sleep", "0.4"] for r in (1, 2)}
    files = members(addr, "async", streams)
    check(wait_alive(addr, 3), "the frameworks joined for the async job")
    rc, rep, err = job(addr, "--mode", "async", "--plan", json.dumps(ASYNC_PLAN), "--to", json.dumps(ASYNC_TO), "--steps", "4")
    steps = rep.get("steps", [])
    updates = rep.get("weight_updates", [])
    check(rc == 0 and rep.get("verified") is True and rep.get("mode") == "async" and rep.get("max_staleness") == 1,
          f"the async job over framework nodes ends verified (rc {rc}, {rep.get('error')}, {err.strip()[-300:]})")
    versions = [s.get("weight_version") for s in steps]
    check(len(steps) == 4 and all(s.get("staleness") == k - v for k, (s, v) in enumerate(zip(steps, versions)))
          and all(0 <= s.get("staleness", -1) <= 1 for s in steps) and versions == sorted(versions),
          f"each step's generation ran at most one version behind the trainer ({versions})")
    check([u.get("version") for u in updates] == [1, 2, 3, 4] and all(u.get("switched") and u.get("moved_bytes", 0) > 0
                                                                      and u.get("seconds", 0) > 0 for u in updates),
          f"every training step's weights reached the generation units as a versioned update ({updates})")
    t = steps[0].get("transition", {}) if steps else {}
    check(t.get("completed") is True and t.get("drained") is True and t.get("weight_sync", {}).get("version") == 1,
          f"the move to ASYNC_TO ran with generation drained, and the new generation units hold version 1 ({t})")
    for r in (1, 2):
        ended(files[r])
    seen = [x for r in (1, 2) for x in lines(files[r]) if "step" in x]
    gen = [x for x in seen if x["stream"] == "generation"]
    train = [x for x in seen if x["stream"] == "training"]
    check(gen and train and all(u["model_stage"] == "actor/generate" for x in gen for u in x["units"])
          and all(u["model_stage"] != "actor/generate" for x in train for u in x["units"]),
          "generation steps hand the frameworks the generation units only, training steps the others")
    check(all(u["fill_ok"] for x in seen for u in x["units"]), "every shard the frameworks read matches the fill")
    by_version = {}
    for u in updates:
        by_version[u["version"]] = set(u.get("units", []))
    mixed = [x for x in gen if len({v for u in x["units"] for v, ids in by_version.items() if u["id"] in ids}) > 1]
    check(not mixed and all(x["weight_version"] == steps[x["step"] - 1]["weight_version"] for x in gen),
          f"no generation step read units of two versions, and each ran the version the job reports ({mixed})")
    both = [(g["step"], t["step"]) for g in gen for t in train
            if g["began_at"] < t["ended_at"] and t["began_at"] < g["ended_at"]]
    check(both, "a framework held a generation and a training step at once (two streams)")

    # 3d'. Bad async requests: one line each, before any unit loads.
    shared = dict(ASYNC_PLAN, **{"actor/generate": "tp=1,pp=1,dp=2,devices=2:3"})
    rc, rep, err = job(addr, "--mode", "async", "--plan", json.dumps(shared), "--steps", "1")
    text = rep.get("error", "") + err
    check(rc == 1 and "actor/generate and actor/train share GPU 2" in text,
          f"an async plan with generation and training on one GPU is refused (rc {rc}, {text.strip()[-300:]})")
    for extra, want in ((["--mode", "async", "--overlap"], "--overlap is for sync jobs"),
                        (["--max-staleness", "2"], "--max-staleness is for async jobs"),
                        (["--mode", "later"], "'later' is not one of sync, async")):
        rc, rep, err = job(addr, *extra)
        check(rc != 0 and want in err, f"{' '.join(extra)}: refused with one line ({err.strip()[-200:]})")
    r = subprocess.run([NEREUS, "cluster", "job", "--coordinator", addr, "--token-file", TOKEN, "--job", "ppo-tiny",
                        "--mode", "async"], capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "pass --node-steps" in r.stderr, f"an async job without --node-steps is refused ({r.stderr.strip()[-200:]})")

    # 3e. A node lost while an update is in flight: node 2's framework dies at the end of
    # generation step 3, while update 2 waits for that step's end to switch in. The update is
    # dropped, the surviving generation unit keeps its whole version (1), and generation
    # resumes on the trainer's version after the recovery. (--to the same plan: the plan
    # holds until the loss, then the controller decides on the survivors.)
    files = members(addr, "async-kill", {1: ["--streams", "--generation-sleep", "0.6"],
                                         2: ["--streams", "--generation-sleep", "0.6", "--die-at-step", "3",
                                             "--die-stream", "generation"]})
    check(wait_alive(addr, 3), "the frameworks joined for the loss during an update")
    rc, rep, err = job(addr, "--mode", "async", "--plan", json.dumps(ASYNC_PLAN), "--to", json.dumps(ASYNC_PLAN), "--steps", "4")
    f = (rep.get("failures") or [{}])[0]
    updates = {u.get("version"): u for u in rep.get("weight_updates", [])}
    check(rc == 0 and rep.get("verified") is True, f"the async job survives the loss and verifies (rc {rc}, {rep.get('error')}, "
          f"{err.strip()[-300:]})")
    check(f.get("lost_nodes") == [2] and "dropped" in updates.get(2, {}) and not updates.get(2, {}).get("switched"),
          f"node 2 was lost with update 2 in flight, which was dropped ({f.get('lost_nodes')}, {updates.get(2)})")
    gv = f.get("generation_versions", {})
    check(gv and set(gv.values()) == {1}, f"every surviving generation unit was on one whole version, 1 ({gv})")
    check(f.get("weight_sync", {}).get("version") == 2, f"after the recovery generation holds the trainer's version 2 ({f.get('weight_sync')})")
    later = [s.get("weight_version") for s in rep.get("steps", [])[3:]]
    check(later and min(later) >= 2, f"generation steps after the loss ran version 2 or newer ({later})")

    # 4. A framework killed mid-step: the job goes on with the survivors' intact units; the
    # framework restarted rejoins at a later step and the job moves onto it again.
    time.sleep(0.5)
    stop_all(procs[1:])
    files = members(addr, "kill", {1: ["--step-sleep", "1"], 2: ["--die-at-step", "2"]})
    check(wait_alive(addr, 3), "the frameworks joined for the kill")
    running = subprocess.Popen([NEREUS, "cluster", "job", "--coordinator", addr, "--token-file", TOKEN, "--job", "ppo-tiny",
                                "--json", "--node-steps", "--plan", json.dumps(JOB_SPREAD), "--to", json.dumps(JOB_SPREAD_TO),
                                "--steps", "8", "--timeout", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = procs[-1]
    victim.wait(60)
    restarted = os.path.join(work, "kill-2-again.jsonl")
    procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "member_node.py"), NEREUS, addr, "2", "3", TOKEN, restarted],
                                  stdout=open(os.path.join(work, "kill-2-again.log"), "w"), stderr=subprocess.STDOUT))
    out, err = running.communicate(timeout=300)
    rep = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    f = (rep.get("failures") or [{}])[0]
    check(victim.returncode == -signal.SIGKILL, "the framework of node 2 died mid-step")
    check(f.get("lost_nodes") == [2] and f.get("phase") == "idle", f"the killed framework's node is lost during its step ({f})")
    check(rep.get("verified") is True, f"the job ends verified ({rep.get('error')}, {err.strip()[-200:]})")
    joined = [s["step"] for s in rep.get("steps", []) if s.get("joined_nodes") == [2]]
    check(len(joined) == 1, f"the restarted framework's node rejoined the job at a later step ({joined})")
    time.sleep(0.5)
    got = [x for x in lines(files[1]) if "step" in x]
    check([x["step"] for x in got] == list(range(1, 9)), f"node 1's framework ran every step ({[x['step'] for x in got]})")
    check(got and all(all(u["fill_ok"] for u in x["units"]) for x in got), "node 1 read the fill after the recovery too")
    again = [x for x in lines(restarted) if "step" in x]
    check(again and again[-1]["step"] == 8 and any(x["units"] for x in again)
          and all(u["fill_ok"] for x in again for u in x["units"]),
          f"the restarted framework ran the steps after it joined, on units the job moved onto it again "
          f"({[(x['step'], len(x['units'])) for x in again]})")

    # 5. The coordinator killed while the frameworks compute a step: their reports go
    # nowhere (no error), steps() ends, and the processes exit cleanly.
    stop_all(procs[1:])
    files = members(addr, "orphan", {1: ["--step-sleep", "2"], 2: ["--step-sleep", "2"]})
    check(wait_alive(addr, 3), "the frameworks joined for the coordinator's death")
    orphans = procs[-2:]
    running = subprocess.Popen([NEREUS, "cluster", "job", "--coordinator", addr, "--token-file", TOKEN, "--job", "ppo-tiny",
                                "--json", "--node-steps", "--steps", "5"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.time() + 60
    while time.time() < end and not all(any(x.get("began") == 2 for x in lines(files[r])) for r in (1, 2)):
        time.sleep(0.05)
    procs[0].kill()  # the coordinator, while the frameworks hold step 2 (they sleep 2 s in each)
    codes = [p.wait(30) for p in orphans]
    running.wait(30)
    check(codes == [0, 0], f"the frameworks end cleanly when the coordinator dies mid-step ({codes})")
    for r in (1, 2):
        ended(files[r])
    check(all(lines(files[r]) and lines(files[r])[-1].get("ended") is True
              and [x["step"] for x in lines(files[r]) if "step" in x] == [1, 2] for r in (1, 2)),
          "their steps() ended after step 2, whose report went nowhere")
finally:
    stop_all(procs)

finish("member")
