#!/usr/bin/python3
"""A short PPO run on Nereus (examples/rlhf/ppo.py): forced transitions of every kind the
example's plan allows (the actor's PP split, the critic's training layout, a placement
change of the reference) begun mid-step, each checked bit for bit with --check-state.
Usage: test_ppo.py PPO_PY"""
import json
import subprocess
import sys


def main(ppo):
    forced = ["1:actor/train=tp=1,pp=2,dp=1,devices=4-5", "2:critic/train=tp=1,pp=1,dp=2,devices=6-7",
              "3:reference/infer=tp=1,pp=1,dp=2,devices=4-5"]
    args = [sys.executable, ppo, "--steps", "5", "--json", "--check-state"]
    for f in forced:
        args += ["--force-transition", f]
    r = subprocess.run(args, capture_output=True, text=True, timeout=240)
    failed = 0

    def check(ok, what):
        nonlocal failed
        print(("ok   " if ok else "FAIL ") + what)
        failed += not ok

    check(r.returncode == 0, f"ppo.py exits 0 (rc {r.returncode}): {r.stderr[-1500:]}")
    try:
        out = json.loads(r.stdout)
    except json.JSONDecodeError:
        check(False, "stdout is one JSON object: " + r.stdout[-500:])
        return 1
    check(len(out["steps"]) == 5, "5 steps reported")
    check(all({"reward_mean", "seconds", "plan"} <= set(s) for s in out["steps"]), "each step has reward_mean, seconds, plan")
    check(len(out["transitions"]) == 3 and all(t["completed"] for t in out["transitions"]),
          f"3 transitions completed: {out['transitions']}")
    check(all({"trigger", "moved_bytes", "seconds", "exposed_seconds"} <= set(t) for t in out["transitions"]),
          "each transition has trigger, moved_bytes, seconds, exposed_seconds")
    check(out["state_checks"] == {"passed": 3, "failed": 0}, f"state checks: {out['state_checks']}")
    plan = out["steps"][-1]["plan"]
    check(plan["actor/train"].startswith("tp=1,pp=2,dp=1,") and plan["critic/train"].startswith("tp=1,pp=1,dp=2,")
          and plan["reference/infer"].startswith("tp=1,pp=1,dp=2,"),
          f"the final plan has the forced layouts: {plan}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
