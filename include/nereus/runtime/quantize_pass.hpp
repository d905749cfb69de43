#pragma once
// The quantize pass of a transition whose bf16 sources feed FP8 targets (fp8_moves.hpp):
// the staging buffers a process needs and the pass that writes them, written once for the
// transition bench's UnitStore and for a job's weight syncs and unit builds.
#include <span>
#include <vector>

#include "nereus/base/device.hpp"
#include "nereus/runtime/fp8_moves.hpp"
#include "nereus/runtime/unit_store.hpp"

namespace nereus {

/// Sorts `tasks` by source buffer (the pass keeps each buffer's boxes on one thread) and
/// returns the staging they write on `devices`: for each source buffer read, the FP8
/// weight and scale buffers of side quantized_side(c), at the source's element offsets.
std::vector<BufferSpec> quantize_staging(const ReshardPlan& plan, std::vector<QuantizeTask>& tasks,
                                         std::span<const DeviceId> devices);

/// Runs `tasks` (sorted by quantize_staging) on the buffers `table` binds, with
/// sharding.md's quantizer (fp8.hpp) on `threads` threads; `kind` cuda: by the GPU
/// quantizer on GPU device mod `gpus` (quantize_fp8_on_gpu), the same bytes.
void run_quantize(const ModelSpec& m, std::span<const QuantizeTask> tasks, const BufferTable& table, MemoryKind kind, int gpus,
                  unsigned threads);

}  // namespace nereus
