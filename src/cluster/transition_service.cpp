// Transitions across daemons: the coordinator's driver and a node's part.
#include "nereus/cluster/transition_service.hpp"

#include <signal.h>

#include <boost/asio/thread_pool.hpp>

#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "../bench/participant.hpp"
#include "nereus/cluster/auth.hpp"
#include "nereus/core/error.hpp"
#include "nereus/runtime/async_scope.hpp"
#include "nereus/runtime/inbox.hpp"

namespace nereus::cluster {

namespace {

using clock = std::chrono::steady_clock;
using json = nlohmann::json;

bench::TransitionConfig config_of(const TransitionSpec& s) {
  bench::TransitionConfig c;
  c.model = s.model;
  c.from = s.from;
  c.to = s.to;
  c.train = s.train;
  c.sync = s.sync;
  c.transport = "ucx";
  c.repeat = s.repeat;
  c.verify = s.verify;
  c.dump_dir = s.dump_dir;
  c.capacity = s.capacity;
  c.copy_threads = std::max(1u, s.copy_threads);
  c.per_link = std::max(1u, s.per_link);
  c.chunk_bytes = std::max<std::uint64_t>(s.chunk_bytes, 4096);
  c.gpus_per_node = s.gpus_per_node;
  c.timeout_seconds = s.timeout_seconds > 0 ? s.timeout_seconds : 300;
  return c;
}

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
      links_.push_back({n.rank, std::move(ch), true});
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

  asio::awaitable<json> run(const bench::Prepared& p) {
    json out;
    const auto deadline = [&] { return clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(spec_.timeout_seconds)); };
    const auto ready = co_await gather<Ready>("ready", deadline());
    if (error_.empty()) {
      Peers peers;
      for (const auto& [r, m] : ready) peers.all.push_back(m.info);
      co_await broadcast(peers);
      co_await gather<Connected>("connected", deadline());
    }
    std::vector<double> secs;
    double detected = 0;
    RunDone last{};
    json link_stats = json::array();
    for (int i = 0; i < spec_.repeat && error_.empty(); ++i) {
      const auto t0 = clock::now();
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
    }
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
      out["error"] = first;
      if (detected > 0) out["failure_detected_seconds"] = detected;
      out["verified_sources"] = ok;
      out["surviving_workers"] = v.size();
    } else {
      const auto [median, min] = bench::median_min(secs);
      out["seconds_median"] = median;
      out["seconds_min"] = min;
      out["gbps"] = static_cast<double>(p.plan.summary().moved_bytes) / median / 1e9;
      out["copied_bytes"] = last.link_bytes + last.local_bytes;
      out["copy_gbps"] = static_cast<double>(last.link_bytes + last.local_bytes) / median / 1e9;
      out["verified"] = nullptr;
      out["links"] = link_stats;
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

  /// The last run's transfers per (source node, destination node).
  json links(const std::map<int, RunDone>& done) const {
    struct Span {
      std::uint64_t bytes = 0, transfers = 0;
      double lo = 1e300, hi = 0;
    };
    std::map<std::pair<int, int>, Span> spans;
    for (const auto& [rank, d] : done)
      for (const Timing& t : d.timings) {
        Span& s = spans[{static_cast<int>(t.src) / per_node_, static_cast<int>(t.dst) / per_node_}];
        s.bytes += t.bytes;
        ++s.transfers;
        s.lo = std::min(s.lo, t.start);
        s.hi = std::max(s.hi, t.end);
      }
    json out = json::array();
    for (const auto& [k, s] : spans)
      out.push_back({{"src_node", k.first}, {"dst_node", k.second}, {"bytes", s.bytes}, {"transfers", s.transfers},
                     {"gbps", s.hi > s.lo ? static_cast<double>(s.bytes) / (s.hi - s.lo) / 1e9 : 0.0}});
    return out;
  }

  const TransitionSpec& spec_;
  int per_node_;
  Inbox inbox_;
  AsyncScope pumps_;
  std::vector<Link> links_;
  std::uint64_t request_ = 0;
  std::string error_;
};

}  // namespace

