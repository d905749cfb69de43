// CUDA IPC's bookkeeping without a GPU (transport/cuda_ipc.hpp): keys of regions inside
// allocations, each allocation mapped once however many regions it holds, gets checked
// against the region they read, and mappings closed when a peer restarts or the table goes.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>

#include "../src/transport/cuda_ipc.hpp"

using namespace nereus;
using detail::IpcKey;
using detail::IpcRegions;

namespace {

IpcKey key(std::uint32_t pid, std::uint64_t allocation, std::uint64_t base, std::uint64_t size) {
  IpcKey k;
  k.pid = pid;
  k.allocation = allocation;
  k.base = base;
  k.size = size;
  for (std::size_t i = 0; i < k.handle.size(); ++i) k.handle[i] = static_cast<std::byte>(allocation + i);
  return k;
}

/// Maps each allocation at a made-up address of its own, as cudaIpcOpenMemHandle would,
/// and counts what is open.
struct FakeDriver {
  std::map<std::byte*, std::uint64_t> open;  // mapped here → the allocation's base there
  int opens = 0, closes = 0;
  bool fail = false;
  std::uintptr_t next = 0x7000'0000'0000;

  IpcRegions table() {
    return IpcRegions(
        [this](const IpcKey& k, std::byte*& mapped) {
          if (fail) return Status{StatusCode::io_error, "cudaIpcOpenMemHandle failed"};
          for (std::size_t i = 0; i < k.handle.size(); ++i)  // the handle came through whole
            if (k.handle[i] != static_cast<std::byte>(k.allocation + i)) return Status{StatusCode::invalid, "bad handle"};
          mapped = reinterpret_cast<std::byte*>(next);
          next += 1ull << 32;
          open[mapped] = k.allocation;
          ++opens;
          return Status::ok();
        },
        [this](std::byte* mapped) {
          CHECK(open.erase(mapped) == 1);
          ++closes;
        });
  }
};

constexpr std::uint32_t kSelf = 100, kPeerPid = 200;

}  // namespace

TEST_CASE("cuda IPC keys: a region and its allocation's handle, and back; anything else is no key") {
  const IpcKey k = key(kPeerPid, 0x1000, 0x1400, 256);
  const std::vector<std::byte> bytes = k.encode();
  const std::optional<IpcKey> back = IpcKey::decode(bytes);
  REQUIRE(back);
  CHECK(back->pid == kPeerPid);
  CHECK(back->allocation == 0x1000);
  CHECK(back->base == 0x1400);
  CHECK(back->size == 256);
  CHECK(back->handle == k.handle);
  CHECK_FALSE(IpcKey::decode(std::span(bytes).first(bytes.size() - 1)));
  std::vector<std::byte> other = bytes;
  other[0] ^= std::byte{1};  // not the magic
  CHECK_FALSE(IpcKey::decode(other));
  CHECK_FALSE(IpcKey::decode(key(kPeerPid, 0x2000, 0x1000, 16).encode()));  // the region before its allocation
}

