// The GPU quantizer's kernels (fp8_quantize.hpp): a grid of blocks over the region's
// elements, each thread running the code the host tests run.
#include <cuda_runtime.h>

#include <algorithm>

#include "fp8_quantize.hpp"

namespace nereus::detail {

namespace {

__global__ void fp8_amax_kernel(Fp8QuantizeArgs a) {
  fp8_amax_thread(a, std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x, std::uint64_t{gridDim.x} * blockDim.x);
}

__global__ void fp8_encode_kernel(Fp8QuantizeArgs a) {
  fp8_encode_thread(a, std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x, std::uint64_t{gridDim.x} * blockDim.x);
}

}  // namespace

int launch_fp8_quantize(const Fp8QuantizeArgs& a, CUstream_st* stream) {
  const auto n = static_cast<std::uint64_t>(a.rows * a.cols);
  if (n == 0) return cudaSuccess;
  const std::uint64_t blocks_needed = (n + 4 * kFp8Threads - 1) / (4 * kFp8Threads);  // about four elements a thread
  const auto grid = static_cast<unsigned>(std::min<std::uint64_t>(blocks_needed, kFp8MaxBlocks));
  const std::size_t amax_bytes =
      static_cast<std::size_t>(((a.rows + a.bo - 1) / a.bo) * ((a.cols + a.bi - 1) / a.bi)) * sizeof(int);
  if (const cudaError_t e = cudaMemsetAsync(a.amax, 0, amax_bytes, stream); e != cudaSuccess) return e;
  fp8_amax_kernel<<<grid, kFp8Threads, 0, stream>>>(a);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  fp8_encode_kernel<<<grid, kFp8Threads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace nereus::detail