asio::awaitable<std::string> drive_transition(const TransitionSpec& spec, const std::vector<NodeAddress>& nodes,
                                              int devices_per_node, const std::string& token) {
  const bench::TransitionConfig c = config_of(spec);
  const bench::Prepared p = bench::prepare(c);
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
    const Body prepare = Prepare{spec, devices_per_node};
    co_await driver.broadcast(prepare);
    out = co_await driver.run(p);
  } else {
    out["error"] = "cannot reach a node: " + connect_error;
  }
  co_await driver.close();
  out["procs"] = use.size();
  json ranks = json::array();
  for (const auto& n : use) ranks.push_back(n.rank);
  out["nodes"] = ranks;
  co_return out.dump();
}

// ---- a node's part ------------------------------------------------------------------

struct NodeTransition::State {
  asio::io_context& io;
  int rank;
  std::uint64_t capacity;
  Metrics& metrics;
  // On the heap so that a participant whose run would not stop can be left running with
  // what it references (see close()).
  std::unique_ptr<bench::TransitionConfig> config;
  std::unique_ptr<bench::Prepared> prepared;
  std::unique_ptr<bench::Participant> part;
  int kill_node = -1;
  asio::steady_timer doom{io};

  State(asio::io_context& i, int r, std::uint64_t cap, Metrics& m) : io(i), rank(r), capacity(cap), metrics(m) {}

  void reset() {
    part.reset();
    prepared.reset();
    config.reset();
  }

  Body prepare(const Prepare& m) {
    if (part) return Failed{"node " + std::to_string(rank) + " is already in a transition"};
    if (m.devices_per_node < 1) return Failed{"devices per node must be positive"};
    config = std::make_unique<bench::TransitionConfig>(config_of(m.spec));
    if (config->capacity.empty()) config->capacity = std::to_string(capacity);
    kill_node = m.spec.kill_node;
    prepared = std::make_unique<bench::Prepared>(bench::prepare(*config));
    const int per = m.devices_per_node;
    std::vector<DeviceId> mine;
    for (DeviceId d : prepared->devices)
      if (static_cast<int>(d) / per == rank) mine.push_back(d);
    part = std::make_unique<bench::Participant>(io, *config, *prepared, mine, static_cast<PeerId>(rank),
                                                [per](DeviceId d) { return static_cast<PeerId>(static_cast<int>(d) / per); });
    return Connected{};  // prepared; handle() fills off the loop, then publishes
  }

  /// Runs `f` on the helper thread and resumes on the event loop: filling and checking
  /// gigabytes must not stall heartbeats and the other sessions.
  /// (Named locals only around co_await: GCC 12 destroys some temporaries there twice.)
  template <class F>
  asio::awaitable<std::invoke_result_t<F>> offload(F f) {
    auto work = [f = std::move(f)]() -> asio::awaitable<std::invoke_result_t<F>> { co_return f(); };
    auto result = co_await asio::co_spawn(helper.get_executor(), std::move(work), asio::use_awaitable);
    co_return result;
  }

  asio::thread_pool helper{1};
};

NodeTransition::NodeTransition(asio::io_context& io, int node_rank, std::uint64_t device_capacity, Metrics& metrics)
    : s_(std::make_unique<State>(io, node_rank, device_capacity, metrics)) {}
NodeTransition::~NodeTransition() = default;

