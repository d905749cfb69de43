// The FP8 quantizer (core/fp8.hpp) against a brute force written from sharding.md and the
// e4m3fn definition alone: the 256 codes' values, the nearest finite code with ties to the
// even code, saturation at ±448, NaN and inf as sharding.md decides them; and the block
// quantizer against a direct reading of per_block_cast_to_fp8 (amax over finite elements,
// floored at 1e-4, / 448; x · (1/scale) in float32).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "nereus/core/fill.hpp"
#include "nereus/core/fp8.hpp"
#include "nereus/core/fp8_layout.hpp"
#include "nereus/core/model.hpp"
#include "test_util.hpp"
#include "../src/transport/fp8_quantize.hpp"

using namespace nereus;

namespace {

/// The value of a non-negative e4m3fn code 0x00..0x7e: exponent field e (bias 7), mantissa m.
double value_of(int code) {
  const int e = code >> 3, m = code & 7;
  return e == 0 ? m * std::ldexp(1.0, -9) : (8 + m) * std::ldexp(1.0, e - 10);
}

std::uint8_t brute_encode(float x) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7f;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 448) return sign | 0x7e;
  int best = 0;
  for (int c = 1; c <= 0x7e; ++c) {
    const double d = std::fabs(value_of(c) - a), db = std::fabs(value_of(best) - a);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return sign | static_cast<std::uint8_t>(best);
}

float bf16(std::uint16_t h) {
  const std::uint32_t b = static_cast<std::uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

}  // namespace

TEST_CASE("fp8: every code decodes to its value; encoding is the nearest code, ties to even, saturating") {
  for (int q = 0; q < 256; ++q) {
    const float v = fp8::decode(static_cast<std::uint8_t>(q));
    if ((q & 0x7f) == 0x7f) {
      CHECK(std::isnan(v));
      continue;
    }
    CHECK(static_cast<double>(std::fabs(v)) == value_of(q & 0x7f));  // exactly
    CHECK(std::signbit(v) == static_cast<bool>(q & 0x80));
    CHECK(fp8::encode(v) == q);  // every finite code round-trips
  }
  CHECK(fp8::encode(448) == 0x7e);
  CHECK(fp8::encode(-1e30f) == 0xfe);
  CHECK(fp8::encode(std::numeric_limits<float>::infinity()) == 0x7e);
  CHECK(fp8::encode(-std::numeric_limits<float>::infinity()) == 0xfe);
  CHECK(fp8::encode(std::nanf("")) == 0x7f);
  CHECK(fp8::encode(-std::nanf("")) == 0xff);
  CHECK(fp8::encode(-0.0f) == 0x80);
  // Every bf16 value, and a million random float32 bit patterns, against the brute force.
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float x = bf16(static_cast<std::uint16_t>(h));
    CAPTURE(h);
    REQUIRE(fp8::encode(x) == brute_encode(x));
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  std::uniform_real_distribution<float> small(-500.0f, 500.0f);
  for (int i = 0; i < testing::cases(1000000, 200000); ++i) {
    std::uint32_t b = bits(rng);
    float x;
    std::memcpy(&x, &b, 4);
    if (i % 2) x = small(rng) * std::ldexp(1.0f, -static_cast<int>(b % 16));  // the range that matters
    CAPTURE(x);
    REQUIRE(fp8::encode(x) == brute_encode(x));
  }
}

TEST_CASE("fp8: half-precision sources load exactly") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const std::uint16_t v = static_cast<std::uint16_t>(h);
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const double mag = e == 0x1f ? (m ? std::nan("") : INFINITY) : e == 0 ? m * std::ldexp(1.0, -24) : (1024 + m) * std::ldexp(1.0, e - 25);
    const double want = (h & 0x8000) ? -mag : mag;
    const float got = fp8::float_of(fp8::half_bits(v));
    if (std::isnan(want)) CHECK(std::isnan(got));
    else CHECK(static_cast<double>(got) == want);
  }
}

