// A job's units across daemons: the coordinator's driver (job_graph_run.hpp), its
// sessions to the nodes and the units they hold. The controller and the transition graph
// number GPUs 0..n−1 over the alive nodes' devices (the pool); messages to the nodes carry
// global device ids. What the job does when is job_steps.cpp.
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "job_graph_run.hpp"
#include "unit_build.hpp"
#include "nereus/cluster/auth.hpp"
#include "nereus/base/error.hpp"
#include "nereus/base/log.hpp"
#include "nereus/core/stage_state.hpp"
#include "nereus/plan/reshard.hpp"

namespace nereus::cluster::detail {

DeviceId Pool::index(DeviceId device) const {
  auto it = std::find(devices.begin(), devices.end(), device);
  if (it == devices.end()) throw Error("device " + std::to_string(device) + " is not on an alive node");
  return static_cast<DeviceId>(it - devices.begin());
}

GlobalPlan Pool::to_devices(const GlobalPlan& p) const {
  GlobalPlan out = p;
  for (auto& [name, spec] : out.stages)
    for (DeviceId& d : spec.devices) d = device(d);
  return out;
}

GlobalPlan Pool::to_indices(const GlobalPlan& p) const {
  GlobalPlan out = p;
  for (auto& [name, spec] : out.stages)
    for (DeviceId& d : spec.devices) d = index(d);
  return out;
}

JobDriver::JobDriver(asio::any_io_executor ex, const JobRequest& r, int per_node, const std::string& token,
                     std::function<bool(int)> membership)
    : ex_(ex), request_(r), per_(per_node), token_(token), job_(parse_job(r.job, "the job")), stages_(model_stages(job_)),
      pumps_(ex), changed_(ex), membership_(std::move(membership)), two_sided_(r.two_sided) {}

asio::awaitable<std::unique_ptr<JobDriver::Session>> JobDriver::open_session(const NodeAddress& n) {
  auto s = std::make_unique<Session>();
  s->rank = n.rank;
  auto ch = std::make_unique<Channel>(co_await connect_to(n.listen.host, n.listen.port, Millis(5000)));
  ch->set_peer("node " + std::to_string(n.rank) + " (" + n.listen.str() + ")");
  const Hello hello{Role::client, -1, 0, {}};
  co_await authenticate_as_client(*ch, token_, hello, Millis(5000));
  s->ch = std::move(ch);
  co_return s;
}

asio::awaitable<void> JobDriver::connect(const std::vector<NodeAddress>& nodes) {
  for (const NodeAddress& n : nodes) {
    std::unique_ptr<Session> s;
    try {
      s = co_await open_session(n);
    } catch (const std::exception& e) {  // died since the membership last saw it: lost before the job began
      s = std::make_unique<Session>();
      s->rank = n.rank;
      lose(*s, e.what());
    }
    sessions_.push_back(std::move(s));
  }
  for (auto& s : sessions_)
    if (s->ch) pumps_.spawn(pump(*s));
  if (membership_) pumps_.spawn(watch_membership());
  if (alive().empty()) throw Error("no node of the job could be reached (node " + std::to_string(nodes.at(0).rank) + ": " + sessions_.at(0)->lost + ")");
  // No NCCL unique id (nccl_bootstrap.hpp): each would keep a thread and a socket of
  // NCCL's for the coordinator's life until an NCCL transport connects to it.
  const Body open = JobOpen{request_.job, per_, request_.kill_node, request_.freeze_node, {}, request_.inject_at, request_.two_sided};
  Peers peers;
  for (auto& [rank, e] : co_await each_surviving(alive(), open, "job-open")) {
    session(rank).info = std::get<Ready>(e.body).info;
    peers.all.push_back(session(rank).info);
    two_sided_ = two_sided_ || !session(rank).info.machine.empty();  // GPU daemons: messages across machines
  }
  const Body b = peers;
  co_await each_surviving(alive(), b, "peers");
}

asio::awaitable<bool> JobDriver::admit(const NodeAddress& n) {
  auto it = std::find_if(sessions_.begin(), sessions_.end(), [&](const auto& s) { return s->rank == n.rank; });
  if (it != sessions_.end() && (*it)->alive) co_return false;
  // A lost session's pump has ended (it is what marked the session lost): safe to replace.
  std::unique_ptr<Session> fresh = co_await open_session(n);
  Session& s = *fresh;
  if (it != sessions_.end()) {
    *it = std::move(fresh);
  } else {
    sessions_.push_back(std::move(fresh));
  }
  pumps_.spawn(pump(s));
  const Body open = JobOpen{request_.job, per_, -1, -1, {}, {}, request_.two_sided};
  s.info = std::get<Ready>((co_await call(n.rank, open, "job-open")).body).info;
  two_sided_ = two_sided_ || !s.info.machine.empty();
  Peers everyone;
  for (int r : alive()) everyone.all.push_back(session(r).info);
  const Body to_joiner = everyone, to_others = Peers{{s.info}};
  std::vector<int> others = alive();
  std::erase(others, n.rank);
  co_await call(n.rank, to_joiner, "peers");
  co_await each_surviving(others, to_others, "peers");
  co_return true;
}

void JobDriver::lose(Session& s, const std::string& why) {
  log(LogLevel::debug, "job", "node {} lost to the job: {}", s.rank, why);
  s.alive = false;
  s.lost = why;
  s.lost_at = clock::now();
  if (s.ch) s.ch->close();  // a send still in flight or in line to it ends now rather than never
  for (auto& [id, p] : s.pending) p->timer.cancel();
  changed_.notify();
}

asio::awaitable<void> JobDriver::watch_membership() {
  asio::steady_timer tick(ex_);
  while (!closing_) {
    for (auto& s : sessions_)
      if (s->alive && !membership_(s->rank)) {
        s->silent = true;  // its pump ends once the channel is closed
        s->ch->close();
      }
    tick.expires_after(std::chrono::milliseconds(100));
    co_await tick.async_wait(asio::use_awaitable);
  }
}

asio::awaitable<void> JobDriver::pump(Session& s) {
  std::string lost;
  for (;;) {
    try {
      Envelope e = co_await s.ch->receive(std::chrono::hours(24));
      if (auto it = s.pending.find(e.request_id); it != s.pending.end()) {
        it->second->reply = std::move(e);
        it->second->timer.cancel();
      }
      continue;
    } catch (const std::exception& e) {
      lost = e.what();
    }
    break;
  }
  lose(s, s.silent ? "no heartbeat from it (the membership lost it)" : lost);
}

std::vector<int> JobDriver::alive() const {
  std::vector<int> out;
  for (const auto& s : sessions_)
    if (s->alive) out.push_back(s->rank);
  return out;
}

bool JobDriver::in_job(int rank) const {
  for (const auto& s : sessions_)
    if (s->rank == rank) return s->alive;
  return false;
}

std::vector<int> JobDriver::lost() const {
  std::vector<int> out;
  for (const auto& s : sessions_)
    if (!s->alive) out.push_back(s->rank);
  return out;
}

std::string JobDriver::lost_why(int rank) const {
  for (const auto& s : sessions_)
    if (s->rank == rank) return s->lost;
  return {};
}

clock::time_point JobDriver::lost_at(int rank) const {
  for (const auto& s : sessions_)
    if (s->rank == rank) return s->lost_at;
  return {};
}

JobDriver::Session& JobDriver::session(int rank) {
  for (auto& s : sessions_)
    if (s->rank == rank) return *s;
  throw Error("node " + std::to_string(rank) + " is not part of this job");
}

asio::awaitable<Envelope> JobDriver::call(int rank, const Body& body, const char* what) {
  Session& s = session(rank);
  if (!s.alive) throw Error("node " + std::to_string(rank) + " lost: " + s.lost);
  const std::uint64_t id = ++request_ids_;
  const auto limit = std::chrono::duration_cast<Millis>(std::chrono::duration<double>(request_.timeout_seconds));
  Session::Pending p{asio::steady_timer(ex_), std::nullopt};
  p.timer.expires_after(limit);
  s.pending[id] = &p;
  const Envelope e{kProtocolVersion, id, static_cast<std::uint32_t>(limit.count()), body};
  log(LogLevel::debug, "job", "{} to node {} (request {})", what, rank, id);
  std::string send_error;
  try {
    co_await s.ch->send(e);
  } catch (const std::exception& x) {
    send_error = x.what();
  }
  // Every wake-up (a reply, a lost node, giving up) cancels the timer and sets what is
  // checked here first: a request sent after give_up() must not wait out its whole limit
  // (a build pulling from a dead node never answers).
  if (send_error.empty() && !p.reply && s.alive && !giving_up_) {
    try {
      co_await p.timer.async_wait(asio::use_awaitable);
    } catch (const boost::system::system_error&) {  // cancelled: a reply, a lost node, or giving up
    }
  }
  s.pending.erase(id);
  log(LogLevel::debug, "job", "{} to node {} (request {}): {}", what, rank, id, p.reply ? "answered" : s.alive ? "no answer" : "node lost");
  const std::string who = "node " + std::to_string(rank);
  if (p.reply) {
    if (auto* f = std::get_if<Failed>(&p.reply->body)) throw Error(who + ": " + f->error);
    if (auto* r = std::get_if<ErrorReply>(&p.reply->body)) throw Error(who + ": " + r->message);
    co_return std::move(*p.reply);
  }
  if (!s.alive) throw Error(who + " lost during '" + what + "': " + s.lost);
  if (!send_error.empty()) throw Error(who + ": " + send_error);
  if (giving_up_) throw Error(who + ": '" + what + "' would not stop");
  throw Error(who + ": no answer to '" + what + "' within " + std::to_string(limit.count() / 1000.0) + " s");
}

asio::awaitable<void> JobDriver::call_into(int rank, Body body, const char* what, Envelope* out, std::string* error) {
  try {
    *out = co_await call(rank, body, what);
  } catch (const std::exception& e) {
    *error = e.what();
  }
}

asio::awaitable<std::vector<Envelope>> JobDriver::each(const std::vector<int>& ranks, const Body& body, const char* what) {
  std::vector<Envelope> out(ranks.size());
  std::vector<std::string> errors(ranks.size());
  {
    AsyncScope scope(ex_);
    for (std::size_t i = 0; i < ranks.size(); ++i) scope.spawn(call_into(ranks[i], body, what, &out[i], &errors[i]));
    co_await scope.join();
  }
  for (const std::string& e : errors)
    if (!e.empty()) throw Error(e);
  co_return out;
}

asio::awaitable<std::vector<std::pair<int, Envelope>>> JobDriver::each_surviving(const std::vector<int>& ranks, const Body& body,
                                                                                   const char* what) {
  std::vector<Envelope> got(ranks.size());
  std::vector<std::string> errors(ranks.size());
  {
    AsyncScope scope(ex_);
    for (std::size_t i = 0; i < ranks.size(); ++i) scope.spawn(call_into(ranks[i], body, what, &got[i], &errors[i]));
    co_await scope.join();
  }
  std::vector<std::pair<int, Envelope>> out;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (errors[i].empty()) {
      out.emplace_back(ranks[i], std::move(got[i]));
    } else if (session(ranks[i]).alive) {
      throw Error(errors[i]);
    }
  }
  co_return out;
}

