#!/usr/bin/env bash
# Runs on a GPU machine from the folder benches/gpu/pack.sh made (no build): the GPU suite
# (byte-exact reshards on CUDA devices) and the GPU bench, then prints one JSON line:
#   {"suite": {"rc": 0, "tail": "..."}, "bench": {...}}
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
python3 - "$suite_rc" "$suite_log" "$bench_json" <<'PY'
import json, sys
rc, log, bench = int(sys.argv[1]), open(sys.argv[2]).read(), sys.argv[3]
try:
    bench = json.loads(bench)
except ValueError:
    bench = {"error": "unreadable: " + bench[-300:]}
print(json.dumps({"suite": {"rc": rc, "tail": log[-2000:]}, "bench": bench}))
PY
rm -f "$suite_log"
