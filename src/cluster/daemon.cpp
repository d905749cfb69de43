// nereusd's event loop: the listener and its sessions, the coordinator's membership sweep,
// a node's join-and-heartbeat link, and the metrics endpoint. Everything runs on one
// io_context thread; every session ends on its own errors without touching the others.
#include "nereus/cluster/daemon.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <algorithm>
#include <cstdio>
#include <list>
#include <vector>

#include "nereus/base/log.hpp"
#include "nereus/cluster/auth.hpp"
#include "nereus/cluster/clock_sync.hpp"
#include "nereus/cluster/job_service.hpp"
#include "nereus/cluster/transition_service.hpp"
#include "nereus/base/error.hpp"
#include "nereus/runtime/async_scope.hpp"
#include "nereus/base/device.hpp"
#include "nereus/transport/cuda.hpp"

namespace nereus::cluster {

namespace {
using Clock = std::chrono::steady_clock;

tcp::endpoint endpoint_of(asio::io_context& io, const Endpoint& e, const char* what) {
  tcp::resolver r(io);
  boost::system::error_code ec;
  auto results = r.resolve(e.host, std::to_string(e.port), ec);
  if (ec || results.empty()) throw Error(std::string(what) + ": cannot resolve '" + e.host + "': " + ec.message());
  return results.begin()->endpoint();
}

void open_acceptor(tcp::acceptor& a, const tcp::endpoint& ep, const std::string& what) {
  boost::system::error_code ec;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw Error(what + " " + ep.address().to_string() + ":" + std::to_string(ep.port()) + ": " + ec.message());
}
}  // namespace

struct Daemon::State {
  asio::io_context& io;
  DaemonOptions o;
  tcp::acceptor acceptor{io};
  tcp::acceptor metrics_acceptor{io};
  AsyncScope scope{io.get_executor()};
  std::optional<Membership> members;  // coordinator only
  std::uint64_t self_session = 0;
  std::vector<std::unique_ptr<Device>> devices;
  Metrics metrics;
  // Connections still in the handshake, oldest first: at max_pending the oldest is cut
  // off, so a flood of silent connections cannot lock out a client that authenticates.
  std::list<Channel*> handshaking;
  bool stopping = false;
  bool driving = false;        // the coordinator runs one transition at a time
  int answering = 0;           // clients' transition and job requests not yet answered
  std::string fatal;
  asio::steady_timer stopped{io};

  State(asio::io_context& i, DaemonOptions opt) : io(i), o(std::move(opt)) {
    stopped.expires_at(Clock::time_point::max());
    metrics.node_rank = o.launch.node_rank;
    metrics.coordinator = o.launch.coordinator;
    const auto per_node = static_cast<DeviceId>(o.devices);
    const int gpus = o.device_kind == MemoryKind::cuda ? std::max(1, cuda_device_count()) : 1;
    for (int i = 0; i < o.devices; ++i)
      devices.push_back(make_device({o.device_kind, static_cast<DeviceId>(o.launch.node_rank) * per_node + static_cast<DeviceId>(i),
                                     o.device_capacity, nullptr, i % gpus}));
    if (o.launch.coordinator) members.emplace(o.launch.nodes, o.dead_after);
  }

  /// A log line of this node (the rank is in the component: tests run several in one
  /// process).
  template <class... A>
  void log(LogLevel level, fmt::format_string<A...> f, A&&... a) {
    if (log_enabled(level)) log_line(level, "node " + std::to_string(o.launch.node_rank), fmt::format(f, std::forward<A>(a)...));
  }

  std::vector<DeviceInfo> device_info() const {
    std::vector<DeviceInfo> out;
    for (const auto& d : devices) out.push_back({static_cast<std::uint32_t>(d->id()), d->capacity(), d->used(), d->peak()});
    return out;
  }

  Endpoint listening() const {
    const auto ep = acceptor.local_endpoint();
    return {ep.address().to_string(), ep.port()};
  }

  Endpoint reachable_at() const { return o.advertise ? *o.advertise : listening(); }

  /// Counts a client's request from its arrival to its answer (stop_after waits for it).
  struct Answering {
    int& n;
    explicit Answering(int& count) : n(count) { ++n; }
    ~Answering() { --n; }
  };