TEST_CASE("fp8: blocks quantize as per_block_cast_to_fp8, edges cut, NaN and inf outside amax") {
  std::mt19937 rng(11);
  for (int round = 0; round < testing::cases(60, 20); ++round) {
    const std::int64_t rows = std::uniform_int_distribution<std::int64_t>(1, 200)(rng);
    const std::int64_t cols = std::uniform_int_distribution<std::int64_t>(1, 200)(rng);
    const std::int64_t bo = round % 3 == 0 ? 128 : std::uniform_int_distribution<std::int64_t>(1, 64)(rng);
    const std::int64_t bi = round % 3 == 0 ? 128 : std::uniform_int_distribution<std::int64_t>(1, 64)(rng);
    const std::int64_t stride = cols + std::uniform_int_distribution<std::int64_t>(0, 5)(rng);
    const fp8::Source type = round % 4 == 3 ? fp8::Source::f32 : fp8::Source::bf16;
    const std::int64_t w = type == fp8::Source::f32 ? 4 : 2;
    std::vector<std::byte> src(static_cast<std::size_t>(rows * stride * w));
    std::vector<float> value(static_cast<std::size_t>(rows * stride));
    const float magnitude = std::ldexp(1.0f, std::uniform_int_distribution<int>(-20, 12)(rng));
    std::normal_distribution<float> normal(0, magnitude);
    for (std::size_t k = 0; k < value.size(); ++k) {
      float x = normal(rng);
      const int u = std::uniform_int_distribution<int>(0, 999)(rng);
      if (u == 0) x = std::nanf("");
      else if (u == 1) x = -INFINITY;
      else if (u == 2) x = INFINITY;
      else if (u < 8) x = 0;
      if (type == fp8::Source::bf16) {
        std::uint32_t b;
        std::memcpy(&b, &x, 4);
        const std::uint16_t h = static_cast<std::uint16_t>(b >> 16);  // truncated: any bf16 will do
        std::memcpy(&src[k * 2], &h, 2);
        value[k] = bf16(h);
      } else {
        std::memcpy(&src[k * 4], &x, 4);
        value[k] = x;
      }
    }
    const std::int64_t sr = (rows + bo - 1) / bo, sc = (cols + bi - 1) / bi;
    std::vector<std::uint8_t> out(static_cast<std::size_t>(rows * cols));
    std::vector<float> scales(static_cast<std::size_t>(sr * sc));
    fp8::quantize({src.data(), type, rows, cols, stride}, bo, bi, out.data(), cols, scales.data(), sc);
    for (std::int64_t bi0 = 0; bi0 < sr; ++bi0)
      for (std::int64_t bj0 = 0; bj0 < sc; ++bj0) {
        float amax = 0;
        for (std::int64_t i = bi0 * bo; i < std::min(rows, (bi0 + 1) * bo); ++i)
          for (std::int64_t j = bj0 * bi; j < std::min(cols, (bj0 + 1) * bi); ++j) {
            const float x = value[static_cast<std::size_t>(i * stride + j)];
            if (std::isfinite(x) && std::fabs(x) > amax) amax = std::fabs(x);
          }
        const float s = (amax > 1e-4f ? amax : 1e-4f) / 448.0f;
        const float r = 1.0f / s;
        CAPTURE(round);
        REQUIRE(std::memcmp(&scales[static_cast<std::size_t>(bi0 * sc + bj0)], &s, 4) == 0);
        for (std::int64_t i = bi0 * bo; i < std::min(rows, (bi0 + 1) * bo); ++i)
          for (std::int64_t j = bj0 * bi; j < std::min(cols, (bj0 + 1) * bi); ++j) {
            const float x = value[static_cast<std::size_t>(i * stride + j)];
            REQUIRE(out[static_cast<std::size_t>(i * cols + j)] == brute_encode(std::isnan(x) ? x : x * r));
          }
      }
  }
}

