#include "nereus/cluster/membership.hpp"

#include "nereus/base/error.hpp"

namespace nereus::cluster {

std::uint64_t Membership::join(const Join& j, Clock::time_point now) {
  if (j.nodes != nodes_)
    throw Error("node " + std::to_string(j.node_rank) + " expects " + std::to_string(j.nodes) + " nodes, the coordinator " +
                std::to_string(nodes_));
  if (j.node_rank < 0 || j.node_rank >= nodes_)
    throw Error("node rank " + std::to_string(j.node_rank) + " is outside 0.." + std::to_string(nodes_ - 1));
  auto [it, fresh] = members_.try_emplace(j.node_rank);
  Member& m = it->second;
  if (!fresh && m.status.alive)
    throw Error("node rank " + std::to_string(j.node_rank) + " is already joined (pid " + std::to_string(m.status.pid) + ")");
  m.status.rank = j.node_rank;
  m.status.alive = true;
  m.status.listen = j.listen;
  m.status.pid = j.pid;
  m.status.devices = j.devices;
  m.status.joins += 1;
  m.status.clock_offset_ns = 0;  // a restarted process has a new clock: estimate afresh
  m.status.clock_rtt_ns = -1;
  m.session = next_session_++;
  m.last = now;
  m.lost_why.clear();
  return m.session;
}

bool Membership::heartbeat(int rank, std::uint64_t session, const std::vector<DeviceInfo>& devices, Clock::time_point now,
                           std::int64_t offset_ns, std::int64_t rtt_ns) {
  auto it = members_.find(rank);
  if (it == members_.end() || it->second.session != session || !it->second.status.alive) return false;
  if (rtt_ns >= 0) {
    it->second.status.clock_offset_ns = offset_ns;
    it->second.status.clock_rtt_ns = rtt_ns;
  }
  it->second.last = now;
  it->second.status.heartbeats += 1;
  it->second.status.devices = devices;
  ++heartbeats_;
  return true;
}

bool Membership::lost(int rank, std::uint64_t session, const std::string& why) {
  auto it = members_.find(rank);
  if (it == members_.end() || it->second.session != session || !it->second.status.alive) return false;
  it->second.status.alive = false;
  it->second.lost_why = why;
  return true;
}

std::vector<int> Membership::sweep(Clock::time_point now) {
  std::vector<int> out;
  for (auto& [rank, m] : members_)
    if (m.status.alive && now - m.last > dead_after_) {
      m.status.alive = false;
      m.lost_why = "no heartbeat for " + std::to_string(dead_after_.count()) + " ms";
      out.push_back(rank);
    }
  return out;
}

ClusterStatus Membership::status(Clock::time_point now) const {
  ClusterStatus s{nodes_, {}};
  for (const auto& [rank, m] : members_) {
    NodeStatus n = m.status;
    n.ms_since_heartbeat = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(now - m.last).count());
    s.members.push_back(std::move(n));
  }
  return s;
}

int Membership::alive() const {
  int n = 0;
  for (const auto& [rank, m] : members_) n += m.status.alive;
  return n;
}

const std::string& Membership::last_loss(int rank) const {
  static const std::string none;
  auto it = members_.find(rank);
  return it == members_.end() ? none : it->second.lost_why;
}

}  // namespace nereus::cluster
