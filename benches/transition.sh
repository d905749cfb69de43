#!/usr/bin/env bash
# Transition throughput against this machine's own baselines, measured in one run:
#   local transport vs memcpy (the bench measures memcpy itself),
#   ucx --procs 2 and --procs 4 (RMA gets) vs `ucx_perftest -t ucp_get` at 64 MiB, the same
#   operation; `-t tag_bw` as a second reference.
#   ucx-tag --procs 2 and 4 (two-sided tagged send/recv) vs `ucx_perftest -t tag_bw`, the
#   same operation.
#   with --peer: the torch.distributed (gloo) all-gather reshard of benches/peers/ too.
# usage: benches/transition.sh [--smoke] [--peer]   (NEREUS=path/to/nereus to override)
set -euo pipefail
cd "$(dirname "$0")/.."
nereus=${NEREUS:-build/src/nereus}
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}  # stay on loopback
smoke=false; peer=false
for a in "$@"; do
  case $a in --smoke) smoke=true ;; --peer) peer=true ;; *) echo "unknown option $a" >&2; exit 2 ;; esac
done
if $smoke; then
  model=tiny-llama; repeat=2; perf_n=5
else
  model=llama-3.2-1b; repeat=5; perf_n=50
fi
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read())['$1'])"; }

perftest() {  # TEST: prints GB/s (10^9 B/s) of ucx_perftest -t TEST at 64 MiB
  local test=$1
  local port=$((20000 + RANDOM % 20000))
  ucx_perftest -t "$test" -s 67108864 -n "$perf_n" -p "$port" >/dev/null 2>&1 &
  local server=$!
  sleep 1
  local line
  line=$(ucx_perftest 127.0.0.1 -t "$test" -s 67108864 -n "$perf_n" -p "$port" 2>/dev/null | grep '^Final:' || true)
  wait "$server" || true
  # Final: iterations, latency 50%, avg, overall; bandwidth (MB/s = 2^20 B/s) avg, overall; msg rate.
  echo "$line" | awk '{printf "%.3f\n", $7 * 1048576 / 1e9}'
}

echo "model $model, repeat $repeat"
printf '%-34s %10s %10s %10s %8s\n' case seconds moved_GBps copy_GBps ratio
for spec in "tp=4,pp=1,dp=1 tp=2,pp=1,dp=2" "tp=2,pp=1,dp=2 tp=4,pp=1,dp=1"; do
  set -- $spec
  j=$($nereus bench transition --model $model --from "$1" --to "$2" --repeat $repeat --json)
  printf '%-34s %10.4f %10.2f %10.2f %8.2f  (memcpy %.2f GB/s)\n' "local $1 -> $2" \
    "$(echo "$j" | field seconds_median)" "$(echo "$j" | field gbps)" "$(echo "$j" | field copy_gbps)" \
    "$(echo "$j" | field ratio_to_memcpy)" "$(echo "$j" | field memcpy_gbps)"
done
pt=$(perftest ucp_get)
tag=$(perftest tag_bw)
echo "ucx_perftest ucp_get 64 MiB: $pt GB/s (tag_bw: $tag GB/s)"
for procs in 2 4; do
  j=$($nereus bench transition --model $model --from tp=4,pp=1,dp=1 --to tp=2,pp=1,dp=2 --transport ucx --procs $procs --repeat $repeat --json)
  moved=$(echo "$j" | field gbps)
  copy=$(echo "$j" | field copy_gbps)
  printf '%-34s %10.4f %10.2f %10.2f %8.2f  (moved / ucp_get)\n' "ucx --procs $procs" \
    "$(echo "$j" | field seconds_median)" "$moved" "$copy" "$(python3 -c "print($moved / $pt if $pt > 0 else 0)")"
done
for procs in 2 4; do
  j=$($nereus bench transition --model $model --from tp=4,pp=1,dp=1 --to tp=2,pp=1,dp=2 --transport ucx-tag --procs $procs --repeat $repeat --json)
  moved=$(echo "$j" | field gbps)
  copy=$(echo "$j" | field copy_gbps)
  printf '%-34s %10.4f %10.2f %10.2f %8.2f  (moved / tag_bw)\n' "ucx-tag --procs $procs" \
    "$(echo "$j" | field seconds_median)" "$moved" "$copy" "$(python3 -c "print($moved / $tag if $tag > 0 else 0)")"
done
if $peer; then
  p=$(/usr/bin/python3 benches/peers/torch_gloo_reshard.py --nereus "$nereus" --model $model --from-tp 4 --to-tp 2 --repeat 3)
  ps=$(echo "$p" | field seconds_median)
  ours=$($nereus bench transition --model $model --from tp=4,pp=1,dp=1 --to tp=2,pp=1,dp=2 --transport ucx --procs 4 --repeat $repeat --json | field seconds_median)
  printf 'torch gloo all-gather + slice, 4 procs: %.3f s; nereus ucx --procs 4: %.3f s; speed-up %.1fx\n' "$ps" "$ours" \
    "$(python3 -c "print($ps / $ours)")"
fi
