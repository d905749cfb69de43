#pragma once
// The GPU quantizer (sharding.md, "FP8"; src/transport only): a region of bf16, f16 or f32
// elements in GPU memory quantized per [bo, bi] block into FP8 bytes and float32
// scale_inv, bit for bit what the host quantizer (core/fp8.hpp) writes, with its
// arithmetic (encode_bits, scaled_lanes, scale_of). Two launches over the region's
// elements: each element folds its |x| bits into its block's amax (an integer max: the
// bits of non-negative floats order as the values do, so atomicMax finds it), then each
// element encodes x·r of its block, and the element at a block's origin writes the scale.
//
// What a thread does is written once, below, for both compilers: nvcc builds the kernels
// from it (fp8_quantize.cu) and the host tests run the same code over every thread of a
// launch on host memory (tests/test_fp8.cpp), against the host quantizer.
#include <cstdint>
#include <cstring>

#include "nereus/core/fp8.hpp"

struct CUstream_st;  // cudaStream_t is a CUstream_st*: no CUDA header is needed here

namespace nereus::detail {

/// One region to quantize; pointers are GPU addresses in a launch, host ones in the tests.
struct Fp8QuantizeArgs {
  const unsigned char* src = nullptr;
  fp8::Source type = fp8::Source::bf16;
  std::int64_t rows = 0, cols = 0, stride = 0;  ///< elements; rows `stride` elements apart
  std::int64_t bo = 128, bi = 128;              ///< the block, aligned to the region's first row and column
  unsigned char* out = nullptr;                 ///< FP8 bytes, rows `out_stride` apart
  std::int64_t out_stride = 0;
  float* scales = nullptr;                      ///< ⌈rows/bo⌉ × ⌈cols/bi⌉, rows `scale_stride` apart
  std::int64_t scale_stride = 0;
  int* amax = nullptr;  ///< ⌈rows/bo⌉ · ⌈cols/bi⌉ ints of scratch, zero before the first launch
};

/// The arguments of quantizing `region` (fp8::quantize()'s) with `amax` as scratch.
inline Fp8QuantizeArgs fp8_quantize_args(const fp8::Region& region, std::int64_t bo, std::int64_t bi, std::uint8_t* out,
                                         std::int64_t out_stride, float* scales, std::int64_t scale_stride, int* amax) {
  return {reinterpret_cast<const unsigned char*>(region.data), region.type, region.rows, region.cols, region.stride, bo, bi,
          out, out_stride, scales, scale_stride, amax};
}

inline constexpr unsigned kFp8Threads = 256;      ///< per block
inline constexpr unsigned kFp8MaxBlocks = 65535;  ///< a launch's grid; threads then take several elements

NEREUS_FP8_HD inline std::uint32_t fp8_element_bits(const Fp8QuantizeArgs& a, std::int64_t i, std::int64_t j) {
  const std::int64_t w = a.type == fp8::Source::f32 ? 4 : 2;
  const unsigned char* p = a.src + (i * a.stride + j) * w;
  if (a.type == fp8::Source::f32) {
    std::uint32_t b;
    std::memcpy(&b, p, 4);
    return b;
  }
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return a.type == fp8::Source::bf16 ? static_cast<std::uint32_t>(h) << 16 : fp8::half_bits(h);
}

NEREUS_FP8_HD inline std::int64_t fp8_block_of(const Fp8QuantizeArgs& a, std::int64_t i, std::int64_t j) {
  return (i / a.bo) * ((a.cols + a.bi - 1) / a.bi) + j / a.bi;
}

/// Thread `thread` of `threads`: elements thread, thread + threads, … (row-major) folded
/// into their blocks' amax; inf and NaN do not count.
NEREUS_FP8_HD inline void fp8_amax_thread(const Fp8QuantizeArgs& a, std::uint64_t thread, std::uint64_t threads) {
  const auto n = static_cast<std::uint64_t>(a.rows * a.cols);
  for (std::uint64_t e = thread; e < n; e += threads) {
    const auto i = static_cast<std::int64_t>(e / static_cast<std::uint64_t>(a.cols));
    const auto j = static_cast<std::int64_t>(e % static_cast<std::uint64_t>(a.cols));
    const std::uint32_t x = fp8_element_bits(a, i, j) & 0x7fffffffu;
    if (x >= 0x7f800000u) continue;
    int* at = a.amax + fp8_block_of(a, i, j);
#ifdef __CUDA_ARCH__
    atomicMax(at, static_cast<int>(x));
#else
    if (static_cast<int>(x) > *at) *at = static_cast<int>(x);
#endif
  }
}

/// Thread `thread` of `threads`, once every amax is known: its elements' FP8 bytes, and the
/// scale of each block whose origin it holds.
NEREUS_FP8_HD inline void fp8_encode_thread(const Fp8QuantizeArgs& a, std::uint64_t thread, std::uint64_t threads) {
  const auto n = static_cast<std::uint64_t>(a.rows * a.cols);
  for (std::uint64_t e = thread; e < n; e += threads) {
    const auto i = static_cast<std::int64_t>(e / static_cast<std::uint64_t>(a.cols));
    const auto j = static_cast<std::int64_t>(e % static_cast<std::uint64_t>(a.cols));
    const float s = fp8::scale_of(static_cast<std::uint32_t>(a.amax[fp8_block_of(a, i, j)]));
    const float r = 1.0f / s;  // float32, as the host quantizer and the references compute it
    a.out[i * a.out_stride + j] = fp8::encode_bits(fp8::scaled_lanes(fp8_element_bits(a, i, j), r));
    if (i % a.bo == 0 && j % a.bi == 0) a.scales[(i / a.bo) * a.scale_stride + j / a.bi] = s;
  }
}

/// Enqueues the zeroing of `a.amax` and both launches on `stream` (a cudaStream_t of the
/// GPU whose memory `a` names); returns the cudaError_t of the first call that failed, else
/// cudaSuccess (0). Built with nvcc where CUDA is (fp8_quantize.cu).
int launch_fp8_quantize(const Fp8QuantizeArgs& a, CUstream_st* stream);

}  // namespace nereus::detail
