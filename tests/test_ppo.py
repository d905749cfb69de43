#!/usr/bin/python3
"""Short PPO runs on Nereus (examples/rlhf/ppo.py):
- forced transitions of every kind the example's plan allows (the actor's PP split, the
  critic's training layout, a placement change of the reference) begun mid-step, each
  checked bit for bit with --check-state (fixed plan otherwise, room for every layout);
- the actor trained FSDP-sharded (fsdp=2): the same losses, bit for bit, as the actor
  trained on one device (the chunks gathered are the whole tensor), and a forced change
  into FSDP checked bit for bit like the others;
- the default run (live controller, the default capacity) for a few steps with one forced
  change and --perfetto: the trace's structure;
- the live controller's first memory-forced change and two steps past it, for PPO and
  GRPO (--grow-at -1: responses grow every step, so memory runs short at step 3 rather
  than step 18 of the default run, which once crashed there);
- --async (PPO and GRPO) for a few steps: its JSON fields, staleness within max_staleness,
  versions that only grow, every weight update reported, both streams in the trace; PPO
  with a forced plan change beside generation, GRPO with the live controller deciding on
  its async model; every:K refused.
Usage: test_ppo.py PPO_PY"""
import json
import os
import subprocess
import sys
import tempfile


def main(ppo):
    forced = ["1:actor/train=tp=1,pp=2,dp=1,devices=4-5", "2:critic/train=tp=1,pp=1,dp=2,devices=6-7",
              "3:reference/infer=tp=1,pp=1,dp=2,devices=4-5", "4:actor/train=tp=1,pp=1,fsdp=2,dp=1,devices=4-5"]
    args = [sys.executable, ppo, "--steps", "6", "--json", "--check-state", "--plan-changes", "none", "--capacity", "64MiB"]
    for f in forced:
        args += ["--force-transition", f]
    r = subprocess.run(args, capture_output=True, text=True, timeout=240)
    failed = 0

    def check(ok, what):
        nonlocal failed
        print(("ok   " if ok else "FAIL ") + what)
        failed += not ok
        check.failed = failed

    check.failed = 0
    check(r.returncode == 0, f"ppo.py exits 0 (rc {r.returncode}): {r.stderr[-1500:]}")
    try:
        out = json.loads(r.stdout)
    except json.JSONDecodeError:
        check(False, "stdout is one JSON object: " + r.stdout[-500:])
        return 1
    check(len(out["steps"]) == 6, "6 steps reported")
    check(all({"reward_mean", "seconds", "plan"} <= set(s) for s in out["steps"]), "each step has reward_mean, seconds, plan")
    check(len(out["transitions"]) == 4 and all(t["completed"] for t in out["transitions"]),
          f"4 transitions completed: {out['transitions']}")
    check(all({"trigger", "moved_bytes", "seconds", "exposed_seconds"} <= set(t) for t in out["transitions"]),
          "each transition has trigger, moved_bytes, seconds, exposed_seconds")
    check(out["state_checks"] == {"passed": 4, "failed": 0}, f"state checks: {out['state_checks']}")
    plan = out["steps"][-1]["plan"]
    check(plan["actor/train"].startswith("tp=1,pp=1,fsdp=2,dp=1,") and plan["critic/train"].startswith("tp=1,pp=1,dp=2,")
          and plan["reference/infer"].startswith("tp=1,pp=1,dp=2,"),
          f"the final plan has the forced layouts: {plan}")
    return (failed + fsdp_actor(ppo, check) + default_run_trace(ppo, check) + memory_forced(ppo, check)
            + async_runs(ppo, check))


