#!/usr/bin/env bash
# Runs on a GPU machine from the folder benches/gpu/pack.sh made (no build): the GPU suite
# (byte-exact reshards on CUDA devices), the GPU bench, and `nereus bench transition
# --transport cuda` in one process and across two (CUDA IPC gets), verified; then prints
# one JSON line:
#   {"suite": {"rc": 0, "tail": "..."}, "bench": {...}, "ipc": {"one_process": {...},
#    "two_processes": {...}, "ratio": two-process GB/s over one-process GB/s},
#    "staged_ucx_tag": {...}}   (GPU memory across two processes over UCX tagged messages,
#    staged through page-locked host memory: the path between machines without CUDA-aware UCX)
# rc 77: no CUDA device was found.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULE_DIR="$here/lib" UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
suite_log=$(mktemp)
timeout 300 "$here/test-gpu" > "$suite_log" 2>&1
suite_rc=$?
bench_json=$(timeout 300 "$here/gpu_bench" "$@" 2>/dev/null | tail -1)
[ -n "$bench_json" ] || bench_json='{"error": "gpu_bench printed nothing"}'
# The same reshard through the product's bench: in one process, and across two (IPC).
reshard=(bench transition --model llama-3.2-1b --from tp=4,pp=1,dp=1 --to tp=2,pp=1,dp=2 --transport cuda --verify
         --repeat 5 --json --quiet)
one_json=$(timeout 120 "$here/nereus" "${reshard[@]}" 2>&1 | tail -1)
two_json=$(timeout 120 "$here/nereus" "${reshard[@]}" --procs 2 2>&1 | tail -1)
staged=(bench transition --model llama-3.2-1b --from tp=4,pp=1,dp=1 --to tp=2,pp=1,dp=2 --memory cuda --transport ucx-tag
        --procs 2 --verify --repeat 5 --json --quiet)
staged_json=$(timeout 120 "$here/nereus" "${staged[@]}" 2>&1 | tail -1)
python3 - "$suite_rc" "$suite_log" "$bench_json" "$one_json" "$two_json" "$staged_json" <<'PY'
import json, sys
rc, log = int(sys.argv[1]), open(sys.argv[2]).read()
def parsed(text):
    try:
        return json.loads(text)
    except ValueError:
        return {"error": "unreadable: " + text[-300:]}
bench, one, two, staged = (parsed(t) for t in sys.argv[3:7])
ipc = {"one_process": one, "two_processes": two}
if one.get("gbps") and two.get("gbps"):
    ipc["ratio"] = two["gbps"] / one["gbps"]
print(json.dumps({"suite": {"rc": rc, "tail": log[-2000:]}, "bench": bench, "ipc": ipc, "staged_ucx_tag": staged}))
PY
rm -f "$suite_log"
