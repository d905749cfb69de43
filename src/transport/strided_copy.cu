// The strided-copy kernel (strided_copy.hpp): a launch's grid is (blocks, runs); block x
// of row y copies its share of run y with the code the host tests run.
#include <cuda_runtime.h>

#include "strided_copy.hpp"

namespace nereus::detail {

namespace {

__global__ void strided_copy_kernel(StridedBatch batch) {
  const Segment& r = batch.runs[blockIdx.y];
  const std::uint64_t thread = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  strided_copy_thread(r, thread, std::uint64_t{gridDim.x} * blockDim.x);
}

}  // namespace

int launch_strided_copies(const std::vector<Segment>& runs, CUstream_st* stream) {
  for (const StridedLaunch& l : strided_launches(runs)) {
    StridedBatch batch;
    for (std::size_t i = 0; i < l.runs; ++i) batch.runs[i] = runs[l.first + i];
    strided_copy_kernel<<<dim3(l.blocks, static_cast<unsigned>(l.runs)), kStridedThreads, 0, stream>>>(batch);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace nereus::detail
