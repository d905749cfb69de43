// Matching framework memory to a unit's buffers (adopted_buffer.hpp).
#include "nereus/runtime/adopted_buffer.hpp"

#include <cstdint>

#include "nereus/base/error.hpp"
#include "nereus/core/bytes.hpp"

namespace nereus {

int adopted_for(std::span<const AdoptedBuffer> adopt, std::string_view model_stage, int replica, const BufferSpec& b,
                const std::string& name) {
  for (std::size_t k = 0; k < adopt.size(); ++k) {
    const AdoptedBuffer& a = adopt[k];
    if (a.model_stage != model_stage || a.replica != replica || a.device != b.key.device || a.buffer != name ||
        a.slot != b.key.slot)
      continue;
    const std::string what = std::string(model_stage) + " " + name + "@" + std::string(to_string(b.key.slot));
    if (a.data == nullptr || a.bytes < b.bytes())
      throw Error("adopted memory for replica " + std::to_string(replica) + " " + what + " on device " +
                  std::to_string(b.key.device) + " holds " + human_bytes(a.bytes) + " but the buffer needs " +
                  human_bytes(b.bytes()));
    if (reinterpret_cast<std::uintptr_t>(a.data) % width(b.dtype) != 0)
      throw Error("adopted memory for " + what + " is not aligned to its " + std::to_string(width(b.dtype)) + "-byte elements");
    return static_cast<int>(k);
  }
  return -1;
}

std::string unmatched_adoption(const AdoptedBuffer& a) {
  return "adopt: the initial plan has no buffer '" + a.buffer + "@" + std::string(to_string(a.slot)) + "' on device " +
         std::to_string(a.device) + " in replica " + std::to_string(a.replica) + " of '" + a.model_stage + "'";
}

}  // namespace nereus
