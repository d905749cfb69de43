#!/usr/bin/env bash
# Runs on a GPU machine from the folder benches/gpu/pack.sh made (no build): the GPU suite
# (byte-exact reshards on CUDA devices), the GPU bench, and `nereus bench transition
# --transport cuda` in one process and across two (CUDA IPC gets), verified; then prints
# one JSON line:
#   {"suite": {"rc": 0, "tail": "..."}, "bench": {...}, "ipc": {"one_process": {...},
#    "two_processes": {...}, "ratio": two-process GB/s over one-process GB/s},
#    "staged_ucx_tag": {...},   (GPU memory across two processes over UCX tagged messages,
#    staged through page-locked host memory: the path between machines without CUDA-aware UCX)
#    "nccl": {"library": path, "one_process": {...}, "two_processes": {...} or why not},
#    "daemons": {"ipc": {...}, "staged_ucx_tag": {...}, "job": {...}, "job_two_machines": {...},
#                "member": {...}, "member_two_machines": {...}},   (the same reshard across two
#    nereusd on this machine: CUDA IPC between the daemons, then UCX tagged messages staged through
#    host memory; `cluster job` with the daemons' devices in GPU memory, --devices cuda:4,
#    on one machine and as two machines, --machine; and member_job.sh: a framework node on
#    GPU devices whose units are its own cudaMalloc sub-allocations (adopted), read by the
#    other daemon through CUDA IPC, then as two machines through staged UCX messages)
#    "python": {...},   (torch_units.py: the Python module over a job in GPU memory, the
#    machine's torch computing on the units through DLPack, round trips bit for bit; and
#    "member": nereus.Member(memory="cuda") as node 1 of a job, its step views the GPU's)
#    "mixed": {...}}   (4 processes as 2 emulated machines: CUDA IPC inside each, UCX tagged
#    messages staged through host memory across, in one transition; `transports` has both)
#    (every link an NCCL message in grouped rounds; NCCL comes from NEREUS_NCCL_LIBRARY or the
#    machine's own, PyTorch's say: the pack carries none. Across two processes only with two
#    or more GPUs: NCCL refuses two ranks on one GPU.)
# rc 77: no CUDA device was found.
# The whole script keeps within NEREUS_GPU_BUDGET seconds (default 480, under a lent machine's
# 10-minute call): each step gets at most what is left, and prints its result to stderr as
# it ends ("step NAME: ..."), so a call cut short still shows what finished.
set -uo pipefail
deadline=$((SECONDS + ${NEREUS_GPU_BUDGET:-480}))
limit() {  # limit MAX: seconds a step may take, what is left of the budget at most (5 at least)
  local left=$((deadline - SECONDS))
  [ "$left" -lt 5 ] && left=5
  echo $(($1 < left ? $1 : left))
}
step() { echo "step $1: ${2:0:400}" >&2; }
here=$(cd "$(dirname "$0")" && pwd)
machine_libs=${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH="$here/lib:$here/lib/cxx${machine_libs:+:$machine_libs}"
export UCX_MODULE_DIR="$here/lib" UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
# NCCL: the machine's own (the pack carries none), found before anything uses it.
if [ -z "${NEREUS_NCCL_LIBRARY:-}" ]; then
  for dir in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu; do
    found=$(find "$dir/" -maxdepth 6 -name 'libnccl.so.2' 2>/dev/null | head -1)
    [ -n "$found" ] && { export NEREUS_NCCL_LIBRARY=$found; break; }
  done
fi
suite_log=$(mktemp)
timeout "$(limit 240)" "$here/test-gpu" > "$suite_log" 2>&1
suite_rc=$?
step suite "rc $suite_rc"
bench_json=$(timeout "$(limit 180)" "$here/gpu_bench" "$@" 2>/dev/null | tail -1)
[ -n "$bench_json" ] || bench_json='{"error": "gpu_bench printed nothing"}'
step bench "$bench_json"
# The same reshard through the product's bench: in one process, and across two (IPC).
reshard=(bench transition --model llama-3.2-1b --from tp=4,pp=1,dp=1 --to tp=2,pp=1,dp=2 --transport cuda --verify
         --repeat 5 --json --quiet)
one_json=$(timeout "$(limit 90)" "$here/nereus" "${reshard[@]}" 2>&1 | tail -1)
step one_json "$one_json"
two_json=$(timeout "$(limit 90)" "$here/nereus" "${reshard[@]}" --procs 2 2>&1 | tail -1)
step two_json "$two_json"
staged=(bench transition --model llama-3.2-1b --from tp=4,pp=1,dp=1 --to tp=2,pp=1,dp=2 --memory cuda --transport ucx-tag
        --procs 2 --verify --repeat 5 --json --quiet)
staged_json=$(timeout "$(limit 90)" "$here/nereus" "${staged[@]}" 2>&1 | tail -1)
step staged_json "$staged_json"
# bf16 -> FP8 in GPU memory: the GPU quantizer on the senders, every byte and scale verified.
fp8=(bench transition --model llama-3.2-1b --from tp=1,pp=1,dp=1 --to tp=2,pp=1,dp=1,devices=1-2,dtype=fp8 --transport cuda
     --verify --repeat 5 --json --quiet)
fp8_json=$(timeout "$(limit 90)" "$here/nereus" "${fp8[@]}" 2>&1 | tail -1)
step fp8_json "$fp8_json"
nccl=(bench transition --model llama-3.2-1b --from tp=4,pp=1,dp=1 --to tp=2,pp=1,dp=2 --transport nccl --verify --repeat 5
      --json --quiet)
nccl_one=$(timeout "$(limit 90)" "$here/nereus" "${nccl[@]}" 2>&1 | tail -1)
step nccl_one "$nccl_one"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -ge 2 ]; then nccl_two=$(timeout "$(limit 90)" "$here/nereus" "${nccl[@]}" --procs 2 2>&1 | tail -1)
else nccl_two="{\"not_measured\": \"$gpus GPU(s): NCCL refuses two ranks on one GPU\"}"; fi
mixed=(bench transition --model llama-3.2-1b --from tp=4,pp=1,dp=1 --to tp=2,pp=1,dp=2 --memory cuda --transport auto
       --procs 4 --nodes 2 --verify --repeat 5 --json --quiet)
