#include "nereus/core/fp8.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace nereus::fp8 {

namespace {

std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

float float_of(std::uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

/// IEEE half (binary16) to float32.
float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return float_of(sign | 0x7f800000u | (man << 13));  // inf, NaN
  if (exp == 0) {                                                     // zero, subnormal: man · 2^-24
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return float_of(sign | ((exp + 112) << 23) | (man << 13));
}

}  // namespace

std::uint8_t encode(float x) {
  const std::uint32_t b = bits_of(x);
  const std::uint8_t sign = static_cast<std::uint8_t>((b >> 31) << 7);
  const std::uint32_t a = b & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7f;   // NaN, its sign kept
  if (a >= bits_of(kMax)) return sign | 0x7e;  // ±inf and everything from 448 up: ±448
  const int e32 = static_cast<int>(a >> 23) - 127;
  if (e32 < -6) {
    // Below the smallest normal 2^-6: multiples of 2^-9, rounded to nearest even (the
    // product is exact; 8 · 2^-9 is the smallest normal, code 0x08, as it should be).
    const float q = std::nearbyint(float_of(a) * 512.0f);
    return sign | static_cast<std::uint8_t>(q);
  }
  // Normal: keep 3 of the 23 mantissa bits, rounding the other 20 to nearest even.
  std::uint32_t m = (a & 0x7fffffu) >> 20;
  const std::uint32_t rest = a & 0xfffffu;
  int e = e32 + 7;
  if (rest > 0x80000u || (rest == 0x80000u && (m & 1u))) ++m;
  if (m == 8) m = 0, ++e;
  // Below 448 nothing rounds past it (448 = 1.110·2^8 is the largest finite code, 0x7e).
  return sign | static_cast<std::uint8_t>((e << 3) | static_cast<int>(m));
}

float decode(std::uint8_t q) {
  const bool negative = q & 0x80;
  const int e = (q >> 3) & 0xf, m = q & 7;
  float v;
  if (e == 15 && m == 7) v = std::nanf("");
  else if (e == 0) v = static_cast<float>(m) / 512.0f;
  else v = std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
  return negative ? -v : v;
}

float load(Source type, const std::byte* p) {
  switch (type) {
    case Source::bf16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return float_of(static_cast<std::uint32_t>(h) << 16);
    }
    case Source::f16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return half_to_float(h);
    }
    case Source::f32: {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
  }
  return 0;
}

namespace {

std::int64_t width_of(Source t) { return t == Source::f32 ? 4 : 2; }

}  // namespace

float scale_inv(const Region& r) {
  const std::int64_t w = width_of(r.type);
  float amax = 0;
  for (std::int64_t i = 0; i < r.rows; ++i) {
    const std::byte* row = r.data + i * r.stride * w;
    for (std::int64_t j = 0; j < r.cols; ++j) {
      const float x = load(r.type, row + j * w);
      if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
    }
  }
  return std::max(amax, kAmaxFloor) / kMax;
}

void quantize(const Region& region, std::int64_t bo, std::int64_t bi, std::uint8_t* out, std::int64_t out_stride,
              float* scales, std::int64_t scale_stride) {
  const std::int64_t w = width_of(region.type);
  for (std::int64_t i0 = 0; i0 < region.rows; i0 += bo)
    for (std::int64_t j0 = 0; j0 < region.cols; j0 += bi) {
      const Region block{region.data + (i0 * region.stride + j0) * w, region.type, std::min(bo, region.rows - i0),
                         std::min(bi, region.cols - j0), region.stride};
      const float s = scale_inv(block);
      const float r = 1.0f / s;  // float32, as the references compute it
      scales[(i0 / bo) * scale_stride + j0 / bi] = s;
      for (std::int64_t i = 0; i < block.rows; ++i)
        for (std::int64_t j = 0; j < block.cols; ++j)
          {
            const float x = load(region.type, block.data + (i * region.stride + j) * w);
            out[(i0 + i) * out_stride + j0 + j] = encode(std::isnan(x) ? x : x * r);  // NaN as it is: its sign
          }
    }
}

}  // namespace nereus::fp8
