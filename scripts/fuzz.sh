#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan + coverage) and runs each for
# SECONDS (default 10; CI runs this briefly, run it longer by hand), starting from seeds
# made of the presets, the examples and fuzz/seeds/. A finding (crash, leak, sanitizer
# report, an exception other than nereus::Error, a hang) fails the run and leaves the input
# in build-san/findings/. The targets live in the sanitizer tree (scripts/build.sh
# --sanitizer; NEREUS_FUZZ_BUILD names another).
#   scripts/fuzz.sh [SECONDS] [TARGET...]     targets: frame layout model cluster job trace
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(frame layout model cluster job trace)
dir=${NEREUS_FUZZ_BUILD:-build-san}  # the sanitizer tree of scripts/test.sh builds the targets
[ -f "$dir/build.ninja" ] || bash scripts/build.sh --sanitizer "$dir" || { echo "fuzz: build failed"; exit 1; }
ninja -C "$dir" $(for t in "${targets[@]}"; do echo "fuzz/fuzz_$t"; done) >/dev/null || { echo "fuzz: build failed"; exit 1; }

seeds() {  # TARGET DIR: fill DIR with the target's seeds
  local t=$1 d=$2
  case $t in
    frame) cp fuzz/seeds/frame/*.bin "$d"/ ;;
    layout) local i=0; while IFS= read -r line; do printf '%s' "$line" >"$d/$i"; i=$((i + 1)); done <fuzz/seeds/layout.txt ;;
    model) cp presets/models/*.json "$d"/ ;;
    cluster) cp presets/clusters/*.json "$d"/ ;;
    job) cp presets/jobs/*.json examples/plans/*.json "$d"/ ;;
    trace) head -n 20 examples/traces/growth-1024gpu.jsonl >"$d/growth"; printf '{"step": 0, "gpus": 8, "response_len_mean": 100, "link_slowdown": 1.5}\n' >"$d/one" ;;
  esac
}

mkdir -p "$dir/findings"
# One target per core at a time (NEREUS_FUZZ_JOBS, default the cores): each writes its
# verdict to a file, printed in order once all are done.
fuzz_one() {  # TARGET
  local t=$1 corpus log
  corpus=$(mktemp -d)
  seeds "$t" "$corpus"
  log="$dir/fuzz_$t.log"
  if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$dir/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
    -print_final_stats=1 -artifact_prefix="$dir/findings/$t-" "$corpus" >"$log" 2>&1; then
    echo "fuzz $t: ok, $(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}') inputs in ${secs}s \
($(grep -c . <(ls "$corpus")) in the corpus)" >"$dir/fuzz_$t.verdict"
  else
    { echo "fuzz $t: FINDING (log $log, input in $dir/findings/)"; tail -n 30 "$log"; } >"$dir/fuzz_$t.verdict"
  fi
  rm -rf "$corpus"
}
jobs_max=${NEREUS_FUZZ_JOBS:-$(nproc)}
for t in "${targets[@]}"; do
  rm -f "$dir/fuzz_$t.verdict"
  fuzz_one "$t" &
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
done
wait
passed=0
failed=0
for t in "${targets[@]}"; do
  cat "$dir/fuzz_$t.verdict" 2>/dev/null || echo "fuzz $t: FINDING (no verdict)"
  if grep -q '^fuzz [a-z]*: ok' "$dir/fuzz_$t.verdict" 2>/dev/null; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
