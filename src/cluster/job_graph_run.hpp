#pragma once
// The coordinator's side of a job across daemons (src/cluster only): sessions to the
// nodes with concurrent requests, the job's units and where their buffers live, and the
// execution of one global transition graph over them (job_graph_run.cpp).
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "nereus/cluster/channel.hpp"
#include "nereus/cluster/step_host.hpp"
#include "nereus/cluster/transition_service.hpp"
#include "nereus/core/global_plan.hpp"
#include "nereus/plan/transition_graph.hpp"
#include "nereus/runtime/async_scope.hpp"
#include "nereus/runtime/graph_run.hpp"
#include "nereus/runtime/notifier.hpp"
#include "job_timeline.hpp"

namespace nereus::cluster::detail {

using clock = std::chrono::steady_clock;

/// The devices a plan may use: the alive nodes' global device ids in rank order. Plans and
/// graphs number GPUs 0..n−1 over them; index i is device `devices[i]`.
struct Pool {
  std::vector<DeviceId> devices;
  DeviceId device(DeviceId index) const { return devices.at(static_cast<std::size_t>(index)); }
  DeviceId index(DeviceId device) const;  ///< throws Error for a device off the pool
  GlobalPlan to_devices(const GlobalPlan& p) const;
  GlobalPlan to_indices(const GlobalPlan& p) const;
};

/// A unit of the job as the coordinator knows it: global device ids, and its buffers'
/// addresses on every node that holds part of it.
struct UnitRecord {
  std::size_t stage = 0;
  Emu emu;
  std::vector<PeerInfo::Buffer> buffers;
};

class JobDriver {
 public:
  /// `membership(rank)` says whether the coordinator's heartbeats still see a node: a node
  /// they lose (frozen, cut off) is treated as lost here too.
  JobDriver(asio::any_io_executor ex, const JobRequest& r, int per_node, const std::string& token,
            std::function<bool(int)> membership);

  const JobSpec& job() const { return job_; }
  const std::vector<ModelStage>& stages() const { return stages_; }
  asio::any_io_executor executor() const { return ex_; }
  Notifier& changed() { return changed_; }
  /// Whether the nodes' frameworks are computing a step beside a graph's run (`--overlap`):
  /// the graph's destroys, and builds that read training state, wait until it ends.
  bool stepping() const { return stepping_; }
  void set_stepping(bool on) {
    stepping_ = on;
    changed_.notify();
  }

  /// Authenticates to every node, opens the job there and connects their UCX endpoints. A
  /// node that cannot be reached or is lost meanwhile is lost to the job, not an error
  /// (its units never load); none reachable is.
  asio::awaitable<void> connect(const std::vector<NodeAddress>& nodes);
  /// Adds node `n` to the running job: a node that was not part of it, or was lost and
  /// restarted. It opens the job (without the request's fault injection: that strikes
  /// once) and every alive node connects to it. Returns false when it is already in, and
  /// an error when it cannot be reached.
  asio::awaitable<bool> admit(const NodeAddress& n);
  /// Allocates and fills the units of `plan` (pool indices). Units with a GPU on a node lost
  /// before or during loading stay recorded, unallocated, for drop_lost_units().
  asio::awaitable<void> load(const GlobalPlan& plan, const Pool& pool);
  /// The current collections as a plan over `pool` (every unit must be on it).
  GlobalPlan plan_of(const Pool& pool) const;
  /// Unit `id`'s EMU (global device ids); throws for a unit not recorded.
  const Emu& emu_of(std::uint32_t id) const { return units_.at(id).emu; }
  /// Each model-stage's current units (ids), in stage order.
  std::vector<std::vector<std::uint32_t>>& current() { return current_; }

  /// Records a new unit of `stage` (`emu` in global device ids); returns its id.
  std::uint32_t add_unit(std::size_t stage, const Emu& emu);
  /// Allocates a recorded unit on the nodes that hold its GPUs; `replica` >= 0 when the job
  /// loads it (a framework's node may back it with its own memory).
  asio::awaitable<void> allocate(std::uint32_t id, bool fill, int replica = -1);
  /// Fills unit `id` from the source groups (one per model-stage read); returns each of its
  /// nodes' report once that node's bytes have landed (two-sided: and each sending node's,
  /// once its sends completed).
  asio::awaitable<std::vector<RunDone>> build(std::uint32_t id, const std::vector<std::vector<std::uint32_t>>& groups);
  /// Frees a unit on the alive nodes that hold part of it.
  asio::awaitable<void> release(std::uint32_t id);
  /// Keeps in every model-stage only intact units, as many as divide the global batch, and
  /// frees the others on the alive nodes (after a node was lost outside a graph's run).
  asio::awaitable<void> drop_lost_units();
  /// After a node was lost: a model-stage with no unit left gets new ones from a model-stage
  /// that holds its state and kept units (holds_state_of, training first), one on each of
  /// that one's units' GPUs, built from it as weight sync builds. Returns what it rebuilt
  /// ([{model_stage, from, units, bytes}]); throws Error naming every model-stage whose
  /// state no survivor holds.
  asio::awaitable<nlohmann::json> rebuild_lost_stages();
  /// Whether none of the unit's GPUs is on a lost node.
  bool intact(std::uint32_t id) const;
  /// The nodes that hold part of unit `id` (none for a unit no longer recorded).
  std::vector<int> nodes_of_unit(std::uint32_t id) const {
    const auto it = units_.find(id);
    return it == units_.end() ? std::vector<int>{} : nodes_of(it->second.emu);
  }
  /// Tells every alive node to cancel its running builds.
  asio::awaitable<void> abort_builds();
  /// Requests still waiting for a reply end at once (after abort_builds: what still runs
  /// would not stop); resume() ends that.
  void give_up();
  void resume() { giving_up_ = false; }