std::vector<int> JobDriver::nodes_of(const Emu& e) const {
  std::set<int> ranks;
  for (DeviceId d : e.gpus) ranks.insert(static_cast<int>(d) / per_);
  return {ranks.begin(), ranks.end()};
}

UnitDesc JobDriver::describe(std::uint32_t id) const {
  const UnitRecord& u = units_.at(id);
  return {id, stages_[u.stage].name(), to_string(CollectionSpec{u.emu.layout, 1, u.emu.gpus})};
}

std::vector<int> JobDriver::senders(const UnitBuild& b) const {
  // The plan every node of the build derives from the same message (node_job.cpp), so the
  // nodes that send are exactly those this finds.
  std::set<int> out;
  for (const Transfer& t : detail::plan_build(stages_, b).transfers())
    if (node_of(t.src) != node_of(t.dst)) out.insert(node_of(t.src));
  return {out.begin(), out.end()};
}

std::uint32_t JobDriver::add_unit(std::size_t stage, const Emu& emu) {
  const std::uint32_t id = next_unit_++;
  units_[id] = UnitRecord{stage, emu, {}};
  return id;
}

asio::awaitable<void> JobDriver::allocate(std::uint32_t id, bool fill, int replica) {
  const Body alloc = UnitAlloc{describe(id), fill, replica};
  const std::vector<Envelope> got = co_await each(nodes_of(units_.at(id).emu), alloc, "unit-alloc");
  for (const Envelope& e : got)
    for (const PeerInfo::Buffer& b : std::get<UnitAllocated>(e.body).buffers) units_.at(id).buffers.push_back(b);
}