mixed_json=$(timeout "$(limit 90)" "$here/nereus" "${mixed[@]}" 2>&1 | tail -1)
step mixed_json "$mixed_json"
# Two daemons on this machine (logical devices on the GPUs present): start_daemons DEVICES
# starts them with --devices DEVICES and waits until both are alive; stop_daemons ends them.
work=$(mktemp -d)
printf 'gpu-pack-%s-%s' "$$" "$RANDOM" > "$work/token"
chmod 600 "$work/token"
start_daemons() {
  port=$((20000 + RANDOM % 20000))
  "$here/nereusd" --token-file "$work/token" --coordinator-mode --nodes 2 --listen 127.0.0.1:$port --devices "$1" > "$work/d0.log" 2>&1 &
  d0=$!
  "$here/nereusd" --token-file "$work/token" --coordinator 127.0.0.1:$port --node-rank 1 --nodes 2 --devices "$1" ${2:+--machine "$2"} \
    > "$work/d1.log" 2>&1 &
  d1=$!
  for _ in $(seq 40); do
    kill -0 "$d0" 2>/dev/null && kill -0 "$d1" 2>/dev/null || break  # one failed to start: its log says why
    "$here/nereus" cluster status --coordinator 127.0.0.1:$port --token-file "$work/token" --json 2>/dev/null | grep -q '"alive": *2' && break
    sleep 0.5
  done
}
stop_daemons() {
  kill "$d0" "$d1" 2>/dev/null
  wait "$d0" "$d1" 2>/dev/null
}
daemon_logs() { tail -c 300 "$work/d0.log" "$work/d1.log" | tr -d '"\n'; }
# A transition across them: CUDA IPC between the daemons, then staged tagged messages.
start_daemons host:2
on_daemons=(bench transition --daemons 127.0.0.1:$port --token-file "$work/token" --model llama-3.2-1b --from tp=4,pp=1,dp=1
            --to tp=2,pp=1,dp=2 --capacity 4GiB --verify --repeat 5 --json --quiet)
daemons_ipc=$(timeout "$(limit 90)" "$here/nereus" "${on_daemons[@]}" --transport cuda 2>&1 | tail -1)
step daemons_ipc "$daemons_ipc"
daemons_staged=$(timeout "$(limit 90)" "$here/nereus" "${on_daemons[@]}" --memory cuda --transport ucx-tag 2>&1 | tail -1)
step daemons_staged "$daemons_staged"
stop_daemons
[ -n "$daemons_ipc" ] || daemons_ipc="{\"error\": \"no report; daemon logs: $(daemon_logs)\"}"
# A job whose units live in the daemons' GPU memory (--devices cuda:4): loaded, filled,
# changed plan by the controller (CUDA copies, CUDA IPC between the daemons), verified.
start_daemons cuda:4:2GiB
daemons_job=$(timeout "$(limit 90)" "$here/nereus" cluster job --coordinator 127.0.0.1:$port --token-file "$work/token" --job ppo-tiny \
              --response-len 128 --response-len-after 2048 --json 2>&1 | tail -1)
