#!/usr/bin/env bash
# A job whose node 1 is a framework process holding its own memory (gpu_member.cpp): a
# coordinator nereusd as node 0, gpu_member as node 1 adopting its critic/train and
# reference/infer units of the first plan, and `nereus cluster job --node-steps` from that
# plan to one that reads those units onto node 0's devices; the job's check verifies
# every byte that arrived. Prints one JSON line {"job": ..., "member": ...}.
#   member_job.sh MEMORY DIR [MACHINE [TRANSPORT]]
# MEMORY: cuda (benches/gpu/run.sh: CUDA IPC between the two, or with MACHINE staged UCX
# messages) or host (tests/meson.build: the same on host memory, where no GPU is).
# DIR holds nereus, nereusd and gpu_member (or the build tree: src/, benches/).
set -uo pipefail
memory=$1 dir=$2 machine=${3:-} transport=${4:-}
bin() { [ -x "$dir/$1" ] && echo "$dir/$1" || echo "$dir/$2/$1"; }
nereus=$(bin nereus src) nereusd=$(bin nereusd src) member=$(bin gpu_member benches)
work=$(mktemp -d)
trap 'kill $d0 $m 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
printf 'member-job-%s-%s-token' "$$" "$RANDOM" > "$work/token"
chmod 600 "$work/token"
from='{"actor/generate": "tp=1,pp=1,dp=4,devices=0-3", "actor/infer": "tp=1,pp=1,dp=1,devices=0",
  "actor/train": "tp=1,pp=1,dp=2,devices=0:1", "critic/infer": "tp=1,pp=1,dp=1,devices=1",
  "critic/train": "tp=1,pp=1,dp=2,devices=2:3", "reference/infer": "tp=1,pp=1,dp=1,devices=2",
  "reward/infer": "tp=1,pp=1,dp=1,devices=3"}'
to='{"actor/generate": "tp=2,pp=1,dp=2,devices=0-3", "actor/infer": "tp=1,pp=1,dp=2,devices=2:3",
  "actor/train": "tp=2,pp=1,dp=2,devices=0-3", "critic/infer": "tp=1,pp=1,dp=1,devices=0",
  "critic/train": "tp=1,pp=2,dp=2,devices=0-3", "reference/infer": "tp=2,pp=1,dp=1,devices=0:1",
  "reward/infer": "tp=1,pp=1,dp=1,devices=1"}'
port=$((20000 + RANDOM % 20000))
"$nereusd" --token-file "$work/token" --coordinator-mode --nodes 2 --listen 127.0.0.1:$port --devices "$memory:2:1GiB" \
  > "$work/d0.log" 2>&1 &
d0=$!
"$member" "$memory" 127.0.0.1:$port 1 2 "$work/token" ppo-tiny "$from" critic/train,reference/infer 2 $machine \
  > "$work/member.json" 2> "$work/member.log" &
m=$!
for _ in $(seq 80); do
  "$nereus" cluster status --coordinator 127.0.0.1:$port --token-file "$work/token" --json 2>/dev/null | grep -q '"alive": *2' && break
  kill -0 $m 2>/dev/null || break
  sleep 0.25
done
timeout 120 "$nereus" cluster job --coordinator 127.0.0.1:$port --token-file "$work/token" --job ppo-tiny --node-steps \
  --plan "$from" --to "$to" --steps 2 --json ${transport:+--transport $transport} > "$work/job.json" 2> "$work/job.err"
rc=$?
for _ in $(seq 40); do kill -0 $m 2>/dev/null || break; sleep 0.25; done
python3 - "$rc" "$work" <<'PY'
import json, sys
rc, work = int(sys.argv[1]), sys.argv[2]
def text(name):
    try:
        return open(f"{work}/{name}").read()
    except OSError:
        return ""
job = {"rc": rc}
try:
    rep = json.loads(text("job.json").strip().splitlines()[-1])
    t = rep["steps"][0].get("transition", {})
    job.update(verified=rep.get("verified"), verified_bytes=rep.get("verified_bytes"), moved_bytes=t.get("moved_bytes"),
               seconds=t.get("seconds"))
except (IndexError, KeyError, ValueError):
    job["error"] = (text("job.err") + text("d0.log"))[-400:]
try:
    member = json.loads(text("member.json").strip().splitlines()[-1])
except (IndexError, ValueError):
    member = {"error": text("member.log")[-400:]}
print(json.dumps({"job": job, "member": member}))
PY