asio::awaitable<void> JobDriver::abort_builds() {
  const Body abort = Abort{};
  for (int r : alive()) {
    Envelope e;
    std::string error;
    co_await call_into(r, abort, "abort", &e, &error);
  }
}

void JobDriver::give_up() {
  giving_up_ = true;
  for (auto& s : sessions_)
    for (auto& [id, p] : s->pending) p->timer.cancel();
}

asio::awaitable<std::vector<RunDone>> JobDriver::build(std::uint32_t id, const std::vector<std::vector<std::uint32_t>>& groups) {
  // A build's messages carry its number in their tags: concurrent builds share the nodes'
  // transports. (Mod 256: a message left by an aborted build matches no build until 256 later.)
  UnitBuild b{id, {}, describe(id), builds_++};
  for (std::uint32_t g = 0; g < groups.size(); ++g)
    for (std::uint32_t u : groups[g]) b.sources.push_back({describe(u), g, units_.at(u).buffers});
  const Body body = b;
  std::vector<int> ranks = nodes_of(units_.at(id).emu);
  if (two_sided_) {  // the nodes that send to it take part: their answer says their sends completed
    std::set<int> all(ranks.begin(), ranks.end());
    for (int r : senders(b)) all.insert(r);
    ranks.assign(all.begin(), all.end());
  }
  const std::vector<Envelope> got = co_await each(ranks, body, "unit-build");
  std::vector<RunDone> out;
  for (const Envelope& e : got) out.push_back(std::get<RunDone>(e.body));
  if (timeline_)
    for (std::size_t i = 0; i < out.size(); ++i)
      timeline_->transfers(ranks[i], out[i], stages_[units_.at(id).stage].name() + " unit " + std::to_string(id));
  co_return out;
}

