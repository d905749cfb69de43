#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite twice: once as built
# for users, once under AddressSanitizer + UndefinedBehaviorSanitizer; then each fuzz
# target for a few seconds (NEREUS_FUZZ_SECONDS, default 10).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1

passed=0
failed=0
run_suite() {  # DIR, then meson setup options
  local dir=$1
  shift
  echo "== build $dir $*"
  bash scripts/build.sh "$dir" "$@" || { echo "build of $dir failed"; failed=$((failed + 1)); return; }
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
}

run_suite build
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  LSAN_OPTIONS=suppressions=$PWD/scripts/lsan.supp \
  run_suite build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug -Dcuda=disabled

# Each fuzz target briefly (scripts/fuzz.sh SECONDS runs them longer by hand).
echo "== fuzz build-fuzz"
fuzz_log=$(mktemp)
bash scripts/fuzz.sh "${NEREUS_FUZZ_SECONDS:-10}" 2>&1 | tee "$fuzz_log"
fuzz_ok=$(awk '/^fuzz: [0-9]+ passed/ {print $2}' "$fuzz_log" | tail -1)
fuzz_fail=$(awk '/^fuzz: [0-9]+ passed/ {print $4}' "$fuzz_log" | tail -1)
passed=$((passed + ${fuzz_ok:-0}))
failed=$((failed + ${fuzz_fail:-1}))
rm -f "$fuzz_log"

echo "test.sh: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
