// Transitions across daemons: the coordinator's driver (transition_service.hpp).
#include "nereus/cluster/transition_service.hpp"

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "nereus/cluster/auth.hpp"
#include "nereus/cluster/clock_sync.hpp"
#include "nereus/base/error.hpp"
#include "nereus/runtime/async_scope.hpp"
#include "nereus/runtime/inbox.hpp"
#include "transition_config.hpp"

namespace nereus::cluster {

namespace {

using detail::config_of;

using clock = std::chrono::steady_clock;
using json = nlohmann::json;


/// What arrived from node `index`: a message, or the reason its channel ended.
struct Arrival {
  std::size_t index;
  std::optional<Envelope> message;
  std::string lost;
};

using Inbox = nereus::Inbox<Arrival>;

struct Link {
  int rank = 0;
  std::unique_ptr<Channel> ch;
  bool alive = true;
  std::int64_t clock_offset_ns = 0, clock_rtt_ns = -1;
};

asio::awaitable<void> pump(Channel& ch, std::size_t index, Inbox& inbox) {
  for (;;) {
    std::string lost;
    try {
      Envelope e = co_await ch.receive(std::chrono::hours(24));
      inbox.push({index, std::move(e), {}});
      continue;
    } catch (const std::exception& e) {
      lost = e.what();
    }
    inbox.push({index, std::nullopt, lost});
    co_return;
  }
}

/// The driver's state for one transition.
class Driver {
 public:
  Driver(asio::any_io_executor ex, const TransitionSpec& spec, int devices_per_node)
      : spec_(spec), per_node_(devices_per_node), inbox_(ex), pumps_(ex) {}

  asio::awaitable<void> connect(const std::vector<NodeAddress>& nodes, const std::string& token) {
    for (const NodeAddress& n : nodes) {
      auto ch = std::make_unique<Channel>(co_await connect_to(n.listen.host, n.listen.port, Millis(5000)));
      ch->set_peer("node " + std::to_string(n.rank) + " (" + n.listen.str() + ")");
      const Hello hello{Role::client, -1, 0, {}};
      co_await authenticate_as_client(*ch, token, hello, Millis(5000));
      links_.push_back({n.rank, std::move(ch), true, n.clock_offset_ns, n.clock_rtt_ns});
    }
    for (std::size_t i = 0; i < links_.size(); ++i) pumps_.spawn(pump(*links_[i].ch, i, inbox_));
  }

  asio::awaitable<void> broadcast(const Body& b) {
    // (Callers pass named Bodies: GCC 12 destroys braced temporaries in co_await twice.)
    const Envelope e{kProtocolVersion, ++request_, 0, b};
    for (Link& l : links_) {
      if (!l.alive) continue;
      try {
        co_await l.ch->send(e);
      } catch (const std::exception&) {
        l.alive = false;
      }
    }
  }

  /// One `T` from every live node. A lost node or a failure ends the phase at once when
  /// `fail_fast` (the others may be waiting on the lost one).
  template <class T>
  asio::awaitable<std::map<int, T>> gather(const char* what, clock::time_point until, bool fail_fast = true) {
    std::map<int, T> got;
    std::size_t live = 0;
    for (const Link& l : links_) live += l.alive;
    while (got.size() < live) {
      std::optional<Arrival> a = co_await inbox_.next(until);
      if (!a) {
        note("timed out waiting for '" + std::string(what) + "'");
        break;
      }
      Link& l = links_[a->index];
      if (!a->message) {
        if (l.alive) {
          l.alive = false;
          note("node " + std::to_string(l.rank) + " lost during '" + what + "': " + a->lost);
          --live;
        }
        if (fail_fast) break;
        continue;
      }
      if (auto* f = std::get_if<Failed>(&a->message->body)) {
        note("node " + std::to_string(l.rank) + ": " + f->error);
        if (fail_fast) break;
        --live;
        continue;
      }
      if (auto* t = std::get_if<T>(&a->message->body)) got.emplace(l.rank, *t);
    }
    co_return got;
  }

