#pragma once
// The framework's side of a job's steps on one node (`nereus cluster job --node-steps`).
// A node whose daemon runs inside a framework process (cluster/member.hpp) hands each
// step the coordinator sends to its StepHost with views of the units it holds; the
// framework computes on them and answers with what it measured, which the coordinator's
// controller calibrates from. A daemon without a host answers every step at once.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "nereus/cluster/messages.hpp"
#include "nereus/core/emu.hpp"
#include "nereus/core/job.hpp"
#include "nereus/runtime/unit_store.hpp"

namespace nereus::cluster {

/// One unit of the job as far as it lives on this node: its buffers on this node's
/// devices (sharding.md packing), in the daemon's arenas or the framework's adopted memory.
struct NodeUnit {
  std::uint32_t id = 0;          ///< job-wide, given by the coordinator
  std::string model_stage;
  int replica = 0;               ///< index among the model-stage's units (its DP rank)
  Emu emu;                       ///< the whole unit (global device ids)
  std::vector<BufferSpec> buffers;
  std::vector<std::span<std::byte>> memory;  ///< one per buffer
  /// Where `memory` is: host memory, or GPU memory (the daemon's devices are cuda ones).
  MemoryKind kind = MemoryKind::host;
  std::vector<int> gpu;          ///< one per buffer: its device's CUDA ordinal (0 for host memory)
};

/// Which work a step is: the whole step (sync jobs), or one stream of an async job —
/// generation on the generation model-stages' units, or the inference and training
/// phases on the others (docs/cluster.md, "Async jobs across nodes").
enum class StepStream { whole = 0, generation = 1, training = 2 };
const char* to_string(StepStream s);

/// A step the coordinator asks this node to run.
struct NodeStep {
  std::int64_t step = 0;
  double response_len = 0;                  ///< the mean response length the coordinator expects
  std::shared_ptr<const JobSpec> job;
  std::map<std::string, int> replicas;      ///< each model-stage's unit count (its DP degree)
  std::vector<NodeUnit> units;              ///< the current units with buffers on this node (of the stream)
  StepStream stream = StepStream::whole;
  /// Of a generation step: the weight version its units hold (0: the loaded weights; k:
  /// training step k's); of a training step: the version it trains from (k − 1).
  std::int64_t weight_version = 0;
};

class StepHost {
 public:
  virtual ~StepHost() = default;
  /// Called on the daemon's event loop. `done` must be called once, from any thread; the
  /// units' memory stays the step's until then (no transition runs during a step). In an
  /// async job a node may hold one step of each stream at once, on disjoint units.
  virtual void step(NodeStep s, std::function<void(StepDone)> done) = 0;
  /// The job on this node ended (finished, or the coordinator went away): a step not yet
  /// answered never will be, and its units' memory is released.
  virtual void closed() = 0;
};

}  // namespace nereus::cluster