  /// finish() once no client's request is left unanswered, or after `grace`.
  asio::awaitable<void> finish_when_answered(Millis grace) {
    const auto until = Clock::now() + grace;
    asio::steady_timer t(io);
    while (answering > 0 && !stopping && Clock::now() < until) {
      t.expires_after(std::chrono::milliseconds(20));
      co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
    }
    finish("");
  }

  void finish(std::string error) {
    if (stopping) return;
    stopping = true;
    fatal = std::move(error);
    boost::system::error_code ignored;
    acceptor.close(ignored);
    metrics_acceptor.close(ignored);
    scope.cancel();
    stopped.cancel();
  }

  void refresh_metrics() {
    metrics.devices = device_info();
    if (members) {
      metrics.nodes_expected = members->nodes();
      metrics.nodes_alive = members->alive();
      metrics.heartbeats_received = members->heartbeats();
    }
  }

  // ---- serving ----------------------------------------------------------------------

  asio::awaitable<void> accept_loop() {
    for (;;) {
      auto [ec, sock] = co_await acceptor.async_accept(asio::as_tuple(asio::use_awaitable));
      if (ec) {
        if (stopping || ec == asio::error::operation_aborted) co_return;
        // e.g. too many open files: keep serving the connections we have, try again soon
        asio::steady_timer t(io, Millis(50));
        co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
        continue;
      }
      ++metrics.connections_accepted;
      if (static_cast<int>(handshaking.size()) >= o.max_pending) {
        ++metrics.dropped["evicted"];
        handshaking.front()->close();  // its session ends on the closed socket
        handshaking.pop_front();
      }
      scope.spawn(session(std::move(sock)));
    }
  }

  asio::awaitable<void> reply(Channel& ch, std::uint64_t request_id, Body body) {
    co_await ch.reply(request_id, body);
    ++metrics.frames_sent;
  }

  asio::awaitable<void> session(tcp::socket sock) {
    boost::system::error_code ec;
    const auto remote = sock.remote_endpoint(ec);
    sock.set_option(tcp::no_delay(true), ec);
    Channel ch(std::move(sock), kHandshakeFrameCap);  // small until the peer proves the token
    ch.set_peer(ec ? std::string("?") : remote.address().to_string() + ":" + std::to_string(remote.port()));
    Hello hello;
    handshaking.push_back(&ch);
    // Leaves the handshaking list; false when the accept loop already evicted us.
    auto leave = [&] {
      auto it = std::find(handshaking.begin(), handshaking.end(), &ch);
      if (it == handshaking.end()) return false;
      handshaking.erase(it);
      return true;
    };
    try {
      hello = co_await authenticate_as_server(ch, o.token, o.launch.nodes, o.handshake_limit);
      if (!leave()) throw Error("evicted");
      ch.set_frame_cap(o.frame_cap);
    } catch (const std::exception& e) {
      const bool evicted = !leave();
      const std::string what = e.what();
      if (evicted) {
        // counted by the accept loop
      } else if (what.find("wrong token") != std::string::npos) {
        ++metrics.auth_failures;
        log(LogLevel::warn, "refused {}: wrong token", ch.peer());
      } else {
        ++metrics.dropped[what.find("within") != std::string::npos ? "timeout" : "handshake"];
        log(LogLevel::warn, "dropped {} during the handshake: {}", ch.peer(), what);
      }
      ch.close();
      co_return;
    }
    try {
      if (hello.role == Role::node) {
        if (!members) {
          Body no = ErrorReply{"node " + std::to_string(o.launch.node_rank) + " is not the coordinator"};
          co_await reply(ch, 0, std::move(no));
          throw Error("a node tried to join a daemon that is not the coordinator");
        }
        co_await node_session(ch);
      } else {
        co_await client_session(ch);
      }
    } catch (const std::exception& e) {
      if (!stopping) {
        const std::string what = e.what();
        if (what.find("connection closed") == std::string::npos) {
          ++metrics.dropped[what.find("integrity check") != std::string::npos ? "integrity" : "protocol"];
          log(LogLevel::warn, "dropped {}: {}", ch.peer(), what);
        }
      }
    }
    ch.close();
  }

