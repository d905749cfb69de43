#pragma once
// The verification fill of sharding.md: every element of every slot is a known value,
// so any shard can be checked on its own.
#include <cstdint>
#include <string_view>

namespace nereus {

constexpr std::uint64_t fnv1a64(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

constexpr std::uint64_t splitmix64(std::uint64_t x) {
  std::uint64_t z = x + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Seed of (tensor name, slot name): fnv1a64(tensor + "/" + slot).
std::uint64_t fill_seed(std::string_view tensor, std::string_view slot);

/// Value of element e (global row-major index): its low `width` bytes, little-endian,
/// are the element's bytes.
constexpr std::uint64_t fill_value(std::uint64_t seed, std::uint64_t e) { return splitmix64(seed ^ e); }

}  // namespace nereus
