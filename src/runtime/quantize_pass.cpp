#include "nereus/runtime/quantize_pass.hpp"

#include <algorithm>
#include <atomic>
#include <set>

#include "nereus/base/error.hpp"
#include "nereus/core/fp8.hpp"
#include "nereus/transport/cuda.hpp"
#include "on_threads.hpp"

namespace nereus {

std::vector<BufferSpec> quantize_staging(const ReshardPlan& plan, std::vector<QuantizeTask>& tasks,
                                         std::span<const DeviceId> devices) {
  std::stable_sort(tasks.begin(), tasks.end(), [](const QuantizeTask& a, const QuantizeTask& b) { return a.source < b.source; });
  std::vector<BufferSpec> out;
  if (tasks.empty()) return out;
  std::set<BufferKey> read;  // only the buffers read are staged
  for (const QuantizeTask& q : tasks)
    for (Slot s : {Slot::param, Slot::scale}) read.insert({quantized_side(q.source.side), q.source.device, q.source.buffer, s});
  for (std::uint32_t c = 0; c < plan.sources().size(); ++c)
    for (BufferSpec& b : collection_buffers(plan.sources()[c], quantized_side(c), devices, true))
      if (read.count(b.key)) out.push_back(std::move(b));
  return out;
}

void run_quantize(const ModelSpec& m, std::span<const QuantizeTask> tasks, const BufferTable& table, MemoryKind kind, int gpus,
                  unsigned threads) {
  if (tasks.empty()) return;
  const std::int64_t bo = m.config().fp8_block[0], bi = m.config().fp8_block[1];
  // One source buffer's boxes on one thread: two targets may read overlapping boxes of it,
  // whose common blocks would otherwise be written by two threads at once.
  std::vector<std::pair<std::size_t, std::size_t>> groups;  // [first, last) of one buffer
  for (std::size_t i = 0; i < tasks.size();) {
    std::size_t j = i + 1;
    while (j < tasks.size() && tasks[j].source == tasks[i].source) ++j;
    groups.push_back({i, j});
    i = j;
  }
  auto bound = [&](const BufferKey& k) -> const BoundBuffer& {
    const BoundBuffer* b = table.find(k);
    if (!b) throw Error("quantize pass: buffer not bound on device " + std::to_string(k.device));
    return *b;
  };
  auto run = [&](const QuantizeTask& q) {
    const TensorInfo& info = m.tensor(q.tensor);
    const BufferKey staged{quantized_side(q.source.side), q.source.device, q.source.buffer, Slot::param};
    const BufferKey scales{staged.side, staged.device, staged.buffer, Slot::scale};
    const auto* from = reinterpret_cast<const std::byte*>(bound(q.source).address);
    auto* to = reinterpret_cast<std::uint8_t*>(bound(staged).address);
    auto* sc = reinterpret_cast<float*>(bound(scales).address);
    const fp8::Region region{from + q.weight.offset * width(info.dtype), fp8_source(info.dtype), q.box.dims[0].size(),
                             q.box.dims[1].size(), q.weight.strides[0]};
    if (kind == MemoryKind::cuda)  // the same bytes, by the GPU quantizer on the GPU holding them
      quantize_fp8_on_gpu(static_cast<int>(q.source.device) % std::max(1, gpus), region, bo, bi, to + q.weight.offset,
                          q.weight.strides[0], sc + q.scales.offset, q.scales.strides[0]);
    else
      fp8::quantize(region, bo, bi, to + q.weight.offset, q.weight.strides[0], sc + q.scales.offset, q.scales.strides[0]);
  };
  std::atomic<std::size_t> next{0};
  detail::on_threads(std::min<unsigned>(std::max(1u, threads), static_cast<unsigned>(groups.size())), [&](unsigned) {
    for (std::size_t g = next++; g < groups.size(); g = next++)
      for (std::size_t i = groups[g].first; i < groups[g].second; ++i) run(tasks[i]);
  });
}

}  // namespace nereus
