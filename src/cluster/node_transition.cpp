// Transitions across daemons: a node's part (transition_service.hpp).
#include "nereus/cluster/transition_service.hpp"

#include <signal.h>

#include <nlohmann/json.hpp>

#include "nereus/cluster/clock_sync.hpp"
#include "nereus/runtime/participant.hpp"
#include "nereus/base/error.hpp"
#include "nereus/base/offload.hpp"
#include "transition_config.hpp"

namespace nereus::cluster {

namespace {
using json = nlohmann::json;
using detail::config_of;
}  // namespace

struct NodeTransition::State {
  asio::io_context& io;
  int rank;
  std::uint64_t capacity;
  Metrics& metrics;
  std::string machine;  // DaemonOptions::machine
  // On the heap so that a participant whose run would not stop can be left running with
  // what it references (see close()).
  std::unique_ptr<ReshardSpec> config;
  std::unique_ptr<PreparedReshard> prepared;
  std::unique_ptr<Participant> part;
  std::shared_ptr<Channel*> reply_to;  // where runs report; cleared when the session ends
  int kill_node = -1;
  asio::steady_timer doom{io};

  State(asio::io_context& i, int r, std::uint64_t cap, Metrics& m) : io(i), rank(r), capacity(cap), metrics(m) {}

  void reset() {
    part.reset();
    prepared.reset();
    config.reset();
    offload.stop();  // no thread outlives the transition it served
  }

  /// Plans this node's part; throws nereus::Error (answered as failed) on bad requests.
  void prepare(const Prepare& m) {
    if (m.devices_per_node < 1) throw Error("devices per node must be positive");
    config = std::make_unique<ReshardSpec>(config_of(m.spec));
    if (config->capacity.empty()) config->capacity = std::to_string(capacity);
    config->machine = machine;
    kill_node = m.spec.kill_node;
    prepared = std::make_unique<PreparedReshard>(prepare_reshard(*config));
    const int per = m.devices_per_node;
    std::vector<DeviceId> mine;
    for (DeviceId d : prepared->devices)
      if (static_cast<int>(d) / per == rank) mine.push_back(d);
    part = std::make_unique<Participant>(io, *config, *prepared, mine, static_cast<PeerId>(rank),
                                                [per](DeviceId d) { return static_cast<PeerId>(static_cast<int>(d) / per); });
  }

  Offload offload;  // fills, checks and dumps off the event loop
};

NodeTransition::NodeTransition(asio::io_context& io, int node_rank, std::uint64_t device_capacity, Metrics& metrics,
                               std::string machine)
    : s_(std::make_unique<State>(io, node_rank, device_capacity, metrics)) {
  s_->machine = std::move(machine);
}
NodeTransition::~NodeTransition() = default;

void NodeTransition::quarantine() {
  if (s_->part) s_->part->quarantine();
}

asio::awaitable<NodePart::Answer> NodeTransition::answer(Channel& ch, const Envelope& m) {
  State& s = *s_;
  Body reply;
  {
    if (auto* p = std::get_if<Prepare>(&m.body)) {
      // Refused before anything is made: the transition this node holds must not be reset.
      if (s.part) throw Error("node " + std::to_string(s.rank) + " is already in a transition");
      try {
        s.prepare(*p);
        Participant* part = s.part.get();
        auto fill = [part] { part->fill(); return 0; };
        co_await s.offload(fill);  // gigabytes: off the event loop
        reply = Ready{part->publish()};
      } catch (...) {
        s.reset();  // nothing half made stays (a node without the GPU the units need): answered as failed
        throw;
      }
    } else if (!s.part) {  // nothing prepared (it failed, or the session is new)
      if (std::holds_alternative<Abort>(m.body)) reply = Aborted{false};
      else if (std::holds_alternative<Verify>(m.body)) reply = Failed{"no transition on node " + std::to_string(s.rank)};
      else co_return NotMine{};
    } else if (auto* peers = std::get_if<Peers>(&m.body)) {
      s.part->connect(peers->all);
      Participant* part = s.part.get();
      auto warm = [part] { part->warm(); return 0; };
      co_await s.offload(warm);  // page faults of the peers' mapped memory, off the event loop
      reply = Connected{};
    } else if (std::holds_alternative<Quantize>(m.body)) {
      Participant* part = s.part.get();
      auto quantize = [part] { part->quantize(); return 0; };
      co_await s.offload(quantize);  // the bf16 blocks this node sends, into their FP8 staging
      reply = Quantized{};
    } else if (std::holds_alternative<Run>(m.body)) {
      if (s.kill_node == s.rank) {  // fault injection: this daemon dies 3 ms into the run
        s.doom.expires_after(std::chrono::milliseconds(3));
        s.doom.async_wait([](auto) { ::raise(SIGKILL); });
      }
      const std::uint64_t id = m.request_id;
      // The run may outlive this channel (a transfer that would not stop is left behind by
      // close()): it replies through a handle that close() clears, never the channel itself.
      s.reply_to = std::make_shared<Channel*>(&ch);
      s.part->run([reply_to = s.reply_to, id, &metrics = s.metrics](RunResult r) -> asio::awaitable<void> {
        Body body = Failed{r.error};
        if (r.ok) {
          RunDone d{r.report.seconds,        r.report.link_bytes, r.report.local_bytes, r.report.timings.size(),
                    r.report.commits.size(), {},                  r.report.started_ns + node_clock_skew_ns()};
          d.timings.reserve(r.report.timings.size());
          for (const TransferTiming& t : r.report.timings)
            d.timings.push_back({static_cast<std::uint32_t>(t.src), static_cast<std::uint32_t>(t.dst), t.bytes, t.start, t.end});
          metrics.add_run(d.seconds, d.timings);
          body = std::move(d);
        }
        const Envelope e{kProtocolVersion, id, 0, std::move(body)};
        if (!*reply_to) co_return;  // the session is gone
        try {
          co_await (*reply_to)->send(e);
        } catch (const std::exception&) {  // the coordinator went away; close() cleans up
        }
      });
      co_return Later{};
    } else if (std::holds_alternative<Abort>(m.body)) {
      const bool stopped = co_await s.part->abort(std::chrono::seconds(2));
      reply = Aborted{!stopped};
    } else if (auto* v = std::get_if<Verify>(&m.body)) {
      co_await s.part->settle();
      Participant* part = s.part.get();
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
      Participant* part = s.part.get();
      const std::string dir = d->dir;
      auto write = [part, dir] { return part->dump(dir); };
      const json files = co_await s.offload(write);
      for (const auto& f : files) out.files.push_back(f.dump());
      reply = out;
    } else {
      co_return NotMine{};
    }
  }
  co_return reply;
}

asio::awaitable<void> NodeTransition::close() {
  State& s = *s_;
  if (s.reply_to) *s.reply_to = nullptr;
  if (!s.part) co_return;
  const bool finished = co_await s.part->finish(std::chrono::seconds(2));
  if (!finished) {
    // A transfer that would not stop still writes the arenas: leave it, and what it
    // references, allocated for good rather than free memory under it.
    ++s.metrics.stuck_parts;
    (void)s.part.release();
    (void)s.prepared.release();
    (void)s.config.release();
  }
  s.reset();
}

}  // namespace nereus::cluster