  asio::awaitable<json> run(const PreparedReshard& p) {
    json out;
    const auto deadline = [&] { return clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(spec_.timeout_seconds)); };
    const auto ready = co_await gather<Ready>("ready", deadline());
    // Nodes that share a machine (as CUDA IPC sees it) get the same index.
    std::map<std::string, int> index;
    for (const auto& [r, m] : ready) machine_[r] = index.emplace(m.info.machine, static_cast<int>(index.size())).first->second;
    if (error_.empty()) {
      Peers peers;
      for (const auto& [r, m] : ready) peers.all.push_back(m.info);
      co_await broadcast(peers);
      co_await gather<Connected>("connected", deadline());
    }
    std::vector<double> secs, quantize_secs;
    double detected = 0;
    RunDone last{};
    json link_stats = json::array(), transport_stats = json::object();
    json timings;
    for (int i = 0; i < spec_.repeat && error_.empty(); ++i) {
      const auto t0 = clock::now();
      const std::int64_t origin = node_clock_ns();
      if (p.plan.summary().quantized_bytes > 0) {
        // bf16 -> FP8: every node quantizes what it sends before any node's run reads it
        // (gets pull from the senders' staging); the run's time counts both.
        const Body quantize = Quantize{};
        co_await broadcast(quantize);
        co_await gather<Quantized>("quantized", deadline());
        quantize_secs.push_back(std::chrono::duration<double>(clock::now() - t0).count());
        if (!error_.empty()) break;
      }
      const Body run = Run{static_cast<std::uint32_t>(i)};
      co_await broadcast(run);
      const auto done = co_await gather<RunDone>("done", deadline());
      secs.push_back(std::chrono::duration<double>(clock::now() - t0).count());
      if (!error_.empty()) detected = secs.back();
      last = {};
      for (const auto& [r, d] : done) {
        last.link_bytes += d.link_bytes;
        last.local_bytes += d.local_bytes;
      }
      link_stats = links(done);
      transport_stats = transports(done);
      if (spec_.timings) timings = on_coordinator_clock(done, origin);
    }
    out["clocks"] = clocks();
    if (!error_.empty()) {
      const std::string first = error_;
      const Body abort = Abort{};
      co_await broadcast(abort);
      co_await gather<Aborted>("aborted", clock::now() + std::chrono::seconds(10), false);
      const Body verify = Verify{true};
      co_await broadcast(verify);
      const auto v = co_await gather<Verified>("verified", clock::now() + std::chrono::seconds(60), false);
      bool ok = !v.empty();
      for (const auto& [r, m] : v) ok = ok && m.sources_ok;
      out.update(failure_figures(first, detected, ok, v.size()));
    } else {
      out.update(run_figures(p, secs, last.link_bytes + last.local_bytes, quantize_secs));
      out["verified"] = nullptr;
      out["links"] = link_stats;
      out["transports"] = transport_stats;
      json machines = json::object();
      for (const auto& [r, m] : machine_) machines[std::to_string(r)] = m;
      out["machines"] = machines;
      if (spec_.timings) out["timings"] = timings;
      if (spec_.verify) {
        const Body verify = Verify{false};
        co_await broadcast(verify);
        const auto v = co_await gather<Verified>("verified", deadline());
        bool ok = error_.empty() && v.size() == links_.size();
        std::uint64_t bytes = 0;
        for (const auto& [r, m] : v) {
          ok = ok && m.sources_ok && m.targets_ok;
          bytes += m.bytes;
          if (!m.targets_ok && !out.contains("verify_error")) out["verify_error"] = m.error;
        }
        out["verified"] = ok;
        out["verified_bytes"] = bytes;
      }
      if (!spec_.dump_dir.empty() && error_.empty()) {
        const Body dump = Dump{spec_.dump_dir};
        co_await broadcast(dump);
        const auto d = co_await gather<Dumped>("dumped", deadline());
        json files = json::array();
        for (const auto& [r, m] : d)
          for (const std::string& f : m.files) files.push_back(json::parse(f));
        std::ofstream(std::filesystem::path(spec_.dump_dir) / "manifest.json") << json{{"files", files}}.dump(1) << "\n";
      }
      if (!error_.empty()) out["error"] = error_;
    }
    const Body finish = Finish{};
    co_await broadcast(finish);
    co_await gather<Finished>("finished", clock::now() + std::chrono::seconds(10), false);
    co_return out;
  }

  asio::awaitable<void> close() {
    for (Link& l : links_) l.ch->close();
    co_await pumps_.join();
  }

  std::size_t size() const { return links_.size(); }

 private:
  void note(const std::string& e) {
    if (error_.empty()) error_ = e;
  }

  const Link& link(int rank) const {
    return *std::find_if(links_.begin(), links_.end(), [rank](const Link& l) { return l.rank == rank; });
  }

  /// Every node's transfers of one run, per node ({"rank": [[src, dst, bytes, start, end]]}),
  /// in seconds from `origin` on the coordinator's clock: each node's run start moved by
  /// its heartbeats' clock offset.
  /// A node's clock is known only to within half a heartbeat's round trip, so a transfer
  /// that began right at the broadcast may seem to start a little before it: then the
  /// whole timeline moves so that the earliest transfer starts at 0.
  json on_coordinator_clock(const std::map<int, RunDone>& done, std::int64_t origin) const {
    std::map<int, double> shift;
    double earliest = 0;
    for (const auto& [rank, d] : done) {
      shift[rank] = seconds_since(origin, d.started_ns, link(rank).clock_offset_ns);
      for (const Timing& t : d.timings) earliest = std::min(earliest, shift[rank] + t.start);
    }
    json out = json::object();
    for (const auto& [rank, d] : done) {
      const double s = shift[rank] - earliest;
      json list = json::array();
      for (const Timing& t : d.timings) list.push_back({t.src, t.dst, t.bytes, s + t.start, s + t.end});
      out[std::to_string(rank)] = std::move(list);
    }
    return out;
  }