  // An authenticated client: status requests, a transition or job request (coordinator),
  // or the coordinator driving this node's part of a transition or of a job.
  asio::awaitable<void> client_session(Channel& ch) {
    NodeTransition part(io, o.launch.node_rank, o.device_capacity, metrics, o.machine);
    NodeJob job(io, o.launch.node_rank, devices, metrics, o.step_host.get(), o.adopt, o.machine);
    bool in_exchange = false;
    std::exception_ptr ended;
    try {
      for (;;) {
        // A node in a transition may wait long for the next step (a run of many GB).
        Envelope req = co_await ch.receive(in_exchange ? Millis(std::chrono::hours(24)) : o.client_idle);
        ++metrics.frames_received;
        in_exchange = std::holds_alternative<Prepare>(req.body) || std::holds_alternative<JobOpen>(req.body) ||
                      (in_exchange && !std::holds_alternative<Finish>(req.body));
        if (std::holds_alternative<StatusRequest>(req.body)) {
          Body answer = status();
          co_await reply(ch, req.request_id, std::move(answer));
        } else if (auto* spec = std::get_if<TransitionSpec>(&req.body)) {
          const Answering counted(answering);
          Body answer = co_await transition(*spec, req.request_id);
          co_await reply(ch, req.request_id, std::move(answer));
        } else if (auto* jr = std::get_if<JobRequest>(&req.body)) {
          const Answering counted(answering);
          Body answer = co_await run_job(*jr, req.request_id);
          co_await reply(ch, req.request_id, std::move(answer));
        } else if (const bool handled = co_await job.handle(ch, req); handled) {
        } else if (const bool handled_part = co_await part.handle(ch, req); !handled_part) {
          Body no = ErrorReply{std::string("unexpected ") + kind_name(req.body) + " from a client"};
          co_await reply(ch, req.request_id, std::move(no));
          throw Error(std::string("unexpected ") + kind_name(req.body));
        }
      }
    } catch (...) {
      ended = std::current_exception();
    }
    co_await job.abandon();   // the coordinator went away mid-job: release our part
    co_await part.abandon();  // ... or mid-transition
    std::rethrow_exception(ended);
  }

  /// The alive nodes, for a transition or a job; an ErrorReply's text when they differ in
  /// devices.
  /// The alive nodes; an error when one has another device count than the coordinator
  /// (with `skip_odd`, such a node is left out instead).
  std::string alive_nodes(std::vector<NodeAddress>& nodes, bool skip_odd = false) {
    for (const NodeStatus& m : members->status(Clock::now()).members) {
      if (!m.alive) continue;
      if (static_cast<int>(m.devices.size()) != o.devices && skip_odd) continue;
      if (static_cast<int>(m.devices.size()) != o.devices)
        return "node " + std::to_string(m.rank) + " has " + std::to_string(m.devices.size()) + " devices and the coordinator " +
               std::to_string(o.devices) + "; transitions need the same on every node";
      nodes.push_back({m.rank, parse_endpoint(m.listen, "node listen address"), m.clock_offset_ns, m.clock_rtt_ns});
    }
    return {};
  }

  /// Runs `drive(nodes)` (a transition or a job) over the alive nodes for a client, one at
  /// a time, and counts it.
  template <class Drive>
  asio::awaitable<Body> drive_alive(const std::string& what, const Drive& drive) {
    if (!members) co_return ErrorReply{"node " + std::to_string(o.launch.node_rank) + " is not the coordinator"};
    if (driving) co_return ErrorReply{"a transition is already running"};
    std::vector<NodeAddress> nodes;
    if (std::string e = alive_nodes(nodes); !e.empty()) co_return ErrorReply{e};
    driving = true;
    log(LogLevel::info, "{} begins over {} nodes", what, nodes.size());
    TransitionOutcome outcome;
    std::string error;
    const auto t0 = Clock::now();
    try {
      outcome = co_await drive(nodes);
    } catch (const std::exception& e) {
      error = e.what();
    }
    driving = false;
    metrics.transition_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    ++(!error.empty() || outcome.failed ? metrics.transitions_failed : metrics.transitions_ok);
    if (!error.empty()) {
      log(LogLevel::warn, "{} failed: {}", what, error);
      co_return ErrorReply{error};
    }
    log(LogLevel::info, "{} over {} nodes done{}", what, nodes.size(), outcome.failed ? " (with a failure: see the report)" : "");
    co_return TransitionResult{outcome.report};
  }