asio::awaitable<void> JobDriver::release(std::uint32_t id) {
  auto it = units_.find(id);
  if (it == units_.end()) co_return;
  std::vector<int> on;
  for (int r : nodes_of(it->second.emu))
    if (session(r).alive) on.push_back(r);
  units_.erase(it);
  const Body f = UnitFree{id};
  co_await each(on, f, "unit-free");
}

asio::awaitable<nlohmann::json> JobDriver::rebuild_lost_stages() {
  // The holder of each model-stage left without units: a training stage of its model when
  // one kept units (it has the newest params), else any stage of its model that did.
  std::vector<std::pair<std::size_t, std::size_t>> rebuild;  // (stage, holder)
  std::vector<std::string> gone;
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    if (!current_[i].empty()) continue;
    std::optional<std::size_t> holder;
    for (std::size_t k = 0; k < stages_.size(); ++k)
      if (k != i && !current_[k].empty() && stages_[k].holds_state_of(stages_[i]) &&
          (!holder || (stages_[k].kind == StageKind::train && stages_[*holder].kind != StageKind::train)))
        holder = k;
    if (holder) rebuild.emplace_back(i, *holder);
    else gone.push_back(stages_[i].name());
  }
  if (!gone.empty()) {
    std::string names;
    for (const std::string& n : gone) names += (names.empty() ? "" : ", ") + n;
    throw Error("every unit of " + names + " had a GPU on a lost node and no surviving model-stage holds " +
                (gone.size() > 1 ? "their" : "its") + " state: it cannot be recovered from the survivors");
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [i, k] : rebuild) {
    std::uint64_t bytes = 0;
    std::vector<std::uint32_t> built;
    for (std::uint32_t h : current_[k]) {  // a copy of each holder unit's layout on its GPUs
      const std::uint32_t id = add_unit(i, units_.at(h).emu);
      co_await allocate(id, false);
      const std::vector<std::vector<std::uint32_t>> from{{h}};
      const std::vector<RunDone> runs = co_await build(id, from);  // named: GCC 12 and co_await temporaries
      for (const RunDone& r : runs) bytes += r.link_bytes + r.local_bytes;
      built.push_back(id);
    }
    current_[i] = built;
    out.push_back({{"model_stage", stages_[i].name()}, {"from", stages_[k].name()}, {"units", built.size()}, {"bytes", bytes}});
  }
  co_return out;
}

bool JobDriver::intact(std::uint32_t id) const {
  for (int r : nodes_of(units_.at(id).emu))
    for (const auto& s : sessions_)
      if (s->rank == r && !s->alive) return false;
  return true;
}

