// The control plane's frame decoder: the length header, then the body under the read
// limits; what decodes must encode again to a frame that decodes to the same kind.
#include <span>

#include "fuzz_target.hpp"
#include "nereus/cluster/messages.hpp"

using namespace nereus::cluster;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  fuzz::tolerate_errors([&] {
    const std::uint32_t n = frame_length(std::span<const std::uint8_t, 4>(data, 4), 1u << 16);
    if (n > size - 4) return;  // a reader would wait for the rest
    const Envelope e = decode_body(std::span<const std::uint8_t>(data + 4, n), 1u << 16);
    const Bytes again = encode_frame(e);
    const Envelope d = decode_body(std::span<const std::uint8_t>(again).subspan(4), 1u << 20);
    if (d.body.index() != e.body.index()) __builtin_trap();
  });
  return 0;
}
