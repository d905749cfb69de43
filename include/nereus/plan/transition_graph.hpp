#pragma once
// The global transition graph (architecture.md, "How a transition flows"): the DAG of
// primitives that turns a job's units under plan S into its units under S*, with data
// edges, commit edges, release-before-acquire resource edges, a memory check that holds
// for every execution order the edges allow, and a critical-path cost L_tran.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "nereus/core/global_plan.hpp"
#include "nereus/plan/reshard.hpp"

namespace nereus {

/// What a node does: builds one new unit by a primitive, or frees one old unit.
enum class NodeKind : std::uint8_t {
  split,    ///< a smaller unit on some of an old unit's GPUs
  merge,    ///< a larger unit on the GPUs of several old replicas
  extend,   ///< a replica on new GPUs, copied rank by rank from one old replica
  sync,     ///< params from another model-stage of the same model (training → generation)
  reshard,  ///< anything else: shard-to-shard copies from the old units on its GPUs or a donor replica
  destroy,  ///< frees an old unit once its state is held elsewhere
};
std::string_view to_string(NodeKind k);

/// Why a node waits for another.
enum class EdgeKind : std::uint8_t {
  data,      ///< the earlier node builds a unit this one reads, or reads the unit this one frees
  commit,    ///< a model-stage's last old unit goes only after all its new units are committed
  resource,  ///< release before acquire: the earlier node frees memory this one needs
};
std::string_view to_string(EdgeKind k);

/// A unit of the transition: unit `unit` of model-stage `stage`, old (from) or new (to).
struct UnitRef {
  std::uint16_t stage = 0;
  bool target = false;
  std::uint32_t unit = 0;
  bool operator==(const UnitRef&) const = default;
};

struct Edge {
  std::uint32_t node;  ///< the node waited for
  EdgeKind kind;
};

/// One node of the graph.
struct GraphNode {
  NodeKind kind = NodeKind::reshard;
  UnitRef unit;                   ///< the unit built, or the unit freed
  std::vector<UnitRef> sources;   ///< builds: the units its bytes come from
  std::vector<Edge> after;        ///< nodes that must finish first
  std::uint64_t moved_bytes = 0;  ///< bytes over links
  std::uint64_t local_bytes = 0;  ///< bytes copied inside a device
  std::uint64_t unit_bytes = 0;   ///< bytes acquired (builds) or released (destroys), over all its GPUs
  double seconds = 0;             ///< estimated duration
  double start = 0;               ///< estimated start when every node starts as soon as its edges allow
  bool is_build() const { return kind != NodeKind::destroy; }
};

/// How one model-stage gets from its old units to its new ones, and why.
struct StageDecision {
  std::string model_stage;
  std::string strategy;       ///< "unchanged", "primitives" or "direct"
  std::string why;
  std::string common_layout;  ///< largest common sub-layout of the old and new layouts ("" if none)
  std::uint64_t moved_bytes = 0;
  std::uint64_t via_common_bytes = 0;  ///< bytes through the common sub-layout (0: not costed)
  std::uint32_t kept = 0, built = 0, destroyed = 0;
};

/// Memory each GPU may use during the transition.
struct MemoryModel {
  std::uint64_t capacity = 0;  ///< bytes per GPU; 0: unlimited
  double headroom = 0.1;       ///< kept free: usable = capacity × (1 − headroom)
  /// Working memory (activations, KV cache) a model-stage needs per GPU while it runs; a GPU
  /// reserves the largest of the stages placed on it, old plan or new.
  std::vector<std::pair<std::string, std::uint64_t>> workspace;
  std::uint64_t staging = 0;  ///< in-flight buffer a build needs per GPU (transports that stage bytes)