asio::awaitable<void> JobDriver::load(const GlobalPlan& plan, const Pool& pool) {
  const std::vector<Collection> cs = plan_collections(job_, pool.to_devices(plan));
  current_.assign(cs.size(), {});
  for (std::size_t i = 0; i < cs.size(); ++i)
    for (std::size_t r = 0; r < cs[i].units.size(); ++r) {
      const Emu& e = cs[i].units[r];
      const std::uint32_t id = add_unit(i, e);
      current_[i].push_back(id);
      if (!intact(id)) continue;  // a GPU on a lost node: drop_lost_units() drops it
      try {
        co_await allocate(id, true, static_cast<int>(r));
      } catch (const std::exception&) {
        if (intact(id)) throw;  // else one of its nodes was lost meanwhile: dropped the same way
      }
    }
}

asio::awaitable<void> JobDriver::drop_lost_units() {
  const std::int64_t batch = job_.prompts_per_step * job_.samples_per_prompt;
  for (std::vector<std::uint32_t>& ids : current_) {
    std::vector<std::uint32_t> keep, drop;
    for (std::uint32_t id : ids) (intact(id) ? keep : drop).push_back(id);
    while (keep.size() > 1 && !dp_allowed(batch, static_cast<int>(keep.size()))) {
      drop.push_back(keep.back());
      keep.pop_back();
    }
    ids = keep;
    for (std::uint32_t id : drop) {
      try {
        co_await release(id);
      } catch (const std::exception&) {  // a node that never allocated it, or is lost meanwhile
      }
    }
  }
}

GlobalPlan JobDriver::plan_of(const Pool& pool) const {
  GlobalPlan p;
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    CollectionSpec spec;
    spec.dp = static_cast<int>(current_[i].size());
    for (std::uint32_t id : current_[i]) {
      const Emu& e = units_.at(id).emu;
      spec.layout = e.layout;
      for (DeviceId d : e.gpus) spec.devices.push_back(pool.index(d));
    }
    p.stages.push_back({stages_[i].name(), spec});
  }
  return p;
}

asio::awaitable<std::vector<std::pair<int, StepDone>>> JobDriver::step(std::int64_t step, double response_len,
                                                                     StepStream stream, std::int64_t weight_version) {
  StepRun run{step, response_len, {}, static_cast<std::uint8_t>(stream), weight_version};
  std::set<int> holders;  // a stream's step goes to the nodes that hold its units; a whole step to every node
  for (std::size_t s = 0; s < current_.size(); ++s) {
    if (stream != StepStream::whole && (stages_[s].kind == StageKind::generate) != (stream == StepStream::generation)) continue;
    for (std::size_t i = 0; i < current_[s].size(); ++i) {
      run.units.push_back({current_[s][i], stages_[s].name(), static_cast<std::uint32_t>(i)});
      for (int r : nodes_of_unit(current_[s][i])) holders.insert(r);
    }
  }
  std::vector<int> ranks = alive();
  if (stream != StepStream::whole) std::erase_if(ranks, [&](int r) { return !holders.count(r); });
  const Body b = std::move(run);
  std::vector<std::pair<int, StepDone>> out;
  for (auto& [rank, e] : co_await each_surviving(ranks, b, "step")) {
    auto* d = std::get_if<StepDone>(&e.body);
    if (!d) throw Error("node " + std::to_string(rank) + " answered a step with " + kind_name(e.body));
    out.emplace_back(rank, std::move(*d));
  }
  co_return out;
}

asio::awaitable<nlohmann::json> JobDriver::verify() {
  const Body v = Verify{false};
  const std::vector<Envelope> got = co_await each(alive(), v, "verify");
  bool ok = true;
  std::uint64_t bytes = 0;
  std::string error;
  for (const Envelope& e : got) {
    const auto& m = std::get<Verified>(e.body);
    ok = ok && m.targets_ok;
    bytes += m.bytes;
    if (!m.targets_ok && error.empty()) error = m.error;
  }
  nlohmann::json out{{"verified", ok}, {"verified_bytes", bytes}};
  if (!error.empty()) out["verify_error"] = error;
  co_return out;
}

asio::awaitable<void> JobDriver::close() {
  const Body finish = Finish{};
  for (int r : alive()) {  // best effort: a node that does not answer frees its job when the channel ends
    Envelope e;
    std::string error;
    co_await call_into(r, finish, "finish", &e, &error);
  }
  closing_ = true;
  for (auto& s : sessions_)
    if (s->ch) s->ch->close();
  co_await pumps_.join();
}

}  // namespace nereus::cluster::detail
