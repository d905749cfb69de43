#pragma once
// Byte sizes as people write and read them.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace nereus {

/// Parses "2GiB", "512MiB", "1000000" (bytes), "1.5GB"; throws Error naming the text.
std::size_t parse_capacity(std::string_view text);

/// "56.21 GB" (1 GB = 10^9 B), "3.20 MB", "512 B".
std::string human_bytes(std::uint64_t bytes);

}  // namespace nereus
