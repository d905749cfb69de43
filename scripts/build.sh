#!/usr/bin/env bash
# Configures (once) and builds a tree:
#   scripts/build.sh [DIR [meson options...]]     as built for users (default DIR: build)
#   scripts/build.sh --sanitizer [DIR [options]]  clang, ASan + UBSan, and the fuzz targets
#                                                 (default DIR: build-san; scripts/test.sh)
# Both are unity builds (-Dunity_size=8): the Asio- and JSON-heavy sources share their
# headers' instantiations, which halves a fresh build; `meson configure DIR -Dunity=off`
# for quick rebuilds of one file. No debug info by default (-Ddebug=true adds it); the
# sanitizer tree keeps line tables for its reports.
set -euo pipefail
cd "$(dirname "$0")/.."
sanitizer=0
if [ "${1:-}" = --sanitizer ]; then
  sanitizer=1
  shift
fi
dir=${1:-$([ $sanitizer = 1 ] && echo build-san || echo build)}
shift || true
if [ ! -f "$dir/build.ninja" ]; then
  common=(--unity on -Dunity_size=8 -Ddebug=false)
  if [ $sanitizer = 1 ]; then
    command -v clang++ >/dev/null || { echo "build.sh: clang++ not found (Debian packages clang and libclang-rt-dev)"; exit 1; }
    CC=clang CXX=clang++ meson setup "$dir" "${common[@]}" -Dtest_set=sanitizer -Db_sanitize=address,undefined \
      -Db_lundef=false -Doptimization=1 -Dcpp_args=-gline-tables-only -Dfuzz=true -Dcuda=disabled -Dpython=disabled \
      "$@" >/dev/null
  else
    meson setup "$dir" "${common[@]}" "$@" >/dev/null
  fi
elif [ $# -gt 0 ]; then
  meson configure "$dir" "$@" >/dev/null  # a tree configured before: these options now
fi
meson compile -C "$dir" >/dev/null
