#pragma once
// FP8 block quantization (sharding.md, "Per-tensor dtypes and FP8 block-scaled weights"):
// float8_e4m3fn (1 sign bit, 4 exponent bits with bias 7, 3 mantissa bits; no infinities,
// S.1111.111 is NaN; the largest finite value is 448) and the per-block scale DeepGEMM's
// and vLLM's per_block_cast_to_fp8 produce. Written once, on the host, for bytes that must
// match bit for bit: the verification fill of FP8 units (fp8_fill) and the quantize pass
// of a bf16 → FP8 transition (UnitStore::quantize) use it. Dependency-free so a CUDA
// kernel can include it for the same arithmetic.
#include <cstddef>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define NEREUS_FP8_HD __host__ __device__
#define NEREUS_FP8_LANES __host__ __device__ __forceinline__
#else
#define NEREUS_FP8_HD
// Always inlined: the host pass calls these on vector lanes from per-ISA versions of its
// entries (fp8.cpp), and a vector crossing a call compiled for another ISA would cross it
// under another ABI.
#define NEREUS_FP8_LANES [[gnu::always_inline]] inline
#endif

namespace nereus::fp8 {

inline constexpr float kMax = 448.0f;     ///< largest finite e4m3fn
inline constexpr float kAmaxFloor = 1e-4f;  ///< a block's amax is at least this

/// x (float32) as e4m3fn: rounded to nearest, ties to even, saturating at ±448; NaN keeps
/// its sign as S.1111.111, ±inf becomes ±448.
std::uint8_t encode(float x);
/// The value of an e4m3fn byte (NaN for S.1111.111).
float decode(std::uint8_t q);

/// The same bits as another type of the same size (float32 ↔ its bits, one lane or many).
template <class To, class From>
NEREUS_FP8_LANES To bits_as(const From& x) {
  static_assert(sizeof(To) == sizeof(From));
  To y;
  std::memcpy(&y, &x, sizeof y);
  return y;
}
NEREUS_FP8_HD inline std::uint32_t bits_of(float x) { return bits_as<std::uint32_t>(x); }
NEREUS_FP8_HD inline float float_of(std::uint32_t b) { return bits_as<float>(b); }

/// For a type of float32 bits U (std::uint32_t, or a vector of them in the host pass): its
/// float32 and signed counterparts of the same lanes. Specialized where vectors are made.
template <class U>
struct Bits32 {
  using f32 = float;
  using i32 = std::int32_t;
};

/// The e4m3fn code of float32 bits b, in the lanes of U (low 8 bits), without branches (so
/// a row's loop vectorizes and a GPU warp does not diverge): every case is computed and the
/// right one selected. Written once for one lane (encode_bits, the GPU kernels) and for
/// the host pass's vector lanes.
template <class U>
NEREUS_FP8_LANES U encode_lanes(const U& b) {
  using I = typename Bits32<U>::i32;
  const U sign = (b >> 24) & 0x80u;
  const U a = b & 0x7fffffffu;
  // Normal (|x| ≥ 2^-6): round the 23 mantissa bits to 3, nearest even, a carry moving into
  // the exponent; then rebias the exponent from 127 to 7 (120 steps of 8 codes).
  const U normal = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
  // Below 2^-6: multiples of 2^-9, i.e. |x|·512 rounded to the nearest even integer (the
  // product is exact; adding 2^23 leaves an ulp of 1, so the float add rounds it, fused or
  // not). 8·2^-9 is the smallest normal, code 0x08, as it should be.
  const U sub = bits_as<U>(bits_as<typename Bits32<U>::f32>(a) * 512.0f + 8388608.0f) - 0x4b000000u;
  // Signed compares (SSE2 has no unsigned ones for lanes): every |x| pattern is non-negative.
  const I m = bits_as<I>(a);
  U code = m < 0x3c800000 ? sub : normal;  // 2^-6
  code = m >= 0x43e00000 ? 0x7eu : code;   // 448 and up, ±inf: ±448
  code = m > 0x7f800000 ? 0x7fu : code;    // NaN, its sign kept
  return sign | code;
}

/// x · r for float32 bits x (lane by lane), NaN as it is (its sign kept), as the quantizer
/// scales.
template <class U>
NEREUS_FP8_LANES U scaled_lanes(const U& x, float r) {
  return bits_as<typename Bits32<U>::i32>(x & 0x7fffffffu) > 0x7f800000 ? x
                                                                         : bits_as<U>(bits_as<typename Bits32<U>::f32>(x) * r);
}

/// encode() on float32 bits.
NEREUS_FP8_HD inline std::uint8_t encode_bits(std::uint32_t b) { return static_cast<std::uint8_t>(encode_lanes(b)); }

/// IEEE half (binary16) to float32 bits.
NEREUS_FP8_HD inline std::uint32_t half_bits(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return sign | 0x7f800000u | (man << 13);  // inf, NaN
  if (exp == 0) return sign | bits_of(static_cast<float>(man) * 5.9604644775390625e-8f);  // zero, subnormal: man · 2^-24
  return sign | ((exp + 112) << 23) | (man << 13);
}

/// A block's scale_inv from its amax bits (|x| of its largest finite element): amax floored
/// at 1e-4, / 448, in float32. (Literals, not kAmaxFloor and kMax, for device code.)
NEREUS_FP8_HD inline float scale_of(std::uint32_t amax_bits) {
  const float a = float_of(amax_bits);
  return (a > 1e-4f ? a : 1e-4f) / 448.0f;
}

/// Element types a block is read from: the config's param dtype.
enum class Source : std::uint8_t { bf16, f16, f32 };

/// A row-major block region: `rows` × `cols` elements of `type` whose rows are `stride`
/// elements apart.
struct Region {
  const std::byte* data;
  Source type;
  std::int64_t rows, cols, stride;
};

/// Quantizes `region` in blocks of [bo, bi] (cut at the region's edges; blocks start at the
/// region's first row and column, which callers align to the tensor's block grid): fp8 bytes
/// row-major into `out` (rows × cols, row stride `out_stride`), and each block's scale_inv
/// into `scales` (⌈rows/bo⌉ × ⌈cols/bi⌉ float32, row stride `scale_stride`).
void quantize(const Region& region, std::int64_t bo, std::int64_t bi, std::uint8_t* out, std::int64_t out_stride,
              float* scales, std::int64_t scale_stride);

}  // namespace nereus::fp8