TEST_CASE("fp8: an FP8 unit's verification fill is the param fill quantized block by block") {
  // tiny-deepseek-v3 (bf16, 16×16 blocks) and tiny-qwen3-moe in float32 with 5×7 blocks;
  // random boxes, aligned or not (each block is read whole from the fill either way).
  ModelConfig f32 = load_model("tiny-qwen3-moe")->config();
  f32.dtype = DType::f32;
  f32.fp8_block = {5, 7};
  const std::vector<std::shared_ptr<const ModelSpec>> models{load_model("tiny-deepseek-v3"),
                                                             std::make_shared<const ModelSpec>("f32-5x7", f32)};
  std::mt19937 rng(8);
  int boxes = 0, nonfinite_blocks = 0;
  for (const auto& m : models) {
    const ModelConfig& c = m->config();
    for (const TensorInfo& t : m->tensors()) {
      if (!quantizable(t) || std::uniform_int_distribution<int>(0, 3)(rng) != 0) continue;
      auto range = [&](std::int64_t n) {
        const std::int64_t a = std::uniform_int_distribution<std::int64_t>(0, n - 1)(rng);
        return Range{a, std::uniform_int_distribution<std::int64_t>(a + 1, n)(rng)};
      };
      Box w = Box::of_shape({t.shape[0], t.shape[1]});
      w.dims[0] = range(t.shape[0]);
      w.dims[1] = range(t.shape[1]);
      const Box sb = fp8_scale_box(c, w);
      std::vector<std::uint8_t> out(static_cast<std::size_t>(w.elements()));
      std::vector<float> scales(static_cast<std::size_t>(sb.elements()));
      fp8_fill(c, t, w, out.data(), scales.data());
      ++boxes;
      const std::uint64_t seed = fill_seed(t.name, "param");
      auto value = [&](std::int64_t i, std::int64_t j) {  // sharding.md's fill, read as the config's dtype
        const std::uint64_t v = fill_value(seed, static_cast<std::uint64_t>(i * t.shape[1] + j));
        if (c.dtype == DType::bf16) return bf16(static_cast<std::uint16_t>(v));
        const auto low = static_cast<std::uint32_t>(v);
        float x;
        std::memcpy(&x, &low, 4);
        return x;
      };
      CAPTURE(t.name);
      for (std::int64_t br = sb.dims[0].lo; br < sb.dims[0].hi; ++br)
        for (std::int64_t bc = sb.dims[1].lo; bc < sb.dims[1].hi; ++bc) {
          const std::int64_t r0 = br * c.fp8_block[0], r1 = std::min(r0 + c.fp8_block[0], t.shape[0]);
          const std::int64_t c0 = bc * c.fp8_block[1], c1 = std::min(c0 + c.fp8_block[1], t.shape[1]);
          float amax = 0;
          bool nonfinite = false;
          for (std::int64_t i = r0; i < r1; ++i)
            for (std::int64_t j = c0; j < c1; ++j) {
              const float x = value(i, j);
              if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
              else nonfinite = true;
            }
          nonfinite_blocks += nonfinite;
          const float s = std::max(amax, 1e-4f) / 448.0f, r = 1.0f / s;
          const float got = scales[static_cast<std::size_t>((br - sb.dims[0].lo) * sb.dims[1].size() + bc - sb.dims[1].lo)];
          REQUIRE(std::memcmp(&got, &s, 4) == 0);
          for (std::int64_t i = std::max(r0, w.dims[0].lo); i < std::min(r1, w.dims[0].hi); ++i)
            for (std::int64_t j = std::max(c0, w.dims[1].lo); j < std::min(c1, w.dims[1].hi); ++j) {
              const float x = value(i, j);
              REQUIRE(out[static_cast<std::size_t>((i - w.dims[0].lo) * w.dims[1].size() + j - w.dims[1].lo)] ==
                      brute_encode(std::isnan(x) ? x : x * r));
            }
        }
    }
  }
  CHECK(boxes > 10);
  CHECK(nonfinite_blocks > 0);  // the fill's random bits hold NaN and inf: their rule is exercised
}

TEST_CASE("fp8: the GPU quantizer's threads, run on the host, write the host quantizer's bytes and scales") {
  // The kernels' per-thread code (src/transport/fp8_quantize.hpp) over every thread of a
  // launch of `threads`, in order; the GPU suite runs the same on a GPU.
  std::mt19937 rng(29);
  for (int round = 0; round < testing::cases(80, 20); ++round) {
    const std::int64_t rows = std::uniform_int_distribution<std::int64_t>(1, 90)(rng);
    const std::int64_t cols = std::uniform_int_distribution<std::int64_t>(1, 90)(rng);
    const std::int64_t bo = std::uniform_int_distribution<std::int64_t>(1, 40)(rng);
    const std::int64_t bi = std::uniform_int_distribution<std::int64_t>(1, 40)(rng);
    const std::int64_t stride = cols + std::uniform_int_distribution<std::int64_t>(0, 3)(rng);
    const auto type = static_cast<fp8::Source>(round % 3);
    const std::int64_t w = type == fp8::Source::f32 ? 4 : 2;
    std::vector<unsigned char> src(static_cast<std::size_t>(rows * stride * w));
    for (auto& b : src) b = static_cast<unsigned char>(rng());  // any bits: NaN, inf, subnormals included
    const std::int64_t sr = (rows + bo - 1) / bo, sc = (cols + bi - 1) / bi;
    std::vector<std::uint8_t> want(static_cast<std::size_t>(rows * cols)), got(want.size());
    std::vector<float> want_s(static_cast<std::size_t>(sr * sc)), got_s(want_s.size(), -1.0f);
    fp8::quantize({reinterpret_cast<const std::byte*>(src.data()), type, rows, cols, stride}, bo, bi, want.data(), cols, want_s.data(), sc);
    std::vector<int> amax(static_cast<std::size_t>(sr * sc), 0);
    const detail::Fp8QuantizeArgs a = detail::fp8_quantize_args({reinterpret_cast<const std::byte*>(src.data()), type, rows, cols, stride},
                                                                bo, bi, got.data(), cols, got_s.data(), sc, amax.data());
    const std::uint64_t threads = std::uniform_int_distribution<std::uint64_t>(1, 300)(rng);
    for (std::uint64_t t = 0; t < threads; ++t) detail::fp8_amax_thread(a, t, threads);
    for (std::uint64_t t = 0; t < threads; ++t) detail::fp8_encode_thread(a, t, threads);
    CAPTURE(round);
    CHECK(got == want);
    CHECK(std::memcmp(got_s.data(), want_s.data(), got_s.size() * 4) == 0);
  }
}
