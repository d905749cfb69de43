#pragma once
// A strided segment of a descriptor list (transport.hpp), alone so that code nvcc compiles
// (the strided-copy kernel, src/transport/strided_copy.cu) takes it without Asio.
#include <cstdint>

namespace nereus {

/// `count` runs of `bytes`: run i goes from src + i·src_stride to dst + i·dst_stride.
/// Addresses are local pointers, or a peer's virtual addresses for the remote side.
struct Segment {
  std::uint64_t src = 0;
  std::uint64_t dst = 0;
  std::uint64_t bytes = 0;
  std::uint64_t count = 1;
  std::uint64_t src_stride = 0;
  std::uint64_t dst_stride = 0;
  std::uint64_t total() const { return bytes * count; }
};

}  // namespace nereus
