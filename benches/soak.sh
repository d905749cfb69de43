#!/usr/bin/env bash
# No crash on peer death, under load: CYCLES (default 50) of start three daemons, run a
# job of three steps across them, SIGKILL or SIGSTOP node 1 or 2 at a random moment,
# recover, verify (benches/soak.py says how each cycle is judged). Under ASan + UBSan by
# default (the build-san tree scripts/test.sh builds); NEREUS_BUILD=DIR soaks another
# build, NEREUS_SOAK_SEED picks the random moments, NEREUS_SOAK_LOGS=DIR keeps the logs of
# cycles that failed, NEREUS_SOAK_TRANSPORT=ucx runs the job's builds as gets (default
# ucx-tag, two-sided, as cluster job's default). Not in CI. Ends with one JSON line: cycles, crashes, hangs, verified
# (cycles), lost_bytes, misses (signals after the job's end), detect_seconds_median,
# detect_seconds_max, the median per signal, phases (where the job noticed each loss),
# stuck_survivors (survivors that held a job part left behind when stopped),
# recover_seconds_median.
set -uo pipefail
cd "$(dirname "$0")/.."
cycles=${1:-50}
dir=${NEREUS_BUILD:-build-san}
if [ ! -d "$dir" ]; then
  bash scripts/build.sh "$dir" -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug >/dev/null ||
    { echo "soak: build of $dir failed" >&2; exit 1; }
fi
meson compile -C "$dir" src/nereus:executable src/nereusd:executable >/dev/null || { echo "soak: build of $dir failed" >&2; exit 1; }
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/scripts/lsan.supp}
exec /usr/bin/python3 benches/soak.py "$dir" "$cycles" --seed "${NEREUS_SOAK_SEED:-1}" --keep-logs "${NEREUS_SOAK_LOGS:-}" \
  --transport "${NEREUS_SOAK_TRANSPORT:-ucx-tag}"
