// The vector lanes below never cross a call (every helper, fp8.hpp's too, is always
// inlined into the quantize entries), so the ABI of passing them, which GCC and clang warn
// about, does not matter.
#pragma GCC diagnostic ignored "-Wpsabi"
#include "nereus/core/fp8.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace nereus::fp8 {

std::uint8_t encode(float x) { return encode_bits(bits_of(x)); }

float decode(std::uint8_t q) {
  const bool negative = q & 0x80;
  const int e = (q >> 3) & 0xf, m = q & 7;
  float v;
  if (e == 15 && m == 7) v = std::nanf("");
  else if (e == 0) v = static_cast<float>(m) / 512.0f;
  else v = std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
  return negative ? -v : v;
}

/// N lanes of each element type the quantize pass uses, and their Bits32 (fp8.hpp): one
/// specialization per N, since GCC drops a vector_size that depends on a template
/// parameter.
template <int N>
struct Lanes;
#define NEREUS_LANES(N)                                                  \
  template <>                                                            \
  struct Lanes<N> {                                                      \
    enum : int { n = N };                                                \
    using u32 = std::uint32_t __attribute__((vector_size(4 * N)));      \
    using i32 = std::int32_t __attribute__((vector_size(4 * N)));       \
    using f32 = float __attribute__((vector_size(4 * N)));              \
    using u16 = std::uint16_t __attribute__((vector_size(2 * N)));      \
    using u8 = std::uint8_t __attribute__((vector_size(N)));            \
  };                                                                     \
  template <>                                                            \
  struct Bits32<Lanes<N>::u32> {                                         \
    using f32 = Lanes<N>::f32;                                           \
    using i32 = Lanes<N>::i32;                                           \
  };
NEREUS_LANES(8)
NEREUS_LANES(16)

