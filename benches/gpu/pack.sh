#!/usr/bin/env bash
# Builds the GPU suite, the GPU bench, the nereus command and nereusd here (CUDA found under /usr/local/cuda) and gathers them,
# with every shared library they need beyond the C library and the NVIDIA driver, into one
# folder for a bare GPU machine (no Debian dev packages, no network, 64 MiB carried):
#   bash benches/gpu/pack.sh [OUT]   (default build-gpu-pack; NEREUS_BUILD=build)
# Then there: bash OUT/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${NEREUS_BUILD:-build}
out=${1:-build-gpu-pack}
[ -d "$build" ] || bash scripts/build.sh "$build"
ninja -C "$build" tests/test-gpu benches/gpu_bench src/nereus src/nereusd >/dev/null
rm -rf "$out"
mkdir -p "$out/lib"
cp "$build/tests/test-gpu" "$build/benches/gpu_bench" "$build/src/nereus" "$build/src/nereusd" "$out/"
strip "$out/nereus" "$out/nereusd" "$out/test-gpu" "$out/gpu_bench"
cp benches/gpu/run.sh "$out/"
# Libraries: all that ldd resolves, except the C library's own and the driver's (libcuda
# comes with the machine's driver and must match it).
skip='^(linux-vdso|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|ld-linux|libcuda\.so|libnvidia)'
for exe in "$out/test-gpu" "$out/gpu_bench" "$out/nereus" "$out/nereusd"; do
  ldd "$exe" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    [[ $name =~ $skip ]] && continue
    cp -L "$path" "$out/lib/$name"
  done
done
# UCX loads its transports as modules at run time; they come along too.
ucx_modules=$(ldd "$out/nereus" | awk '/libucp/ {print $3}' | xargs -r dirname)/ucx
[ -d "$ucx_modules" ] && cp -L "$ucx_modules"/*.so* "$out/lib/" 2>/dev/null || true
size=$(du -sb "$out" | cut -f1)
echo "packed $out: $(ls "$out/lib" | wc -l) libraries, $((size / 1048576)) MiB"
[ "$size" -lt $((64 * 1048576)) ] || { echo "pack.sh: $out is over 64 MiB" >&2; exit 1; }
