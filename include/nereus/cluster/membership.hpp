#pragma once
// The coordinator's view of the job's nodes: who joined, who is alive, when each was last
// heard from. Pure bookkeeping over a clock passed in, so tests drive it directly; the
// daemon calls it from its event loop.
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "nereus/cluster/messages.hpp"

namespace nereus::cluster {

class Membership {
 public:
  using Clock = std::chrono::steady_clock;

  Membership(int nodes, std::chrono::milliseconds dead_after) : nodes_(nodes), dead_after_(dead_after) {}

  /// A node joins (or rejoins after it was lost). Returns the session number the node's
  /// later calls carry, or throws nereus::Error naming why it is refused: a rank outside
  /// the job, another node count, or a rank that is alive on another connection.
  std::uint64_t join(const Join& j, Clock::time_point now);
  /// A heartbeat on session `session`; false when that session is no longer current.
  /// `offset_ns`/`rtt_ns`: the node's clock estimate (clock_sync.hpp); rtt −1 keeps the last.
  bool heartbeat(int rank, std::uint64_t session, const std::vector<DeviceInfo>& devices, Clock::time_point now,
                 std::int64_t offset_ns = 0, std::int64_t rtt_ns = -1);
  /// The session's connection ended: the node is lost unless it already rejoined (or was
  /// already lost). True when this call marked it lost.
  bool lost(int rank, std::uint64_t session, const std::string& why);
  /// Marks nodes silent for longer than dead_after as lost; returns their ranks.
  std::vector<int> sweep(Clock::time_point now);

  ClusterStatus status(Clock::time_point now) const;
  int nodes() const { return nodes_; }
  int alive() const;
  std::uint64_t heartbeats() const { return heartbeats_; }
  /// Why each lost node was lost, for logs.
  const std::string& last_loss(int rank) const;

 private:
  struct Member {
    NodeStatus status;
    std::uint64_t session = 0;
    Clock::time_point last{};
    std::string lost_why;
  };
  int nodes_;
  std::chrono::milliseconds dead_after_;
  std::map<int, Member> members_;
  std::uint64_t next_session_ = 1;
  std::uint64_t heartbeats_ = 0;
};

}  // namespace nereus::cluster
