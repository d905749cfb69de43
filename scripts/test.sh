#!/usr/bin/env bash
# Installs what is missing, builds two trees and runs every test once, in one of them:
#   build      as built for users (-Dtest_set=release): the Python module and the examples,
#              the CLI, install, the benches' smoke versions;
#   build-san  clang with AddressSanitizer + UndefinedBehaviorSanitizer
#              (-Dtest_set=sanitizer): the C++ unit and property tests, and the daemons and
#              UCX across processes;
# then each fuzz target, built in build-san, for a few seconds (NEREUS_FUZZ_SECONDS,
# default 10). Prints how long each part took.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
bash scripts/setup.sh || exit 1

passed=0
failed=0
timing=()
run_suite() {  # DIR, then build.sh arguments
  local dir=$1
  shift
  local t0=$SECONDS
  echo "== build $dir"
  bash scripts/build.sh "$@" || { echo "build of $dir failed"; failed=$((failed + 1)); return; }
  timing+=("build $dir $((SECONDS - t0)) s")
  t0=$SECONDS
  echo "== test $dir"
  local log
  log=$(mktemp)
  meson test -C "$dir" --no-rebuild --print-errorlogs --suite unit --suite cli --suite smoke --suite integration \
    --num-processes 2 2>&1 | tee "$log"
  local ok fail
  ok=$(awk '/^Ok:/ {print $2}' "$log" | tail -1)
  fail=$(awk '/^(Fail|Timeout|Unexpected Pass):/ {s += $NF} END {print s + 0}' "$log")
  passed=$((passed + ${ok:-0}))
  failed=$((failed + ${fail:-0}))
  [ -n "$ok" ] || failed=$((failed + 1))
  rm -f "$log"
  timing+=("test $dir $((SECONDS - t0)) s")
}

run_suite build build -Dtest_set=release
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  LSAN_OPTIONS=suppressions=$PWD/scripts/lsan.supp \
  run_suite build-san --sanitizer build-san

# Each fuzz target briefly (scripts/fuzz.sh SECONDS runs them longer by hand).
echo "== fuzz build-san"
t0=$SECONDS
fuzz_log=$(mktemp)
bash scripts/fuzz.sh "${NEREUS_FUZZ_SECONDS:-10}" 2>&1 | tee "$fuzz_log"
fuzz_ok=$(awk '/^fuzz: [0-9]+ passed/ {print $2}' "$fuzz_log" | tail -1)
fuzz_fail=$(awk '/^fuzz: [0-9]+ passed/ {print $4}' "$fuzz_log" | tail -1)
passed=$((passed + ${fuzz_ok:-0}))
failed=$((failed + ${fuzz_fail:-1}))
rm -f "$fuzz_log"
timing+=("fuzz $((SECONDS - t0)) s")

echo "test.sh: times: ${timing[*]/%/;} total $((SECONDS - start)) s"
echo "test.sh: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
