#pragma once
// Strided runs copied by one kernel (src/transport only): the cuda transport's copies
// between memory of one GPU and the nccl transport's packing into, and unpacking from,
// contiguous staging. A reshard's box is many runs (a column slab of a weight: its rows are
// a run's count); one cudaMemcpy2DAsync each costs an API call and a copy operation,
// while one launch here copies up to kStridedRunsPerLaunch runs.
//
// What a thread does is written once, below, for both compilers: nvcc builds the kernel
// from it (strided_copy.cu) and the host tests run the same code over every (block,
// thread) of a launch on host memory (tests/test_strided_copy.cpp), against a plain copy
// of each row.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "nereus/transport/segment.hpp"

struct CUstream_st;  // cudaStream_t is a CUstream_st*: no CUDA header is needed here

#ifdef __CUDACC__
#define NEREUS_HOST_DEVICE __host__ __device__
#else
#define NEREUS_HOST_DEVICE
#endif

namespace nereus::detail {

/// Runs (segments; strides unused when count is 1) per launch: they travel as the
/// kernel's parameter (48 bytes each), well under the 4 KiB every CUDA version accepts,
/// so no table is staged in GPU memory first.
inline constexpr std::size_t kStridedRunsPerLaunch = 64;
inline constexpr unsigned kStridedThreads = 256;  ///< per block
inline constexpr unsigned kStridedMaxBlocks = 1024;  ///< per run (the grid's x)

struct StridedBatch {
  Segment runs[kStridedRunsPerLaunch];
};

/// The widest access (16, 8, 4, 2 or 1 bytes) every row start and length is aligned to.
NEREUS_HOST_DEVICE inline unsigned strided_width(const Segment& r) {
  std::uint64_t bits = r.src | r.dst | r.bytes;
  if (r.count > 1) bits |= r.src_stride | r.dst_stride;
  for (unsigned w = 16; w > 1; w /= 2)
    if (bits % w == 0) return w;
  return 1;
}

/// Moves one element of `w` bytes (w from strided_width, so both sides are aligned to it).
NEREUS_HOST_DEVICE inline void strided_move(unsigned char* dst, const unsigned char* src, unsigned w) {
#ifdef __CUDA_ARCH__
  struct alignas(16) V16 {
    unsigned long long a, b;
  };
  switch (w) {
    case 16: *reinterpret_cast<V16*>(dst) = *reinterpret_cast<const V16*>(src); break;
    case 8: *reinterpret_cast<unsigned long long*>(dst) = *reinterpret_cast<const unsigned long long*>(src); break;
    case 4: *reinterpret_cast<unsigned*>(dst) = *reinterpret_cast<const unsigned*>(src); break;
    case 2: *reinterpret_cast<unsigned short*>(dst) = *reinterpret_cast<const unsigned short*>(src); break;
    default: *dst = *src;
  }
#else
  std::memcpy(dst, src, w);
#endif
}

/// Thread `thread` of the `threads` a run's launch has: elements thread, thread+threads, …
/// of the run, in row-major order, each at its row's stride on both sides.
NEREUS_HOST_DEVICE inline void strided_copy_thread(const Segment& r, std::uint64_t thread, std::uint64_t threads) {
  const unsigned w = strided_width(r);
  const std::uint64_t per_row = r.bytes / w;
  const std::uint64_t elements = per_row * r.count;
  auto* dst = reinterpret_cast<unsigned char*>(r.dst);
  const auto* src = reinterpret_cast<const unsigned char*>(r.src);
  for (std::uint64_t i = thread; i < elements; i += threads) {
    const std::uint64_t row = i / per_row, at = (i - row * per_row) * w;
    strided_move(dst + row * r.dst_stride + at, src + row * r.src_stride + at, w);
  }
}

/// One launch's shape: runs [first, first+runs) of a list, and the blocks each gets.
struct StridedLaunch {
  std::size_t first = 0, runs = 0;
  unsigned blocks = 1;
};

/// Splits `runs` into launches of at most kStridedRunsPerLaunch; each launch's blocks
/// cover its largest run at about four elements per thread, at most kStridedMaxBlocks
/// (threads then take several elements each). Pure: strided_copy.cpp.
std::vector<StridedLaunch> strided_launches(const std::vector<Segment>& runs);

/// Enqueues the launches of `runs` on `stream` (a cudaStream_t of the GPU whose memory,
/// or memory it can reach, the runs name); returns the cudaError_t of the first launch
/// that failed, else cudaSuccess (0). Built with nvcc where CUDA is (strided_copy.cu).
int launch_strided_copies(const std::vector<Segment>& runs, CUstream_st* stream);

}  // namespace nereus::detail