step daemons_job "$daemons_job"
stop_daemons
case "$daemons_job" in \{*) ;; *) daemons_job="{\"error\": \"$(echo "$daemons_job" | tr -d '"\n'); daemon logs: $(daemon_logs)\"}" ;; esac
# The same job with the two daemons as two machines (nereusd --machine): between them,
# two-sided builds, GPU memory staged through host memory over UCX tagged messages.
start_daemons cuda:4:2GiB other-machine
daemons_job2=$(timeout "$(limit 90)" "$here/nereus" cluster job --coordinator 127.0.0.1:$port --token-file "$work/token" --job ppo-tiny \
               --response-len 128 --response-len-after 2048 --json 2>&1 | tail -1)
step daemons_job_two_machines "$daemons_job2"
stop_daemons
case "$daemons_job2" in \{*) ;; *) daemons_job2="{\"error\": \"$(echo "$daemons_job2" | tr -d '"\n'); daemon logs: $(daemon_logs)\"}" ;; esac
rm -rf "$work"
# A framework node (gpu_member) whose units are its own GPU memory, inside cudaMalloc blocks.
member_json=$(timeout "$(limit 120)" bash "$here/member_job.sh" cuda "$here" 2>&1 | tail -1)
step member "$member_json"
member2_json=$(timeout "$(limit 120)" bash "$here/member_job.sh" cuda "$here" other-machine 2>&1 | tail -1)
step member_two_machines "$member2_json"
# The Python module (built for Python 3.12) over a job in GPU memory, computed on by this
# machine's torch (torch_units.py). First with the machine's own C++ runtime (its torch may
# need a newer one than ours), then with ours if that one is too old for the module.
if [ -d "$here/python" ]; then
  py_run() { PYTHONPATH="$here/python" LD_LIBRARY_PATH="$1" timeout "$(limit 120)" python3 "$here/torch_units.py" --bin "$here" 2>&1 | tail -1; }
  py_json=$(py_run "$here/lib${machine_libs:+:$machine_libs}")
  case "$py_json" in *GLIBCXX*|*CXXABI*) py_json=$(py_run "$LD_LIBRARY_PATH") ;; esac
else
  py_json='{"not_packed": "no Python 3.12 where the pack was built"}'
fi
step python "$py_json"
python3 - "$suite_rc" "$suite_log" "$bench_json" "$one_json" "$two_json" "$staged_json" "$nccl_one" "$nccl_two" "${NEREUS_NCCL_LIBRARY:-none found}" "$mixed_json" "$daemons_ipc" "$daemons_staged" "$py_json" "$daemons_job" "$daemons_job2" "$member_json" "$member2_json" "$fp8_json" <<'PY'
import json, sys
rc, log = int(sys.argv[1]), open(sys.argv[2]).read()
def parsed(text):
    try:
        return json.loads(text)
    except ValueError:
        return {"error": "unreadable: " + text[-300:]}
bench, one, two, staged, nccl_one, nccl_two = (parsed(t) for t in sys.argv[3:9])
ipc = {"one_process": one, "two_processes": two}
if one.get("gbps") and two.get("gbps"):
    ipc["ratio"] = two["gbps"] / one["gbps"]
nccl = {"library": sys.argv[9], "one_process": nccl_one, "two_processes": nccl_two}
mixed = parsed(sys.argv[10])
daemons = {"ipc": parsed(sys.argv[11]), "staged_ucx_tag": parsed(sys.argv[12]), "job": parsed(sys.argv[14]),
           "job_two_machines": parsed(sys.argv[15]), "member": parsed(sys.argv[16]), "member_two_machines": parsed(sys.argv[17])}
python = parsed(sys.argv[13])
fp8 = parsed(sys.argv[18])
print(json.dumps({"suite": {"rc": rc, "tail": log[-2000:]}, "bench": bench, "ipc": ipc, "staged_ucx_tag": staged, "nccl": nccl,
                  "mixed": mixed, "daemons": daemons, "python": python, "fp8_quantize_on_gpu": fp8}))
PY
rm -f "$suite_log"
