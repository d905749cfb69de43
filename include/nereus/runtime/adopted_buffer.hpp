#pragma once
// Memory the framework owns backing one buffer of a unit instead of a device arena
// (docs/embedding.md, "Framework-owned memory"): the embedded Job's initial units, and the
// units a job loads on a framework's node (cluster/member.hpp). One rule for both: an
// entry names a buffer by model-stage, replica, device, buffer name and slot; Nereus reads
// and writes it in place and never frees it.
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "nereus/runtime/unit_store.hpp"

namespace nereus {

struct AdoptedBuffer {
  std::string model_stage;
  int replica = 0;
  DeviceId device = 0;
  std::string buffer;  ///< buffer name (packing.hpp): the tensor's own name under hf packing
  Slot slot = Slot::param;
  std::byte* data = nullptr;
  std::size_t bytes = 0;  ///< at least the buffer's size
  MemoryKind kind = MemoryKind::host;  ///< the job's units' memory (JobOptions::memory)
  int gpu = 0;                         ///< GPU memory: its CUDA ordinal, the device's GPU
};

/// The entry of `adopt` that backs buffer `b` (named `name`) of replica `replica` of
/// `model_stage`, or -1 when none does. Throws Error naming the buffer when the entry's
/// memory is too small for it or misaligned for its elements.
int adopted_for(std::span<const AdoptedBuffer> adopt, std::string_view model_stage, int replica, const BufferSpec& b,
                const std::string& name);

/// The error for an entry that no buffer took.
std::string unmatched_adoption(const AdoptedBuffer& a);

}  // namespace nereus
