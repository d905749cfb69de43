#pragma once
// The global id of a device (a GPU or its host-memory stand-in), shared by every layer.
#include <cstdint>

namespace nereus {

/// Global GPU (device) id.
using DeviceId = std::int32_t;

}  // namespace nereus