  // The coordinator runs a transition across the alive nodes for a client.
  asio::awaitable<Body> transition(const TransitionSpec& spec, std::uint64_t request_id) {
    const auto drive = [&](const std::vector<NodeAddress>& nodes) { return drive_transition(spec, nodes, o.devices, o.token); };
    const std::string what = fmt::format("request {}: transition {} {} -> {}", request_id, spec.model, spec.from, spec.to);
    Body answer = co_await drive_alive(what, drive);
    co_return answer;
  }

  // The coordinator runs a job's plan change across the alive nodes for a client; a node
  // its heartbeats lose counts as lost in the job too.
  asio::awaitable<Body> run_job(const JobRequest& request, std::uint64_t request_id) {
    const auto membership = [this](int rank) {
      if (rank == o.launch.node_rank) return true;
      for (const NodeStatus& m : members->status(Clock::now()).members)
        if (m.rank == rank) return m.alive;
      return false;
    };
    const auto roster = [this] {  // the alive nodes now: a restarted node joins the job at its next step
      std::vector<NodeAddress> nodes;
      (void)alive_nodes(nodes, true);
      return nodes;
    };
    const auto drive = [&](const std::vector<NodeAddress>& nodes) {
      return drive_job(request, nodes, o.devices, o.device_capacity, o.token, membership, roster);
    };
    const std::string what = fmt::format("request {}: job", request_id);
    Body answer = co_await drive_alive(what, drive);
    if (const auto* done = std::get_if<TransitionResult>(&answer)) metrics.add_job_report(done->json);
    co_return answer;
  }

  ClusterStatus status() {
    if (members) {
      members->heartbeat(0, self_session, device_info(), Clock::now(), 0, 0);
      return members->status(Clock::now());
    }
    NodeStatus me{o.launch.node_rank, true, reachable_at().str(), static_cast<std::int32_t>(::getpid()), 0,
                  metrics.heartbeats_sent, static_cast<std::uint32_t>(metrics.joins), device_info()};
    return {o.launch.nodes, {me}};
  }