namespace {

// The quantize pass's loops, 8 or 16 elements at a time in GCC/Clang vector types (SSE2
// pairs at the x86-64 baseline, NEON on aarch64), with fp8.hpp's encode_lanes and
// scaled_lanes: the arithmetic encode_bits and the GPU kernels use, lane by lane.
// Each helper is inlined into the entries below (one per source type and ISA).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__AVX2__)  // (a -march that has them: one version)
#define NEREUS_SIMD_VERSIONS 1
#else
#define NEREUS_SIMD_VERSIONS 0
#endif
#define NEREUS_INLINE [[gnu::always_inline]] inline

/// V::n elements of type T from `p` (any alignment) as float32 bits.
template <Source T, class V>
NEREUS_INLINE typename V::u32 load_lanes(const std::byte* p) {
  if constexpr (T == Source::f32) {
    typename V::u32 v;
    std::memcpy(&v, p, sizeof v);
    return v;
  } else if constexpr (T == Source::bf16) {
    typename V::u16 h;
    std::memcpy(&h, p, sizeof h);
    return __builtin_convertvector(h, typename V::u32) << 16;
  } else {
    typename V::u32 v;
    for (int k = 0; k < V::n; ++k) {
      std::uint16_t h;
      std::memcpy(&h, p + 2 * k, 2);
      v[k] = half_bits(h);
    }
    return v;
  }
}

template <Source T>
NEREUS_INLINE std::uint32_t load1(const std::byte* p) {
  if constexpr (T == Source::f32) {
    std::uint32_t b;
    std::memcpy(&b, p, 4);
    return b;
  } else {
    std::uint16_t h;
    std::memcpy(&h, p, 2);
    if constexpr (T == Source::bf16) return static_cast<std::uint32_t>(h) << 16;
    else return half_bits(h);
  }
}

/// Folds elements [lo, hi) of a row into m: the largest |x| bits among finite elements. For
/// non-negative floats the bit patterns order as the values do, so an integer max finds it
/// (signed: SSE2's compares; the patterns are non-negative).
template <Source T, class V>
NEREUS_INLINE void amax_run(const std::byte* row, std::int64_t lo, std::int64_t hi, typename V::i32& m) {
  constexpr std::int64_t w = T == Source::f32 ? 4 : 2;
  std::int64_t j = lo;
  for (; j + V::n <= hi; j += V::n) {
    const auto a = reinterpret_cast<typename V::i32>(load_lanes<T, V>(row + j * w) & 0x7fffffffu);
    const typename V::i32 v = a < 0x7f800000 ? a : 0;  // inf and NaN do not count
    m = v > m ? v : m;
  }
  for (; j < hi; ++j) {
    const auto a = static_cast<std::int32_t>(load1<T>(row + j * w) & 0x7fffffffu);
    m[0] = std::max(m[0], a < 0x7f800000 ? a : 0);
  }
}

template <class V>
NEREUS_INLINE std::uint32_t lanes_max(const typename V::i32& m) {
  std::int32_t best = 0;
  for (int k = 0; k < V::n; ++k) best = std::max(best, m[k]);
  return static_cast<std::uint32_t>(best);
}

/// Elements [lo, hi) of a row, times r, encoded into to[lo, hi); NaN as it is (its sign).
/// x·r never overflows: |x| ≤ amax.
template <Source T, class V>
NEREUS_INLINE void encode_run(const std::byte* row, std::int64_t lo, std::int64_t hi, float r, std::uint8_t* to) {
  constexpr std::int64_t w = T == Source::f32 ? 4 : 2;
  std::int64_t j = lo;
  for (; j + V::n <= hi; j += V::n) {
    const auto q = __builtin_convertvector(encode_lanes(scaled_lanes(load_lanes<T, V>(row + j * w), r)), typename V::u8);
    std::memcpy(to + j, &q, sizeof q);
  }
  for (; j < hi; ++j) {
    const std::uint32_t x = load1<T>(row + j * w);
    to[j] = encode_bits(scaled_lanes(x, r));
  }
}

/// A band of bo rows at a time, read twice row by row (the way memory streams, rather than
/// block by block down the rows): every block's amax, then its bytes.
template <Source T, class V>
NEREUS_INLINE void quantize_as(const Region& region, std::int64_t bo, std::int64_t bi, std::uint8_t* out, std::int64_t out_stride,
                               float* scales, std::int64_t scale_stride) {
  constexpr std::int64_t w = T == Source::f32 ? 4 : 2;
  const std::int64_t blocks = (region.cols + bi - 1) / bi;
  std::vector<float> r(static_cast<std::size_t>(blocks));
  constexpr auto n = static_cast<std::size_t>(V::n);
  std::vector<std::int32_t> best(static_cast<std::size_t>(blocks) * n);  // a block's lanes (no over-aligned vector in a std::vector)
  for (std::int64_t i0 = 0; i0 < region.rows; i0 += bo) {
    const std::int64_t i1 = std::min(region.rows, i0 + bo);
    std::fill(best.begin(), best.end(), 0);
    for (std::int64_t i = i0; i < i1; ++i)
      for (std::int64_t b = 0; b < blocks; ++b) {
        typename V::i32 m;
        std::memcpy(&m, &best[static_cast<std::size_t>(b) * n], sizeof m);
        amax_run<T, V>(region.data + i * region.stride * w, b * bi, std::min(region.cols, (b + 1) * bi), m);
        std::memcpy(&best[static_cast<std::size_t>(b) * n], &m, sizeof m);
      }
    for (std::int64_t b = 0; b < blocks; ++b) {
      typename V::i32 m;
      std::memcpy(&m, &best[static_cast<std::size_t>(b) * n], sizeof m);
      const float s = scale_of(lanes_max<V>(m));
      r[static_cast<std::size_t>(b)] = 1.0f / s;  // float32, as the references compute it
      scales[(i0 / bo) * scale_stride + b] = s;
    }
    for (std::int64_t i = i0; i < i1; ++i)
      for (std::int64_t b = 0; b < blocks; ++b)
        encode_run<T, V>(region.data + i * region.stride * w, b * bi, std::min(region.cols, (b + 1) * bi), r[static_cast<std::size_t>(b)],
                      out + i * out_stride);
  }
}

/// Flushes subnormal floats to zero while it lives (x86: MXCSR's FTZ and DAZ). Nothing the
/// quantizer computes changes: a subnormal float32 input or product is below 2^-126, far
/// under half of e4m3's smallest step (2^-9), so it encodes as a signed zero either way,
/// and amax is found on integer bits. But x86 takes a microcode assist of ~100 cycles on
/// each subnormal operand or result, and a block whose amax is large makes most products
/// of its small elements subnormal.
class FlushSubnormals {
 public:
#if defined(__SSE__)
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~FlushSubnormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

// One entry per source type. With GCC on x86-64 (and no -march that already has them),
// a version per ISA picked at load time (function multiversioning): 16 lanes where
// AVX-512 is (1.4-1.7x the 8-lane loop here), 8 where AVX2 is (16 there fall off a
// cliff), 8 at the baseline (SSE2 pairs). Elsewhere one version: 16 lanes under a -march
// with AVX-512, else 8.
#define NEREUS_QUANTIZE_BODY(T, N)                                                                                   \
  (const Region& region, std::int64_t bo, std::int64_t bi, std::uint8_t* out, std::int64_t out_stride, float* scales, \
   std::int64_t scale_stride) {                                                                                     \
    const FlushSubnormals flush;                                                                                     \
    quantize_as<Source::T, Lanes<N>>(region, bo, bi, out, out_stride, scales, scale_stride);                         \
  }
#if NEREUS_SIMD_VERSIONS
#define NEREUS_QUANTIZE_ENTRY(T)                                                          \
  __attribute__((target("default"))) void quantize_##T NEREUS_QUANTIZE_BODY(T, 8)        \
  __attribute__((target("arch=x86-64-v3"))) void quantize_##T NEREUS_QUANTIZE_BODY(T, 8) \
  __attribute__((target("arch=x86-64-v4"))) void quantize_##T NEREUS_QUANTIZE_BODY(T, 16)
#elif defined(__AVX512F__)  // a -march with AVX-512
#define NEREUS_QUANTIZE_ENTRY(T) void quantize_##T NEREUS_QUANTIZE_BODY(T, 16)
#else
#define NEREUS_QUANTIZE_ENTRY(T) void quantize_##T NEREUS_QUANTIZE_BODY(T, 8)
#endif
NEREUS_QUANTIZE_ENTRY(bf16)
NEREUS_QUANTIZE_ENTRY(f16)
NEREUS_QUANTIZE_ENTRY(f32)

}  // namespace

void quantize(const Region& region, std::int64_t bo, std::int64_t bi, std::uint8_t* out, std::int64_t out_stride,
              float* scales, std::int64_t scale_stride) {
  switch (region.type) {
    case Source::bf16: return quantize_bf16(region, bo, bi, out, out_stride, scales, scale_stride);
    case Source::f16: return quantize_f16(region, bo, bi, out, out_stride, scales, scale_stride);
    case Source::f32: return quantize_f32(region, bo, bi, out, out_stride, scales, scale_stride);
  }
}

}  // namespace nereus::fp8