TEST_CASE("cuda IPC regions: each allocation mapped once, every get checked against the region it reads") {
  FakeDriver driver;
  {
    IpcRegions t = driver.table();
    // A peer's arena (a whole allocation) and two tensors in one block of another allocation.
    REQUIRE(t.add(1, 4, key(kPeerPid, 0x10000, 0x10000, 0x1000), kSelf));
    REQUIRE(t.add(1, 4, key(kPeerPid, 0x80000, 0x80100, 0x100), kSelf));
    REQUIRE(t.add(1, 4, key(kPeerPid, 0x80000, 0x80400, 0x200), kSelf));
    CHECK(driver.opens == 2);
    CHECK(t.mapped() == 2);
    CHECK(t.knows(1, 4));
    CHECK_FALSE(t.knows(1, 5));
    CHECK_FALSE(t.knows(2, 4));

    auto here = [&](std::uint64_t src, std::uint64_t bytes) { return t.translate(1, 4, src, bytes); };
    std::byte* block = nullptr;
    for (auto& [mapped, base] : driver.open)
      if (base == 0x80000) block = mapped;
    REQUIRE(block);
    CHECK(here(0x80400, 0x200) == reinterpret_cast<std::uint64_t>(block) + 0x400);  // same offset in the mapping
    CHECK(here(0x80180, 0x80) == reinterpret_cast<std::uint64_t>(block) + 0x180);
    CHECK_FALSE(here(0x80180, 0x81));   // one byte past its region
    CHECK_FALSE(here(0x80200, 0x10));   // inside the allocation, in no region: the framework's other memory
    CHECK_FALSE(here(0x800ff, 2));      // starts before the region
    CHECK_FALSE(here(0x10fff, ~0ull));  // a length that would wrap
    CHECK(here(0x10fff, 1));
    CHECK_FALSE(t.translate(1, 5, 0x10000, 1));  // the same addresses on another device

    // The same region again (the peer registered it anew): replaced, still mapped once.
    REQUIRE(t.add(1, 4, key(kPeerPid, 0x80000, 0x80400, 0x100), kSelf));
    CHECK(driver.opens == 2);
    CHECK_FALSE(here(0x80400, 0x200));  // its new, smaller bounds
    CHECK(here(0x80400, 0x100));

    // The peer restarted: its new process's region replaces every region of the old one,
    // whose mappings close.
    REQUIRE(t.add(1, 4, key(kPeerPid + 1, 0x10000, 0x10000, 0x1000), kSelf));
    CHECK(driver.closes == 2);
    CHECK(driver.opens == 3);
    CHECK_FALSE(here(0x80400, 0x100));

    // A region of this very process is used in place: nothing opened.
    REQUIRE(t.add(0, 0, key(kSelf, 0x500000, 0x500000, 64), kSelf));
    CHECK(t.translate(0, 0, 0x500010, 16) == 0x500010);
    CHECK(driver.opens == 3);

    // A handle that does not open: an error, and nothing is known of the device.
    driver.fail = true;
    const Status st = t.add(2, 0, key(kPeerPid, 0x900000, 0x900000, 64), kSelf);
    CHECK(st.code() == StatusCode::io_error);
    CHECK_FALSE(t.knows(2, 0));
    CHECK(t.mapped() == 1);
  }
  CHECK(driver.open.empty());  // the table closed what was left
  CHECK(driver.opens == driver.closes);
}

TEST_CASE("cuda IPC regions: translation agrees with a brute-force search of the regions (random)") {
  std::mt19937_64 rng(17);
  for (int round = 0; round < 50; ++round) {
    FakeDriver driver;
    IpcRegions t = driver.table();
    // Regions in a few allocations of 64 KiB, as tensors in caching-allocator blocks.
    struct R {
      std::uint64_t allocation, base, size;
    };
    std::vector<R> regions;
    for (std::uint64_t a = 0; a < 3; ++a) {
      const std::uint64_t allocation = 0x100000 * (a + 1);
      std::uint64_t at = allocation + rng() % 64;
      while (true) {
        const std::uint64_t size = 1 + rng() % 4096;
        if (at + size > allocation + 0x10000) break;
        if (rng() % 3) regions.push_back({allocation, at, size});
        at += size + rng() % 256;
      }
    }
    // Some views inside a region (overlapping it: another base, same allocation), and the
    // regions added in any order.
    for (std::size_t i = 0, n = regions.size(); i < n; ++i)
      if (regions[i].size > 2 && rng() % 4 == 0) {
        const std::uint64_t off = 1 + rng() % (regions[i].size - 1);
        regions.push_back({regions[i].allocation, regions[i].base + off, 1 + rng() % (regions[i].size - off)});
      }
    std::shuffle(regions.begin(), regions.end(), rng);
    for (const R& r : regions) REQUIRE(t.add(3, 1, key(kPeerPid, r.allocation, r.base, r.size), kSelf));
    CHECK(driver.opens == 3);
    std::map<std::uint64_t, std::uint64_t> mapped_at;  // allocation → where it is mapped
    for (auto& [mapped, base] : driver.open) mapped_at[base] = reinterpret_cast<std::uint64_t>(mapped);
    int hits = 0;
    for (int q = 0; q < 400; ++q) {
      // In any of the three allocations, and a little past their ends.
      const std::uint64_t src = 0x100000 * (1 + rng() % 3) + rng() % 0x10400, bytes = 1 + rng() % 512;
      std::optional<std::uint64_t> want;
      for (const R& r : regions)
        if (src >= r.base && src + bytes <= r.base + r.size) want = mapped_at[r.allocation] + (src - r.allocation);
      CHECK(t.translate(3, 1, src, bytes) == want);
      hits += want.has_value();
    }
    CHECK(hits > 50);  // the queries land in regions, not only beside them
  }
}