def fsdp_actor(ppo, check):
    """The actor trained with fsdp=2 on devices 4-5 and on device 4 alone: FSDP's chunks,
    gathered, are the whole tensors and each chunk's gradient is its rows of the whole, so
    the runs agree bit for bit (tp=2 would differ in the last bits: its partial sums)."""
    failed_before = check.failed
    losses = {}
    for spec in ("tp=1,pp=1,fsdp=2,dp=1,devices=4-5", "tp=1,pp=1,dp=1,devices=4"):
        r = subprocess.run([sys.executable, ppo, "--steps", "2", "--json", "--plan-changes", "none", "--capacity", "64MiB",
                            "--actor-train", spec], capture_output=True, text=True, timeout=240)
        check(r.returncode == 0, f"actor/train={spec}: exits 0 (rc {r.returncode}): {r.stderr[-1500:]}")
        if r.returncode == 0:
            steps = json.loads(r.stdout)["steps"]
            check(all(s["plan"]["actor/train"].startswith(spec.split(",devices")[0]) for s in steps), f"{spec}: ran on it")
            losses[spec] = [(s["policy_loss"], s["kl"], s["reward_mean"]) for s in steps]
    if len(losses) == 2:
        a, b = losses.values()
        check(a == b, f"the FSDP actor trains exactly as the one-device actor: {a} vs {b}")
    # The live controller, given a job that trains with FSDP, weighs FSDP against TP/PP at
    # the memory-forced change (responses grow every step); whatever it picks runs on and
    # passes the bit-for-bit state check.
    r = subprocess.run([sys.executable, ppo, "--steps", "4", "--grow-at", "-1", "--json", "--check-state", "--actor-train",
                        "tp=1,pp=1,fsdp=2,dp=1,devices=4-5"], capture_output=True, text=True, timeout=240)
    check(r.returncode == 0, f"FSDP actor under the controller: exits 0 (rc {r.returncode}): {r.stderr[-1500:]}")
    if r.returncode == 0:
        out = json.loads(r.stdout)
        check(any("memory" in t["trigger"] and t["completed"] for t in out["transitions"])
              and out["state_checks"]["passed"] >= 1 and out["state_checks"]["failed"] == 0,
              f"FSDP actor: the memory-forced change completed and checked ({out['transitions']}, {out['state_checks']})")
    return check.failed - failed_before


def memory_forced(ppo, check):
    failed_before = check.failed
    for algorithm in ("ppo", "grpo"):
        r = subprocess.run([sys.executable, ppo, "--algorithm", algorithm, "--steps", "5", "--grow-at", "-1", "--json",
                            "--check-state"], capture_output=True, text=True, timeout=240)
        check(r.returncode == 0, f"{algorithm}: runs through its memory-forced change (rc {r.returncode}): {r.stderr[-1500:]}")
        if r.returncode != 0:
            continue
        out = json.loads(r.stdout)
        forced = [t for t in out["transitions"] if "memory" in t["trigger"]]
        check(len(forced) >= 1 and all(t["completed"] for t in out["transitions"]),
              f"{algorithm}: a memory-triggered transition was admitted and completed: {out['transitions']}")
        if forced:
            after = [s for s in out["steps"] if s["step"] > forced[0]["step"]]
            check(len(after) >= 2 and all(s["plan"] == forced[0]["plan"] for s in after),
                  f"{algorithm}: two steps ran on the plan it reached")
        check(out["state_checks"]["passed"] >= 1 and out["state_checks"]["failed"] == 0,
              f"{algorithm}: state checks across it: {out['state_checks']}")
        urgent = [d for d in out["decisions"] if "memory" in d["trigger"]]
        check(bool(urgent) and all(d["admitted"] for d in urgent), f"{algorithm}: no memory-triggered decision stayed: {urgent}")
    return check.failed - failed_before