  /// Step `step` on the current units (cluster job --node-steps): every alive node's
  /// framework runs it; the reports of the nodes that answered (a node lost meanwhile is
  /// its loss, for recover()). One stream of an async job's step runs on that stream's
  /// units (generation: the generation model-stages'; training: the others') and goes to
  /// the alive nodes holding one of them.
  asio::awaitable<std::vector<std::pair<int, StepDone>>> step(std::int64_t step, double response_len,
                                                              StepStream stream = StepStream::whole,
                                                              std::int64_t weight_version = 0);
  asio::awaitable<nlohmann::json> verify();
  asio::awaitable<void> close();

  std::vector<int> alive() const;
  /// Whether node `rank` is in the job and not lost.
  bool in_job(int rank) const;
  std::vector<int> lost() const;
  /// Why node `rank` was lost (its channel's last error, or the membership's verdict).
  std::string lost_why(int rank) const;
  /// When node `rank` was lost (the epoch while it is alive).
  clock::time_point lost_at(int rank) const;
  int node_of(DeviceId d) const { return static_cast<int>(d) / per_; }
  /// Where builds record their nodes' transfers (--perfetto); null: nowhere.
  void set_timeline(JobTimeline* t) { timeline_ = t; }
  JobTimeline* timeline() const { return timeline_; }

 private:
  struct Session {
    int rank = 0;
    std::unique_ptr<Channel> ch;
    bool alive = true;
    bool silent = false;  // closed because the membership lost it
    std::string lost;
    clock::time_point lost_at{};
    PeerInfo info;  // its UCX address and arenas' keys, once it opened the job
    struct Pending {
      asio::steady_timer timer;
      std::optional<Envelope> reply;
    };
    std::map<std::uint64_t, Pending*> pending;  // requests awaiting their reply
  };

  asio::awaitable<void> pump(Session& s);
  /// A session to node `n`, authenticated; throws when it cannot be reached.
  asio::awaitable<std::unique_ptr<Session>> open_session(const NodeAddress& n);
  /// Marks the session lost and wakes whatever waits on it.
  void lose(Session& s, const std::string& why);
  /// Ends the sessions of nodes the membership has lost, until close().
  asio::awaitable<void> watch_membership();
  Session& session(int rank);
  /// One request and its reply; throws Error on a failure reply, a lost node or a timeout.
  asio::awaitable<Envelope> call(int rank, const Body& body, const char* what);
  asio::awaitable<void> call_into(int rank, Body body, const char* what, Envelope* out, std::string* error);
  /// The same request to several nodes at once; throws the first error once all answered.
  asio::awaitable<std::vector<Envelope>> each(const std::vector<int>& ranks, const Body& body, const char* what);
  /// The same request to several nodes at once; the answers of those that answered. An error
  /// from a node lost meanwhile is its loss, not the request's; any other error throws.
  asio::awaitable<std::vector<std::pair<int, Envelope>>> each_surviving(const std::vector<int>& ranks, const Body& body,
                                                                        const char* what);
  std::vector<int> nodes_of(const Emu& e) const;
  UnitDesc describe(std::uint32_t id) const;
  /// Two-sided builds: the nodes that send bytes of build `b` to another node.
  std::vector<int> senders(const UnitBuild& b) const;

  asio::any_io_executor ex_;
  const JobRequest& request_;
  int per_;
  const std::string& token_;
  JobSpec job_;
  std::vector<ModelStage> stages_;
  std::vector<std::unique_ptr<Session>> sessions_;
  AsyncScope pumps_;
  Notifier changed_;
  std::uint64_t request_ids_ = 0;
  std::uint32_t next_unit_ = 1;
  std::map<std::uint32_t, UnitRecord> units_;
  std::vector<std::vector<std::uint32_t>> current_;
  JobTimeline* timeline_ = nullptr;
  bool giving_up_ = false;
  bool stepping_ = false;
  std::function<bool(int)> membership_;
  bool closing_ = false;
  bool two_sided_ = false;     // builds as messages, senders taking part (JobRequest::two_sided, or GPU daemons)
  std::uint32_t builds_ = 0;   // builds started: the next one's number (UnitBuild::run)
};

/// Executes graph `g` (GPUs as `pool` indices) from the driver's current units. Every
/// node of the graph starts when its edges allow; a build is committed when all its nodes
/// reported. On a failure or a lost node the rest is aborted and each model-stage is left
/// a valid collection of intact units. Returns the report (error set when it stopped).
asio::awaitable<nlohmann::json> run_graph(JobDriver& d, const TransitionGraph& g, const Pool& pool);

}  // namespace nereus::cluster::detail
