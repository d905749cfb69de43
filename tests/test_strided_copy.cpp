// The strided-copy kernel's code without a GPU (transport/strided_copy.hpp): every thread
// of every launch the kernel would get runs here on host memory, and what lands is
// compared with a plain copy of each row, gaps between rows left untouched.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "../src/transport/strided_copy.hpp"

using namespace nereus;
using namespace nereus::detail;

namespace {

/// Runs the launches of `runs` as the GPU would: every (block, thread) of each.
void emulate(const std::vector<Segment>& runs) {
  for (const StridedLaunch& l : strided_launches(runs))
    for (std::size_t y = 0; y < l.runs; ++y) {
      const std::uint64_t threads = std::uint64_t{l.blocks} * kStridedThreads;
      for (std::uint64_t t = 0; t < threads; ++t) strided_copy_thread(runs[l.first + y], t, threads);
    }
}

std::uint64_t addr(std::vector<unsigned char>& v, std::uint64_t at) { return reinterpret_cast<std::uint64_t>(v.data() + at); }

}  // namespace

TEST_CASE("strided copy: the access width is the alignment every row shares") {
  CHECK(strided_width({0x1000, 0x2000, 64, 4, 128, 256}) == 16);
  CHECK(strided_width({0x1008, 0x2000, 64, 4, 128, 256}) == 8);
  CHECK(strided_width({0x1000, 0x2000, 64, 4, 130, 256}) == 2);
  CHECK(strided_width({0x1000, 0x2000, 6, 1, 0, 0}) == 2);
  CHECK(strided_width({0x1000, 0x2000, 64, 1, 3, 5}) == 16);  // one row: strides unused
  CHECK(strided_width({0x1001, 0x2000, 64, 2, 64, 64}) == 1);
}

TEST_CASE("strided copy: launches hold at most 64 runs, in order, with enough blocks") {
  std::vector<Segment> runs(150);
  for (std::size_t i = 0; i < runs.size(); ++i) runs[i] = {0, 0, 16 * (i + 1), i + 1, 4096, 4096};
  runs[70].bytes = std::uint64_t{1} << 30;  // 64 Mi elements: capped blocks
  const auto launches = strided_launches(runs);
  REQUIRE(launches.size() == 3);
  std::size_t next = 0;
  for (const StridedLaunch& l : launches) {
    CHECK(l.first == next);
    CHECK(l.runs >= 1);
    CHECK(l.runs <= kStridedRunsPerLaunch);
    CHECK(l.blocks >= 1);
    CHECK(l.blocks <= kStridedMaxBlocks);
    next += l.runs;
  }
  CHECK(next == runs.size());
  CHECK(launches[1].blocks == kStridedMaxBlocks);
  CHECK(launches[0].blocks == (64 * 64 + 1023) / 1024);  // largest: run 63, 64 rows of 64 elements
  CHECK(strided_launches({}).empty());
}

TEST_CASE("strided copy: every launch's threads copy exactly the runs' rows (brute force)") {
  std::mt19937_64 rng(20261206);
  auto pick = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
  for (int layout = 0; layout < 30; ++layout) {
    const std::size_t n = pick(1, 150);  // past one launch's 64 runs
    std::vector<unsigned char> src(1 << 20), dst(1 << 21, 0), want(1 << 21, 0);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(rng());
    std::vector<Segment> runs;
    std::uint64_t dst_at = 0;
    for (std::size_t r = 0; r < n; ++r) {
      // Alignments from 1 to 16 bytes, rows up to 300 bytes, gaps between rows on either side.
      const std::uint64_t align = std::uint64_t{1} << pick(0, 4);
      const std::uint64_t bytes = align * pick(1, 300 / align), count = pick(1, 12);
      const std::uint64_t src_stride = bytes + align * pick(0, 8), dst_stride = bytes + align * pick(0, 8);
      const std::uint64_t src_at = align * pick(0, (src.size() - count * src_stride) / align);
      dst_at = (dst_at + align - 1) / align * align + pick(0, 3) * align;
      REQUIRE(dst_at + count * dst_stride <= dst.size());
      runs.push_back({addr(src, src_at), addr(dst, dst_at), bytes, count, src_stride, dst_stride});
      for (std::uint64_t row = 0; row < count; ++row)
        std::memcpy(want.data() + dst_at + row * dst_stride, src.data() + src_at + row * src_stride, bytes);
      dst_at += count * dst_stride;
    }
    emulate(runs);
    REQUIRE(dst == want);
  }
}

TEST_CASE("strided copy: threads each take several elements of a run larger than the grid") {
  // 1-byte alignment, 3 MiB: 3 Mi elements over 1024 × 256 threads, 12 each.
  std::vector<unsigned char> src(3 << 20), dst(4 << 20, 0), want(4 << 20, 0);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 3);
  const Segment run{addr(src, 1), addr(dst, 3), 1023, 3000, 1025, 1027};
  for (std::uint64_t row = 0; row < run.count; ++row) std::memcpy(want.data() + 3 + row * 1027, src.data() + 1 + row * 1025, 1023);
  REQUIRE(strided_launches({run}).front().blocks == kStridedMaxBlocks);
  emulate({run});
  CHECK(dst == want);
}