asio::awaitable<bool> NodeTransition::handle(Channel& ch, const Envelope& m) {
  State& s = *s_;
  Body reply;
  bool answer = true;
  std::string failure;
  try {
    if (auto* p = std::get_if<Prepare>(&m.body)) {
      reply = s.prepare(*p);
      if (std::holds_alternative<Connected>(reply)) {
        bench::Participant* part = s.part.get();
        auto fill = [part] { part->fill(); return 0; };
        co_await s.offload(fill);
        reply = Ready{part->publish()};
      }
    } else if (!s.part) {
      if (!std::holds_alternative<Finish>(m.body) && !std::holds_alternative<Abort>(m.body) &&
          !std::holds_alternative<Verify>(m.body))
        co_return false;
      reply = std::holds_alternative<Finish>(m.body) ? Body{Finished{}}
              : std::holds_alternative<Abort>(m.body) ? Body{Aborted{false}}
                                                       : Body{Failed{"no transition on node " + std::to_string(s.rank)}};
    } else if (auto* peers = std::get_if<Peers>(&m.body)) {
      s.part->connect(peers->all);
      reply = Connected{};
    } else if (std::holds_alternative<Run>(m.body)) {
      if (s.kill_node == s.rank) {  // fault injection: this daemon dies 3 ms into the run
        s.doom.expires_after(std::chrono::milliseconds(3));
        s.doom.async_wait([](auto) { ::raise(SIGKILL); });
      }
      const std::uint64_t id = m.request_id;
      s.part->run([&ch, id, &metrics = s.metrics](bench::RunResult r) -> asio::awaitable<void> {
        Body body = Failed{r.error};
        if (r.ok) {
          RunDone d{r.report.seconds, r.report.link_bytes, r.report.local_bytes, r.report.timings.size(), r.report.commits.size(), {}};
          d.timings.reserve(r.report.timings.size());
          for (const TransferTiming& t : r.report.timings)
            d.timings.push_back({static_cast<std::uint32_t>(t.src), static_cast<std::uint32_t>(t.dst), t.bytes, t.start, t.end});
          metrics.add_run(d.seconds, d.timings);
          body = std::move(d);
        }
        const Envelope e{kProtocolVersion, id, 0, std::move(body)};
        try {
          co_await ch.send(e);
        } catch (const std::exception&) {  // the coordinator went away; close() cleans up
        }
      });
      answer = false;
    } else if (std::holds_alternative<Abort>(m.body)) {
      const bool stopped = co_await s.part->abort(std::chrono::seconds(2));
      reply = Aborted{!stopped};
    } else if (auto* v = std::get_if<Verify>(&m.body)) {
      co_await s.part->settle();
      bench::Participant* part = s.part.get();
      auto check_sources = [part] { return part->verify_sources(); };
      auto check_targets = [part] { return part->verify_targets(); };
      const FillCheck src = co_await s.offload(check_sources);
      Verified out{src.ok, false, src.bytes, src.ok ? "" : "source " + src.first_error};
      if (!v->sources_only) {
        const FillCheck dst = co_await s.offload(check_targets);
        out.targets_ok = dst.ok;
        out.bytes = dst.bytes;
        if (!dst.ok) out.error = dst.first_error;
      }
      reply = out;
    } else if (auto* d = std::get_if<Dump>(&m.body)) {
      Dumped out;
      bench::Participant* part = s.part.get();
      const std::string dir = d->dir;
      auto write = [part, dir] { return part->dump(dir); };
      const json files = co_await s.offload(write);
      for (const auto& f : files) out.files.push_back(f.dump());
      reply = out;
    } else if (std::holds_alternative<Finish>(m.body)) {
      co_await close();
      reply = Finished{};
    } else {
      co_return false;
    }
  } catch (const Error& e) {
    failure = e.what();
  }
  if (!failure.empty()) {
    reply = Failed{failure};
    answer = true;
  }
  if (answer) {
    const Envelope e{kProtocolVersion, m.request_id, 0, std::move(reply)};
    co_await ch.send(e);
  }
  co_return true;
}

asio::awaitable<void> NodeTransition::close() {
  State& s = *s_;
  if (!s.part) co_return;
  const bool finished = co_await s.part->finish(std::chrono::seconds(2));
  if (!finished) {
    // A transfer that would not stop still writes the arenas: leave it, and what it
    // references, allocated for good rather than free memory under it.
    (void)s.part.release();
    (void)s.prepared.release();
    (void)s.config.release();
  }
  s.reset();
}

}  // namespace nereus::cluster
