#!/usr/bin/env bash
# The daemons' integration test N times in a row (default 50): how often it passes, and
# how long a run takes. Not in CI (about 20 s a run); run by hand after touching the
# transport, the daemons or their tests:  benches/daemons_soak.sh [N] [BUILD_DIR]
# A failed run's log is kept in $NEREUS_SOAK_LOGS (default /tmp/nereus-soak).
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:-50}
dir=${2:-build}
logs=${NEREUS_SOAK_LOGS:-/tmp/nereus-soak}
mkdir -p "$logs"
meson compile -C "$dir" >/dev/null || { echo "soak: build of $dir failed"; exit 1; }
pass=0
fail=0
times=()
for ((i = 1; i <= n; i++)); do
  t0=$(date +%s.%N)
  if meson test -C "$dir" --no-rebuild daemons >"$logs/run-$i.out" 2>&1; then
    pass=$((pass + 1))
    rm -f "$logs/run-$i.out"
  else
    fail=$((fail + 1))
    cp "$dir/meson-logs/testlog.txt" "$logs/run-$i.testlog" 2>/dev/null
    echo "soak: run $i failed (log: $logs/run-$i.testlog)"
  fi
  times+=("$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')")
done
median=$(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
echo "soak: daemons test $n runs: $pass passed, $fail failed, median $median s a run"
[ "$fail" -eq 0 ]