  /// Each node's clock offset to the coordinator and the round trip it was measured over
  /// (null: not measured yet, taken as 0).
  json clocks() const {
    json out = json::array();
    for (const Link& l : links_) {
      const bool known = l.clock_rtt_ns >= 0;
      out.push_back({{"node", l.rank},
                     {"offset_ms", known ? json(static_cast<double>(l.clock_offset_ns) / 1e6) : json(nullptr)},
                     {"rtt_ms", known ? json(static_cast<double>(l.clock_rtt_ns) / 1e6) : json(nullptr)}});
    }
    return out;
  }

  /// The last run's transfers per (source node, destination node).
  json links(const std::map<int, RunDone>& done) const {
    std::map<std::pair<int, int>, LinkSpan> spans;
    for (const auto& [rank, d] : done)
      for (const Timing& t : d.timings) spans[{static_cast<int>(t.src) / per_node_, static_cast<int>(t.dst) / per_node_}].add(t);
    json out = json::array();
    for (const auto& [k, s] : spans)
      out.push_back({{"src_node", k.first}, {"dst_node", k.second}, {"bytes", s.bytes}, {"transfers", s.transfers},
                     {"gbps", s.gbps()}});
    return out;
  }

  /// The last run's bytes and GB/s per transport, named as the bench names them
  /// (TransportNames): a node is a process, on the machine its ready message named.
  json transports(const std::map<int, RunDone>& done) const {
    const TransportNames names = transport_names(config_of(spec_));
    const auto machine = [this](int node) { return machine_.contains(node) ? machine_.at(node) : 0; };
    std::map<std::string, LinkSpan> spans;
    for (const auto& [rank, d] : done)
      for (const Timing& t : d.timings) {
        const int a = static_cast<int>(t.src) / per_node_, b = static_cast<int>(t.dst) / per_node_;
        spans[names(t.src == t.dst, a == b, machine(a) == machine(b))].add(t);
      }
    json out = json::object();
    for (const auto& [name, s] : spans) out[name] = {{"bytes", s.bytes}, {"gbps", s.gbps()}};
    return out;
  }

  const TransitionSpec& spec_;
  int per_node_;
  std::map<int, int> machine_;  // node rank → machine index, from the ready messages
  Inbox inbox_;
  AsyncScope pumps_;
  std::vector<Link> links_;
  std::uint64_t request_ = 0;
  std::string error_;
};

}  // namespace

asio::awaitable<TransitionOutcome> drive_transition(const TransitionSpec& spec, const std::vector<NodeAddress>& nodes,
                                                   int devices_per_node, const std::string& token) {
  if (spec.repeat < 1) throw Error("repeat must be at least 1");
  const ReshardSpec c = config_of(spec);
  const PreparedReshard p = prepare_reshard(c);
  std::set<int> involved;
  for (DeviceId d : p.devices) involved.insert(static_cast<int>(d) / devices_per_node);
  std::vector<NodeAddress> use;
  for (int r : involved) {
    auto it = std::find_if(nodes.begin(), nodes.end(), [r](const NodeAddress& n) { return n.rank == r; });
    if (it == nodes.end())
      throw Error("the layouts use device " + std::to_string(r * devices_per_node) + " and up, on node " + std::to_string(r) +
                  ", which is not alive (" + std::to_string(nodes.size()) + " nodes of " + std::to_string(devices_per_node) +
                  " devices are)");
    use.push_back(*it);
  }
  Driver driver(co_await asio::this_coro::executor, spec, devices_per_node);
  std::string connect_error;
  try {
    co_await driver.connect(use, token);
  } catch (const std::exception& e) {
    connect_error = e.what();
  }
  json out;
  if (connect_error.empty()) {
    std::string failed;
    try {  // whatever happens, the pumps are joined below before the driver goes away
      const Body prepare = Prepare{spec, devices_per_node};
      co_await driver.broadcast(prepare);
      out = co_await driver.run(p);
    } catch (const std::exception& e) {
      failed = e.what();
    }
    if (!failed.empty()) out["error"] = "coordinator: " + failed;
  } else {
    out["error"] = "cannot reach a node: " + connect_error;
  }
  co_await driver.close();
  out["procs"] = use.size();
  out["devices_per_node"] = devices_per_node;
  json ranks = json::array();
  for (const auto& n : use) ranks.push_back(n.rank);
  out["nodes"] = ranks;
  co_return TransitionOutcome{out.dump(), out.contains("error")};
}

}  // namespace nereus::cluster