  // The coordinator's side of a node: Join, then heartbeats (each answered, so the node
  // notices a silent coordinator too) until the connection ends or goes quiet.
  asio::awaitable<void> node_session(Channel& ch) {
    Envelope first = co_await ch.receive(o.handshake_limit);
    ++metrics.frames_received;
    auto* join = std::get_if<Join>(&first.body);
    if (!join) throw Error(std::string("expected join, got ") + kind_name(first.body));
    std::uint64_t session = 0;
    const int rank = join->node_rank;
    std::string refused;
    try {
      session = members->join(*join, Clock::now());
    } catch (const Error& e) {
      refused = e.what();
    }
    if (!refused.empty()) {  // answered outside the handler: no co_await inside catch
      Body no = ErrorReply{refused};
      co_await reply(ch, first.request_id, std::move(no));
      throw Error("join refused: " + refused);
    }
    log(LogLevel::info, "node {} joined from {} (pid {}, {} devices)", rank, join->listen, join->pid, join->devices.size());
    Body welcome = Welcome{members->nodes()};
    co_await reply(ch, first.request_id, std::move(welcome));
    std::string why = "connection closed";
    try {
      for (;;) {
        Envelope m = co_await ch.receive(o.dead_after);
        ++metrics.frames_received;
        auto* hb = std::get_if<Heartbeat>(&m.body);
        if (!hb) throw Error(std::string("unexpected ") + kind_name(m.body) + " from node " + std::to_string(rank));
        if (!members->heartbeat(rank, session, hb->devices, Clock::now(), hb->offset_ns, hb->rtt_ns))
          throw Error("superseded by a rejoin");
        Body ack = Heartbeat{hb->sequence, {}, node_clock_ns()};  // the node's clock-sync sample (clock_sync.hpp)
        co_await reply(ch, m.request_id, std::move(ack));
      }
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (why.find("integrity check") != std::string::npos) ++metrics.dropped["integrity"];
    if (!stopping && members->lost(rank, session, why)) log(LogLevel::warn, "node {} lost: {}", rank, why);
  }

  asio::awaitable<void> sweep_loop() {
    asio::steady_timer t(io);
    for (;;) {
      t.expires_after(Millis(100));
      auto [ec] = co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
      if (ec) co_return;
      members->heartbeat(0, self_session, device_info(), Clock::now(), 0, 0);
      for (int r : members->sweep(Clock::now())) log(LogLevel::warn, "node {} lost: {}", r, members->last_loss(r));
    }
  }

  // ---- a node's link to the coordinator -----------------------------------------------

  asio::awaitable<void> join_loop() {
    const Endpoint& at = o.launch.coordinator_at;
    auto deadline = Clock::now() + o.join_limit;
    for (;;) {
      const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
      if (left <= Millis(0)) throw Error("cannot reach the coordinator at " + at.str() + " within " +
                                         std::to_string(o.join_limit.count()) + " ms");
      std::optional<Channel> ch;
      try {
        ch.emplace(co_await connect_to(at.host, at.port, left), o.frame_cap);
        ch->set_peer("coordinator " + at.str());
      } catch (const Error& e) {
        throw Error(std::string(e.what()) + " (is the coordinator running?)");
      }
      bool joined = false;
      try {
        const Hello hello{Role::node, o.launch.node_rank, o.launch.nodes, {}};
        co_await authenticate_as_client(*ch, o.token, hello, o.handshake_limit);
        Body join = Join{o.launch.node_rank, o.launch.nodes, reachable_at().str(), device_info(), static_cast<std::int32_t>(::getpid())};
        Envelope r = co_await ch->call(std::move(join), o.handshake_limit);
        if (auto* e = std::get_if<ErrorReply>(&r.body)) throw Error("the coordinator refused the join: " + e->message);
        if (!std::holds_alternative<Welcome>(r.body)) throw Error(std::string("the coordinator answered join with ") + kind_name(r.body));
        joined = true;
        ++metrics.joins;
        log(LogLevel::info, "joined the coordinator at {} ({})", at.str(), metrics.joins == 1 ? "first join" : "rejoin");
        co_await heartbeat(*ch);
      } catch (const Error& e) {
        if (stopping) co_return;
        const std::string what = e.what();
        // A refusal is final: another try would be refused the same way.
        if (!joined && (what.find("refused") != std::string::npos || what.find("prove") != std::string::npos)) throw;
        log(LogLevel::warn, "lost the coordinator: {}; rejoining", what);
      }
      ch->close();
      if (joined) deadline = Clock::now() + o.join_limit;
      asio::steady_timer t(io, Millis(200));
      co_await t.async_wait(asio::use_awaitable);
    }
  }

  // Sends a heartbeat every heartbeat_every and reads the answers; ends (throws) when the
  // coordinator closes or stays silent for dead_after. Each exchange is a clock-sync
  // sample; each beat carries the estimate so far, and the second beat follows the first
  // at once so that the coordinator knows this node's clock right after the join.
  asio::awaitable<void> heartbeat(Channel& ch) {
    std::uint64_t seq = 0;
    ClockSync sync;
    asio::steady_timer t(io);
    for (;;) {
      ++seq;
      const std::optional<ClockOffset> known = sync.estimate();
      const std::int64_t t1 = node_clock_ns();
      const Heartbeat hb{seq, device_info(), t1, known ? known->offset_ns : 0, known ? known->rtt_ns : -1};
      const Envelope beat{kProtocolVersion, seq, static_cast<std::uint32_t>(o.dead_after.count()), hb};
      co_await ch.send(beat);
      ++metrics.heartbeats_sent;
      ++metrics.frames_sent;
      Envelope ack = co_await ch.receive(o.dead_after);
      ++metrics.frames_received;
      auto* answer = std::get_if<Heartbeat>(&ack.body);
      if (!answer) throw Error(std::string("the coordinator sent ") + kind_name(ack.body));
      sync.add(t1, answer->clock_ns, node_clock_ns());
      if (known) {
        t.expires_after(o.heartbeat_every);
        co_await t.async_wait(asio::use_awaitable);
      }
    }
  }

  // ---- metrics ------------------------------------------------------------------------

  asio::awaitable<void> metrics_loop() {
    for (;;) {
      auto [ec, sock] = co_await metrics_acceptor.async_accept(asio::as_tuple(asio::use_awaitable));
      if (ec) {
        if (stopping || ec == asio::error::operation_aborted) co_return;
        continue;
      }
      scope.spawn(metrics_request(std::move(sock)));
    }
  }

  asio::awaitable<void> metrics_request(tcp::socket sock) {
    asio::streambuf buf(8192);  // a request line and headers; more is refused
    asio::steady_timer watchdog(io, Millis(5000));  // a client that trickles is cut off
    auto done = std::make_shared<bool>(false);
    watchdog.async_wait([&sock, done](boost::system::error_code ec) {
      boost::system::error_code ignored;
      if (!ec && !*done) sock.close(ignored);
    });
    auto [ec, n] = co_await asio::async_read_until(sock, buf, "\r\n\r\n", asio::as_tuple(asio::use_awaitable));
    *done = true;
    watchdog.cancel();
    if (ec) co_return;
    std::string line(asio::buffers_begin(buf.data()), asio::buffers_begin(buf.data()) + static_cast<std::ptrdiff_t>(n));
    line = line.substr(0, line.find("\r\n"));
    std::string body, status = "200 OK";
    if (line.rfind("GET /metrics ", 0) == 0 || line.rfind("GET / ", 0) == 0) {
      refresh_metrics();
      body = render_prometheus(metrics);
    } else {
      status = "404 Not Found";
      body = "GET /metrics\n";
    }
    const std::string head = fmt::format("HTTP/1.0 {}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n",
                                         status, body.size());
    std::array<asio::const_buffer, 2> out{asio::buffer(head), asio::buffer(body)};
    co_await asio::async_write(sock, out, asio::as_tuple(asio::use_awaitable));
    boost::system::error_code ignored;
    sock.shutdown(tcp::socket::shutdown_both, ignored);
  }
};

Daemon::Daemon(asio::io_context& io, DaemonOptions options) : s_(std::make_unique<State>(io, std::move(options))) {}
Daemon::~Daemon() = default;

void Daemon::bind() {
  open_acceptor(s_->acceptor, endpoint_of(s_->io, s_->o.launch.listen, "--listen"), "cannot listen on");
  if (s_->o.metrics) open_acceptor(s_->metrics_acceptor, endpoint_of(s_->io, *s_->o.metrics, "--metrics"), "cannot serve metrics on");
}

Endpoint Daemon::listening() const { return s_->listening(); }
Endpoint Daemon::reachable_at() const { return s_->reachable_at(); }

std::optional<Endpoint> Daemon::metrics_listening() const {
  if (!s_->metrics_acceptor.is_open()) return std::nullopt;
  const auto ep = s_->metrics_acceptor.local_endpoint();
  return Endpoint{ep.address().to_string(), ep.port()};
}

asio::awaitable<void> Daemon::run() {
  State& s = *s_;
  if (!s.acceptor.is_open()) bind();
  s.scope.spawn(s.accept_loop());
  if (s.metrics_acceptor.is_open()) s.scope.spawn(s.metrics_loop());
  if (s.members) {
    Join self{0, s.o.launch.nodes, s.reachable_at().str(), s.device_info(), static_cast<std::int32_t>(::getpid())};
    s.self_session = s.members->join(self, Clock::now());
    s.scope.spawn(s.sweep_loop());
  } else {
    s.scope.spawn([](State& st) -> asio::awaitable<void> {
      try {
        co_await st.join_loop();
      } catch (const std::exception& e) {
        if (!st.stopping) st.finish(e.what());
      }
    }(s));
  }
  co_await s.stopped.async_wait(asio::as_tuple(asio::use_awaitable));
  s.finish("");
  try {
    co_await s.scope.join();
  } catch (const std::exception&) {  // sessions end with their own errors; already logged
  }
  if (!s.fatal.empty()) throw Error(s.fatal);
}

void Daemon::stop() { s_->finish(""); }

void Daemon::stop_after(Millis grace) {
  if (s_->answering == 0) return s_->finish("");
  s_->scope.spawn(s_->finish_when_answered(grace));
}

bool Daemon::stuck() const { return s_->metrics.stuck_parts > 0; }

}  // namespace nereus::cluster