  std::uint64_t budget() const;
  std::uint64_t workspace_of(std::string_view model_stage) const;
};

/// What to compile: a job's units under the old plan and the new one.
struct TransitionRequest {
  const JobSpec* job = nullptr;
  std::vector<Collection> from;  ///< one per model-stage, in model_stages(job) order
  std::vector<Collection> to;    ///< the same model-stages under the new plan
  /// Per model-stage: its params are about to be replaced (its role trains before the
  /// switch), so its old units are kept or freed but never read. Empty: none.
  std::vector<bool> stale;
  MemoryModel memory;
  LinkModel links;
  /// Build every new unit from a replica on other GPUs, so old units can go before new
  /// ones arrive where memory holds only one of them. Moves more bytes; compile_transition
  /// tries it by itself when the lower-bound graph does not fit.
  bool memory_first = false;
  bool allow_memory_first = true;  ///< let compile_transition fall back to it
};

/// Memory of one GPU: before, after, and the most any execution order can reach.
struct GpuMemory {
  DeviceId device = 0;
  std::uint64_t before = 0;  ///< old units + workspace
  std::uint64_t after = 0;   ///< new units + workspace
  std::uint64_t worst = 0;   ///< bound over every order the edges allow
};

/// Whether the transition can run within the memory budget.
struct Feasibility {
  bool ok = true;
  std::string reason;  ///< when not ok: what blocks it, naming the model-stage, unit and GPU
  std::uint64_t budget = 0;
  std::uint64_t worst_bytes = 0;  ///< largest `worst` of any GPU
  DeviceId worst_device = -1;
};

struct TransitionSummary {
  std::uint64_t moved_bytes = 0;   ///< over links; equals the per-destination lower bound
  std::uint64_t local_bytes = 0;   ///< copied inside devices
  std::uint64_t target_bytes = 0;  ///< all bytes of the units built
  std::uint64_t builds = 0, destroys = 0, kept_units = 0;
  std::uint64_t data_edges = 0, commit_edges = 0, resource_edges = 0;
  double critical_path_seconds = 0;  ///< longest chain of node durations
  double link_bound_seconds = 0;     ///< busiest device's send or receive time
  double l_tran_seconds = 0;         ///< max of the two
  double plan_ms = 0;
  bool memory_first = false;  ///< built from replicas elsewhere to fit memory (above the lower bound)
};

/// The compiled graph. Nodes are listed in a topological order: the static schedule the
/// memory check was made on.
struct TransitionGraph {
  std::vector<std::string> stages;  ///< model-stage names
  std::vector<int> phase;           ///< 0 generate, 1 infer, 2 train
  std::vector<Collection> from, to;
  std::vector<std::vector<std::int32_t>> kept;  ///< per stage and new unit: the old unit kept as is, or −1
  std::vector<GraphNode> nodes;
  std::vector<StageDecision> decisions;
  std::vector<GpuMemory> memory;  ///< GPUs that hold a unit, in id order
  Feasibility feasibility;
  TransitionSummary summary;

  const Collection& collection(const UnitRef& u) const { return (u.target ? to : from)[u.stage]; }
  const Emu& emu(const UnitRef& u) const { return collection(u).units[u.unit]; }
  std::string describe(const UnitRef& u) const;  ///< "actor/train new unit 2 (GPUs 4-7)"
};

/// Compiles S → S*. Throws Error on bad input (stages that differ from the job's, a DP
/// degree that does not divide the global batch); an infeasible transition is returned
/// with feasibility.ok == false and the reason, never executed. When the lower-bound graph
/// does not fit memory, a memory-first graph is tried (summary.memory_first). In that graph
/// a model-stage stopped part-way may be left on some of its old units or on some of its
/// new ones.
TransitionGraph compile_transition(const TransitionRequest& request);

/// The transfers of one build: planned from its sources only, so the bytes it reads are
/// exactly those of the units its data edges name. Source collection i of the plan holds
/// the units `units[i]`.
struct BuildPlan {
  std::vector<std::vector<UnitRef>> units;
  ReshardPlan plan;
};
BuildPlan plan_build(const TransitionGraph& g, const GraphNode& build, const LinkModel& links);

}  // namespace nereus
