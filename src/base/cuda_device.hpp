#pragma once
// The CUDA device backend (built when meson finds cudart): make_device() hands
// MemoryKind::cuda specs here. Internal to the base layer.
#include <memory>
#include <string>

#include "nereus/base/device.hpp"

namespace nereus::detail {

/// A device whose arena is one cudaMalloc of spec.capacity on CUDA device spec.gpu
/// (never managed memory); queues are CUDA streams, events CUDA events.
std::unique_ptr<Device> make_cuda_device(const DeviceSpec& spec);
/// "cudaErrorX (what it means)" for a cudaError_t: the CUDA code's error messages.
std::string cuda_error(int code);
/// A blocking cudaMemcpy (cudaMemcpyDefault: either side on any GPU or the host).
void cuda_copy(std::byte* dst, const std::byte* src, std::size_t n);

}  // namespace nereus::detail