def async_runs(ppo, check):
    failed_before = check.failed
    changes = {"ppo": ["--force-transition", "1:actor/generate=tp=2,pp=1,dp=1,devices=6-7"],
               "grpo": ["--plan-changes", "controller"]}
    for algorithm, steps in (("ppo", 4), ("grpo", 3)):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            r = subprocess.run([sys.executable, ppo, "--async", "--algorithm", algorithm, "--steps", str(steps), "--json",
                                "--perfetto", path, *changes[algorithm]], capture_output=True, text=True, timeout=240)
            check(r.returncode == 0, f"--async {algorithm}: exits 0 (rc {r.returncode}): {r.stderr[-1500:]}")
            if r.returncode != 0:
                continue
            out = json.loads(r.stdout)
            with open(path) as f:
                trace = json.load(f)
        check(out["mode"] == "async" and len(out["steps"]) == steps, f"--async {algorithm}: mode and {steps} steps")
        s = out["steps"]
        check(all({"weight_version", "staleness", "reward_mean", "seconds"} <= set(x) for x in s),
              f"--async {algorithm}: each step has weight_version and staleness")
        check(all(0 <= x["staleness"] <= 1 for x in s) and s[0]["weight_version"] == 0,
              f"--async {algorithm}: staleness within max_staleness 1: {[x['staleness'] for x in s]}")
        check(all(a["weight_version"] <= b["weight_version"] for a, b in zip(s, s[1:])) and s[-1]["weight_version"] >= 1,
              f"--async {algorithm}: generation's versions only grow, and it got updates: {[x['weight_version'] for x in s]}")
        u = out["weight_updates"]
        check(len(u) >= steps - 2 and all({"version", "seconds", "moved_bytes", "paused_seconds"} <= set(x) for x in u)
              and all(x["moved_bytes"] > 0 and 0 <= x["paused_seconds"] <= x["seconds"] for x in u)
              and [x["version"] for x in u] == sorted({x["version"] for x in u}),
              f"--async {algorithm}: every weight update reported once, in order: {u}")
        names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
        check({"steps", "generation", "weight updates", "device 6: stages", "device 4: stages"} <= names,
              f"--async {algorithm}: both streams and the updates in the trace: {sorted(names)}")
        if algorithm == "ppo":
            t = out["transitions"]
            check(len(t) == 1 and t[0]["completed"] and t[0]["step"] == 1 and
                  t[0]["plan"]["actor/generate"].startswith("tp=2,pp=1,dp=1,") and s[-1]["weight_version"] >= 2,
                  f"--async ppo: the forced plan change ran beside generation, which went on on it: {t}")
        else:
            check(len(out["decisions"]) >= 1 and all(t["completed"] for t in out["transitions"]),
                  f"--async grpo: the live controller decided on the async job: {out['decisions']}")
    r = subprocess.run([sys.executable, ppo, "--async", "--plan-changes", "every:2", "--steps", "1"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "--async changes plan only through the controller" in r.stderr,
          f"--async with every:K: one clear error (rc {r.returncode}): {r.stderr[-300:]}")
    return check.failed - failed_before


def nested(events):
    """Events of one track either nest or do not overlap."""
    open_ends = []
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        while open_ends and open_ends[-1] <= e["ts"]:
            open_ends.pop()
        if open_ends and e["ts"] + e["dur"] > open_ends[-1] + 1e-3:
            return False
        open_ends.append(e["ts"] + e["dur"])
    return True


def default_run_trace(ppo, check):
    failed_before = check.failed
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        r = subprocess.run([sys.executable, ppo, "--steps", "3", "--json", "--perfetto", path,
                            "--force-transition", "1:reference/infer=tp=1,pp=1,dp=2,devices=0-1"],
                           capture_output=True, text=True, timeout=240)
        check(r.returncode == 0, f"the default run exits 0 (rc {r.returncode}): {r.stderr[-1500:]}")
        if r.returncode != 0:
            return 1
        out = json.loads(r.stdout)
        check("decisions" in out and len(out["transitions"]) == 1, "decisions reported; the forced transition ran")
        t = out["transitions"][0]
        check({"current_seconds", "target_seconds", "transition_seconds", "horizon_steps", "copied_bytes"} <= set(t),
              "a transition carries the controller's numbers (None when forced) and its bytes")
        with open(path) as f:
            trace = json.load(f)
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    check(all(e["dur"] >= 0 for e in events), "complete events with non-negative durations")
    tracks = {}
    for e in events:
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    check(all(nested(v) for v in tracks.values()), "events nest on every track")
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    check({"steps", "device 0: stages", "device 0: transition"} <= names, f"tracks per device: {sorted(names)}")
    nodes = {e["args"]["node"]: e["args"]["bytes"] for e in events if "node" in e.get("args", {})}
    check(sum(nodes.values()) == t["copied_bytes"] > 0,
          f"every copied byte is in one transition event: {sum(nodes.values())} of {t['copied_bytes']}")
    return check.failed - failed_before


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
