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

namespace nereus::fp8 {

inline constexpr float kMax = 448.0f;     ///< largest finite e4m3fn
inline constexpr float kAmaxFloor = 1e-4f;  ///< a block's amax is at least this

/// x (float32) as e4m3fn: rounded to nearest, ties to even, saturating at ±448; NaN keeps
/// its sign as S.1111.111, ±inf becomes ±448.
std::uint8_t encode(float x);
/// The value of an e4m3fn byte (NaN for S.1111.111).
float decode(std::uint8_t q);

/// Element types a block is read from: the config's param dtype.
enum class Source : std::uint8_t { bf16, f16, f32 };

/// One element of `src` (little-endian) as float32.
float load(Source type, const std::byte* p);

/// A row-major block region: `rows` × `cols` elements of `type` whose rows are `stride`
/// elements apart.
struct Region {
  const std::byte* data;
  Source type;
  std::int64_t rows, cols, stride;
};

/// The block's scale_inv: amax over its finite elements (float32, floored at 1e-4) / 448.
float scale_inv(const Region& block);

/// Quantizes `region` in blocks of [bo, bi] (cut at the region's edges; blocks start at the
/// region's first row and column, which callers align to the tensor's block grid): fp8 bytes
/// row-major into `out` (rows × cols, row stride `out_stride`), and each block's scale_inv
/// into `scales` (⌈rows/bo⌉ × ⌈cols/bi⌉ float32, row stride `scale_stride`).
void quantize(const Region& region, std::int64_t bo, std::int64_t bi, std::uint8_t* out, std::int64_t out_stride,
              float* scales, std::int64_t scale_stride);

}  // namespace nereus::fp8
