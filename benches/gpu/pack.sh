#!/usr/bin/env bash
# Builds the GPU suite, the GPU bench and framework node, the nereus command and nereusd here (CUDA found under /usr/local/cuda) and gathers them,
# with every shared library they need beyond the C library and the NVIDIA driver, into one
# folder for a bare GPU machine (no Debian dev packages, no network, 64 MiB carried):
#   bash benches/gpu/pack.sh [OUT]   (default build-gpu-pack; NEREUS_BUILD=build)
# Then there: bash OUT/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${NEREUS_BUILD:-build}
out=${1:-build-gpu-pack}
[ -d "$build" ] || bash scripts/build.sh "$build"
# The Python module for the GPU machine's Python (3.12; Debian's here is 3.11): built against
# another interpreter's headers (-Dpack_python, python/nereus/pack/meson.build) when one is
# here: NEREUS_PACK_PYTHON, else a python3.12 on PATH or under pyenv. Without one the pack has
# no Python module and run.sh says so. This sets the option on the build tree for good.
pack_py=${NEREUS_PACK_PYTHON:-}
if [ -z "$pack_py" ]; then
  for c in python3.12 $(ls -d "$(pyenv root 2>/dev/null || echo /nonexistent)"/versions/3.12*/bin/python3.12 2>/dev/null); do
    "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { pack_py=$(command -v "$c"); break; }
  done
fi
targets=(tests/test-gpu benches/gpu_bench benches/gpu_member src/nereus src/nereusd)
if [ -n "$pack_py" ]; then
  meson configure "$build" -Dpack_python="$pack_py" >/dev/null
  suffix=$("$pack_py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  targets+=("python/nereus/pack/_nereus$suffix")
fi
ninja -C "$build" "${targets[@]}" >/dev/null
rm -rf "$out"
mkdir -p "$out/lib"
cp "$build/tests/test-gpu" "$build/benches/gpu_bench" "$build/benches/gpu_member" "$build/src/nereus" "$build/src/nereusd" "$out/"
strip "$out/nereus" "$out/nereusd" "$out/test-gpu" "$out/gpu_bench" "$out/gpu_member"
cp benches/gpu/torch_units.py benches/gpu/member_job.sh "$out/"
exes=("$out/test-gpu" "$out/gpu_bench" "$out/gpu_member" "$out/nereus" "$out/nereusd")
if [ -n "$pack_py" ]; then
  mkdir -p "$out/python/nereus"
  cp python/nereus/__init__.py "$out/python/nereus/"
  cp "$build/python/nereus/pack/_nereus$suffix" "$out/python/nereus/"
  strip "$out/python/nereus/_nereus$suffix"
  exes+=("$out/python/nereus/_nereus$suffix")
fi
cp benches/gpu/run.sh "$out/"
# Libraries: all that ldd resolves, except the C library's own and the driver's (libcuda
# comes with the machine's driver and must match it).
# The C++ runtime goes apart, in lib/cxx: run.sh gives it to our binaries, but a Python
# there may need its own, newer one (its torch is built elsewhere).
skip='^(linux-vdso|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|ld-linux|libcuda\.so|libnvidia)'
mkdir -p "$out/lib/cxx"
for exe in "${exes[@]}"; do
  ldd "$exe" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    [[ $name =~ $skip ]] && continue
    if [[ $name =~ ^(libstdc\+\+|libgcc_s) ]]; then cp -L "$path" "$out/lib/cxx/$name"; else cp -L "$path" "$out/lib/$name"; fi
  done
done
# UCX loads its transports as modules at run time; they come along too.
ucx_modules=$(ldd "$out/nereus" | awk '/libucp/ {print $3}' | xargs -r dirname)/ucx
[ -d "$ucx_modules" ] && cp -L "$ucx_modules"/*.so* "$out/lib/" 2>/dev/null || true
size=$(du -sb "$out" | cut -f1)
echo "packed $out: $(find "$out/lib" -type f | wc -l) libraries, $((size / 1048576)) MiB, Python module: ${pack_py:-none (no Python 3.12 here)}"
[ "$size" -lt $((64 * 1048576)) ] || { echo "pack.sh: $out is over 64 MiB" >&2; exit 1; }
