// A job's units across daemons: a node's part (job_service.hpp).
#include <signal.h>

#include <algorithm>
#include <map>
#include <set>

#include "nereus/cluster/clock_sync.hpp"
#include "nereus/cluster/job_service.hpp"
#include "nereus/cluster/step_host.hpp"
#include "nereus/base/device.hpp"
#include "nereus/base/error.hpp"
#include "nereus/base/log.hpp"
#include "nereus/core/global_plan.hpp"
#include "nereus/core/packing.hpp"
#include "nereus/runtime/async_scope.hpp"
#include "nereus/runtime/executor.hpp"
#include "nereus/runtime/unit_store.hpp"
#include "nereus/transport/cuda.hpp"
#include "nereus/transport/local.hpp"
#include "nereus/transport/mixed.hpp"
#include "nereus/transport/ucx.hpp"
#include "nccl_bootstrap.hpp"
#include "nereus/base/offload.hpp"
#include "unit_build.hpp"

namespace nereus::cluster {

namespace {

/// A unit of the job, as much of it as lives on this node.
struct LocalUnit {
  Collection one;  ///< the unit alone, as a collection of one
  std::vector<BufferSpec> buffers;
  std::vector<DeviceBuffer> memory;  ///< in the arenas, or borrowed: the framework's adopted memory
  int readers = 0;  ///< builds on this node reading it
  bool building = false;
};

}  // namespace

FaultMoment parse_fault_moment(const std::string& text) {
  if (text.empty() || text == "build") return {};
  if (text == "load") return {FaultMoment::At::load, 0};
  if (text.size() > 2 && text.ends_with("ms")) {
    const std::string digits = text.substr(0, text.size() - 2);
    if (digits.size() <= 7 && digits.find_first_not_of("0123456789") == std::string::npos) {
      const int ms = std::stoi(digits);
      if (ms <= 3'600'000) return {FaultMoment::At::after_open, ms};
    }
  }
  throw Error("fault moment '" + text + "': expected build, load or a delay such as 250ms (at most 3600000ms)");
}

const char* to_string(StepStream s) {
  switch (s) {
    case StepStream::generation: return "generation";
    case StepStream::training: return "training";
    case StepStream::whole: break;
  }
  return "whole";
}

struct NodeJob::State {
  asio::io_context& io;
  int rank;
  std::vector<std::unique_ptr<Device>>& devices;
  Metrics& metrics;
  StepHost* host;  // the framework running this node's steps; null: steps are answered at once
  std::span<const AdoptedBuffer> adopt;  // the framework's memory for the units the job loads here
  std::string machine;                   // DaemonOptions::machine
  std::vector<char> adopted;             // per adopt entry: a loaded unit took it
  std::shared_ptr<const JobSpec> job;
  std::vector<ModelStage> stages;  // model_stages(*job)
  int per = 1;
  int kill_node = -1, freeze_node = -1;
  FaultMoment fault;
  Bytes nccl_id;
  bool two_sided = false;  // builds move links between nodes as tagged messages
  bool doomed = false;
  asio::steady_timer doom{io};
  std::unique_ptr<LocalTransport> local;  // copies within this node's host devices; from open() to close()
  std::unique_ptr<UcxTransport> ucx;     // between nodes (GPU memory: messages staged through host memory)
  std::unique_ptr<Transport> cuda;       // CUDA devices: copies here, CUDA IPC gets between nodes of one machine
  std::unique_ptr<MixedTransport> mixed;  // CUDA devices: IPC where it reaches, else UCX
  std::vector<Registration> regs;
  std::map<std::uint32_t, LocalUnit> units;
  std::vector<Executor*> active;
  AsyncScope builds{io.get_executor()};
  // Replies sent on the session's channel after the work (builds, steps): apart from the
  // builds, so that close() ends every one of them before the channel goes, even when it
  // must leave behind a build that would not stop (a UCX send to a frozen peer). Together,
  // a reply waiting its turn on the channel was left behind with such a build and resumed
  // into the freed channel (ASan, benches/soak.sh with ucx-tag).
  AsyncScope replies{io.get_executor()};
  std::shared_ptr<Channel*> reply_to;  // where builds and steps report; cleared when the session ends
  // Steps handed to the framework and not answered: their streams, and the units they hold
  // (an async job's two streams run at once, on disjoint units).
  std::set<int> streams_stepping;
  std::map<std::uint32_t, int> in_step;
  Offload offload;

  State(asio::io_context& i, int r, std::vector<std::unique_ptr<Device>>& d, Metrics& m, StepHost* h,
        std::span<const AdoptedBuffer> a)
      : io(i), rank(r), devices(d), metrics(m), host(h), adopt(a) {}

  std::string me() const { return "node " + std::to_string(rank); }

  /// The daemon's devices are GPU memory (nereusd --devices cuda:N).
  bool on_gpus() const { return !devices.empty() && devices.front()->kind() == MemoryKind::cuda; }
  Transport& remote() { return mixed ? *mixed : static_cast<Transport&>(*ucx); }
  Transport& copies() { return cuda ? *cuda : static_cast<Transport&>(*local); }

  Device* device(DeviceId d) {
    for (auto& dev : devices)
      if (dev->id() == d) return dev.get();
    return nullptr;
  }

  /// The unit a descriptor names, parsed and checked against the job.
  Collection collection_of(const UnitDesc& u) const { return detail::unit_collection(stages, u); }

  PeerInfo open(const JobOpen& m) {
    if (job) throw Error(me() + " already holds a job");
    if (m.devices_per_node < 1) throw Error("devices per node must be positive");
    job = std::make_shared<const JobSpec>(parse_job(m.job, "the job"));
    stages = model_stages(*job);
    per = m.devices_per_node;
    kill_node = m.kill_node;
    freeze_node = m.freeze_node;
    fault = parse_fault_moment(m.inject_at);
    if (fault.at == FaultMoment::At::after_open) strike_after(fault.ms);
    detail::check_nccl_id(m.nccl_id);
    nccl_id = m.nccl_id;  // for an NCCL communicator over the job's nodes (no NCCL transport yet)
    PeerInfo info;
    info.rank = static_cast<PeerId>(rank);
    // Without UCX's peer error handling (the default; see UcxOptions): gets go over shared
    // memory / CMA, and a failed endpoint reaches our error handler.
    ucx = std::make_unique<UcxTransport>(io);
    local = std::make_unique<LocalTransport>(LocalTransportOptions{2, 1 << 20});
    two_sided = m.two_sided;
    if (on_gpus()) {
      // CUDA IPC gets between daemons of one machine; across machines, UCX (the Debian build
      // has no CUDA support) as messages staged through host memory: the coordinator then
      // runs builds two-sided (PeerInfo::machine tells it these are GPU daemons).
      cuda = make_cuda_transport(io, {.machine = machine});
      mixed = std::make_unique<MixedTransport>(std::vector<Transport*>{cuda.get(), ucx.get()});
      two_sided = true;
      const std::vector<std::byte> id = cuda->address();
      info.machine.assign(reinterpret_cast<const char*>(id.data()), id.size());
    }
    info.address = remote().address();
    for (auto& dev : devices) {
      regs.push_back(remote().register_memory({dev->arena(), dev->capacity(), dev->id(), dev->kind()}));
      info.regions.push_back({dev->id(), regs.back().remote_key});
    }
    // The framework's buffers, each a region of its own: peers' gets and puts on them use
    // its key (the arenas' keys do not cover them).
    adopted.assign(adopt.size(), 0);
    for (const AdoptedBuffer& a : adopt) {
      const Device* dev = device(a.device);
      if (!dev) throw Error(me() + ": adopt: device " + std::to_string(a.device) + " is not one of its devices");
      if (dev->kind() != a.kind)
        throw Error(me() + ": adopt: device " + std::to_string(a.device) + " is " + std::string(to_string(dev->kind())) +
                    " memory, and the framework's buffer " + a.buffer + " " + std::string(to_string(a.kind)) + " memory");
      if (a.kind == MemoryKind::cuda && a.gpu != dev->gpu())
        throw Error(me() + ": adopt: device " + std::to_string(a.device) + " is on GPU " + std::to_string(dev->gpu()) +
                    ", and the framework's buffer " + a.buffer + " on GPU " + std::to_string(a.gpu));
      bool known = false;
      for (const ModelStage& st : stages) known = known || st.name() == a.model_stage;
      if (!known) throw Error(me() + ": adopt: '" + a.model_stage + "' is not a model-stage of the job");
      // GPU memory: its allocation's IPC handle for daemons of this machine (the cuda
      // transport finds the allocation holding the tensor); messages stage it elsewhere.
      regs.push_back(remote().register_memory({a.data, a.bytes, a.device, a.kind}));
      info.regions.push_back({a.device, regs.back().remote_key, reinterpret_cast<std::uint64_t>(a.data), a.bytes});
    }
    return info;
  }

  /// At the job's first step, which follows its load: an adopt entry no loaded unit took
  /// is named (the framework's view of the initial plan and the job's differ). A node that
  /// joins later takes no part in the load; graphs build its units in the arenas.
  void check_adoption(std::int64_t step) const {
    if (step != 1) return;
    for (std::size_t k = 0; k < adopt.size(); ++k)
      if (!adopted[k]) throw Error(me() + ": " + unmatched_adoption(adopt[k]));
  }

  /// Connects to every peer it can. A peer that died since it opened the job (its shared
  /// memory gone) is left unconnected rather than failing this node's part: the coordinator
  /// loses that peer too, and a build that would read from it fails naming it.
  void connect(const Peers& peers) {
    for (const PeerInfo& w : peers.all) {
      if (w.rank == static_cast<PeerId>(rank)) continue;
      if (Status st = remote().connect(w.rank, w.address); !st) {  // dead, or (CUDA IPC) on another machine
        log(LogLevel::warn, "job", "{}: no endpoint to node {}: {}", me(), w.rank, st.message());
        continue;
      }
      for (const auto& reg : w.regions)  // an adopted buffer's key covers its own range only
        if (Status st = remote().add_remote_region(w.rank, reg.device, reg.key, reg.base, reg.size); !st)
          throw Error(st.message());
    }
  }

  /// Fault injection (tests, the soak bench): when this node is the job's victim, it dies
  /// (SIGKILL) or stops (SIGSTOP) `ms` from now, once per job.
  void strike_after(int ms) {
    if ((kill_node != rank && freeze_node != rank) || doomed) return;
    doomed = true;
    const int sig = kill_node == rank ? SIGKILL : SIGSTOP;
    if (ms == 0) {
      ::raise(sig);  // now: before answering the request at hand
      return;
    }
    doom.expires_after(std::chrono::milliseconds(ms));
    doom.async_wait([sig](auto ec) {
      if (!ec) ::raise(sig);
    });
  }

  /// Allocates this node's buffers of a unit in the daemon's arenas, or borrows the
  /// framework's memory for those it adopted (a unit the job loads as replica `replica`).
  LocalUnit& allocate(const UnitDesc& u, int replica) {
    if (fault.at == FaultMoment::At::load) strike_after(0);
    if (units.contains(u.id)) throw Error(me() + " already holds unit " + std::to_string(u.id));
    LocalUnit unit{collection_of(u), {}, {}, 0, false};
    std::vector<DeviceId> mine;
    for (DeviceId d : unit.one.units[0].gpus)
      if (static_cast<int>(d) / per == rank) mine.push_back(d);
    if (mine.empty()) throw Error("unit " + std::to_string(u.id) + " (" + u.spec + ") has no GPU on " + me());
    unit.buffers = collection_buffers(unit.one, 0, mine);
    for (const BufferSpec& b : unit.buffers) {
      Device* dev = device(b.key.device);
      if (!dev) throw Error("device " + std::to_string(b.key.device) + " is not one of " + me() + "'s devices");
      const int k = replica < 0 ? -1
                                : adopted_for(adopt, u.model_stage, replica, b, buffer_name(*unit.one.model, b.key.buffer, b.packing, b.expert_groups));
      if (k >= 0) {
        adopted[static_cast<std::size_t>(k)] = 1;
        const AdoptedBuffer& a = adopt[static_cast<std::size_t>(k)];
        unit.memory.push_back(DeviceBuffer::borrow(a.data, a.bytes, a.kind));
      } else {
        unit.memory.push_back(dev->allocate(b.bytes(), u.model_stage + " unit " + std::to_string(u.id)));
      }
    }
    return units.emplace(u.id, std::move(unit)).first->second;
  }

  UnitAllocated located(std::uint32_t id) const {
    const LocalUnit& u = units.at(id);
    UnitAllocated out{id, {}};
    for (std::size_t b = 0; b < u.buffers.size(); ++b) {
      const BufferKey& k = u.buffers[b].key;
      out.buffers.push_back(
          {0, k.device, k.buffer, k.slot, reinterpret_cast<std::uint64_t>(u.memory[b].data()), u.memory[b].size(), u.memory[b].kind()});
    }
    return out;
  }

  LocalUnit& unit(std::uint32_t id) {
    auto it = units.find(id);
    if (it == units.end()) throw Error(me() + " holds no unit " + std::to_string(id));
    return it->second;
  }

  /// Pulls this node's bytes of unit `b.target` from its sources, and, two-sided, sends
  /// what its sources hold to the target's other nodes; replies when both are done.
  void build(const UnitBuild& b, std::uint64_t request) {
    const auto held_target = units.find(b.target);
    LocalUnit* target = held_target == units.end() ? nullptr : &held_target->second;
    if (!target && !two_sided) throw Error(me() + " holds no unit " + std::to_string(b.target));
    if (target && target->building) throw Error("unit " + std::to_string(b.target) + " is already being built");
    if (target && in_step.count(b.target)) throw Error("unit " + std::to_string(b.target) + " is in use by the framework's step");
    // The plan the coordinator derived too (JobDriver::senders), from the same message: every
    // node of the build binds its side of the same messages. It checks the message first.
    const ReshardPlan plan = detail::plan_build(stages, b);
    BufferTable table;
    std::vector<LocalUnit*> held;
    std::vector<DeviceId> mine;  // this node's devices the build touches
    for (const SourceUnit& s : b.sources) {
      for (const PeerInfo::Buffer& x : s.buffers) {
        const auto owner = static_cast<PeerId>(static_cast<int>(x.device) / per);
        table.bind({s.group, x.device, x.buffer, x.slot}, {x.address, x.bytes, owner, x.kind});
        if (two_sided && owner == static_cast<PeerId>(rank)) mine.push_back(x.device);  // it may send from here
      }
      if (auto it = units.find(s.unit.id); it != units.end()) held.push_back(&it->second);
    }
    if (target)
      for (std::size_t k = 0; k < target->buffers.size(); ++k) {
        const BufferKey& key = target->buffers[k].key;
        mine.push_back(key.device);
        table.bind({kTargetSide, key.device, key.buffer, key.slot},
                   {reinterpret_cast<std::uint64_t>(target->memory[k].data()), target->memory[k].size(), static_cast<PeerId>(rank),
                    target->memory[k].kind()});
      }
    std::sort(mine.begin(), mine.end());
    mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
    ExecutorOptions eo;
    eo.self = static_cast<PeerId>(rank);
    eo.two_sided = two_sided;  // GPU daemons: IPC peers keep their gets (link_path)
    eo.first_run = b.run;      // concurrent builds share the transport: their tags differ
    const int per_node = per;
    auto ex = std::make_shared<Executor>(copies(), &remote(), [per_node](DeviceId d) { return static_cast<PeerId>(static_cast<int>(d) / per_node); }, eo);
    const auto transfers = plan.transfers_touching(mine);
    auto bound = std::make_shared<BoundTransition>(ex->bind(transfers, plan.target(), table));
    if (fault.at == FaultMoment::At::build) strike_after(fault.ms);
    if (target) target->building = true;
    for (LocalUnit* u : held) ++u->readers;
    builds.spawn(run_build(b.target, std::move(held), ex, bound, request));
  }

  asio::awaitable<void> run_build(std::uint32_t id, std::vector<LocalUnit*> held, std::shared_ptr<Executor> ex,
                                  std::shared_ptr<BoundTransition> bound, std::uint64_t request) {
    auto reply = reply_to;
    Body body;
    active.push_back(ex.get());
    try {
      const ExecutionReport r = co_await ex->run(*bound);
      RunDone d{r.seconds, r.link_bytes, r.local_bytes, r.timings.size(), r.commits.size(), {}, r.started_ns + node_clock_skew_ns(), r.sent_bytes};
      for (const TransferTiming& t : r.timings)
        d.timings.push_back({static_cast<std::uint32_t>(t.src), static_cast<std::uint32_t>(t.dst), t.bytes, t.start, t.end});
      metrics.add_run(d.seconds, d.timings);
      body = std::move(d);
    } catch (const std::exception& e) {
      body = Failed{"unit " + std::to_string(id) + ": " + e.what()};
    }
    std::erase(active, ex.get());
    for (LocalUnit* u : held) --u->readers;
    if (auto it = units.find(id); it != units.end()) it->second.building = false;
    if (!reply || !*reply) co_return;  // the session is gone
    replies.spawn(send_late(reply, Envelope{kProtocolVersion, request, 0, std::move(body)}));
  }

  /// Hands step `r` to the framework with views of the current units held here; the
  /// framework's report is the reply. No graph touches these units while the step runs:
  /// beside it (`--overlap`) the coordinator builds only new units from units no step
  /// writes, and frees nothing until every node answered.
  void step(const StepRun& r, std::uint64_t request) {
    check_adoption(r.step);
    const auto stream = static_cast<StepStream>(r.stream);
    if (streams_stepping.count(0) || (stream == StepStream::whole && !streams_stepping.empty()) ||
        streams_stepping.count(r.stream))
      throw Error(me() + ": a " + to_string(stream) + " step while a step of the same stream (or a whole step) is unanswered");
    NodeStep ns{r.step, r.response_len, job, {}, {}, stream, r.weight_version};
    std::vector<std::uint32_t> held;
    for (const StepRun::Unit& u : r.units) {
      ++ns.replicas[u.model_stage];
      const auto it = units.find(u.id);
      if (it == units.end()) continue;  // no GPU of it on this node
      if (it->second.building) throw Error("unit " + std::to_string(u.id) + " is still being built");
      if (in_step.count(u.id)) throw Error("unit " + std::to_string(u.id) + " is in use by the framework's other step");
      const LocalUnit& lu = it->second;
      NodeUnit v{u.id, u.model_stage, static_cast<int>(u.replica), lu.one.units[0], lu.buffers, {}, MemoryKind::host, {}};
      for (std::size_t b = 0; b < lu.memory.size(); ++b) {
        const DeviceBuffer& m = lu.memory[b];
        v.memory.emplace_back(m.data(), m.size());
        v.kind = m.kind();
        const Device* dev = device(lu.buffers[b].key.device);
        v.gpu.push_back(dev ? dev->gpu() : 0);
      }
      ns.units.push_back(std::move(v));
      held.push_back(u.id);
    }
    streams_stepping.insert(r.stream);
    for (std::uint32_t id : held) ++in_step[id];
    auto reply = reply_to;
    auto answered = std::make_shared<std::atomic<bool>>(false);
    const int which = r.stream;
    host->step(std::move(ns), [this, reply, answered, request, which, held, ex = io.get_executor()](StepDone d) {
      if (answered->exchange(true)) return;  // once
      asio::post(ex, [this, reply, request, which, held, d = std::move(d)]() mutable {
        if (!reply || !*reply) return;  // the job closed meanwhile; its state is gone
        streams_stepping.erase(which);
        for (std::uint32_t id : held)
          if (--in_step[id] == 0) in_step.erase(id);
        // In the replies' scope, which close() joins: the send never outlives the channel.
        replies.spawn(send_late(reply, Envelope{kProtocolVersion, request, 0, std::move(d)}));
      });
    });
  }

  static asio::awaitable<void> send_late(std::shared_ptr<Channel*> reply, Envelope e) {
    if (!*reply) co_return;
    try {
      co_await (*reply)->send(e);
    } catch (const std::exception&) {  // the coordinator went away; close() cleans up
    }
  }

  void free(std::uint32_t id) {
    LocalUnit& u = unit(id);
    if (in_step.count(id)) throw Error("unit " + std::to_string(id) + " is in use by the framework's step");
    if (u.readers > 0 || u.building) throw Error("unit " + std::to_string(id) + " is in use by a build");
    units.erase(id);
  }

  /// Every unit's bytes against the verification fill (on the helper thread). A unit still
  /// being built is not part of the job: the build was aborted and would not stop (a get
  /// from a frozen peer), so the coordinator dropped it and it stays here, unfinished.
  FillCheck verify() const {
    FillCheck all;
    std::vector<std::byte> copy;  // GPU memory is checked through a host copy
    for (const auto& [id, u] : units)
      if (!u.building)
        for (std::size_t b = 0; b < u.buffers.size(); ++b) {
        const std::byte* at = u.memory[b].data();
        if (u.memory[b].kind() != MemoryKind::host) {
          copy.resize(u.memory[b].size());
          copy_to_host(u.memory[b].kind(), copy.data(), at, copy.size());
          at = copy.data();
        }
        FillCheck one = check_buffer(*u.one.model, u.buffers[b], at);
        if (!one.ok) one.first_error = u.one.model_stage + " unit " + std::to_string(id) + ": " + one.first_error;
        all.merge(one);
      }
    return all;
  }

  /// Cancels running builds and waits up to `limit`; false when one would not stop.
  asio::awaitable<bool> abort(std::chrono::milliseconds limit) {
    for (Executor* e : active) e->cancel();
    if (co_await builds.join_within(limit)) co_return true;
    // Two-sided builds wait on UCX sends that a lost node, or a survivor whose own build
    // was aborted, never takes: end those waits (their buffers are read by the receiver
    // only), so the units can be freed. What still runs then writes memory: it stays.
    if (ucx && ucx->abandon_sends() > 0) co_return co_await builds.join_within(std::chrono::seconds(1));
    co_return false;
  }
};

NodeJob::NodeJob(asio::io_context& io, int node_rank, std::vector<std::unique_ptr<Device>>& devices, Metrics& metrics,
                 StepHost* host, std::span<const AdoptedBuffer> adopt, std::string machine)
    : s_(std::make_unique<State>(io, node_rank, devices, metrics, host, adopt)) {
  s_->machine = std::move(machine);
}

NodeJob::~NodeJob() {
  if (s_->builds.pending() > 0 || s_->replies.pending() > 0) {
    // Ended mid-close (the daemon is stopping): a build still runs and writes its unit.
    // Leave it its state; the daemon ends without destroying what it uses (Daemon::stuck).
    ++s_->metrics.stuck_parts;
    (void)s_.release();
  }
}

bool NodeJob::open() const { return s_->job != nullptr; }

void NodeJob::quarantine() {
  if (s_->ucx) s_->ucx->quarantine();  // (CUDA IPC keeps no requests pending on a peer)
}

asio::awaitable<NodePart::Answer> NodeJob::answer(Channel& ch, const Envelope& m) {
  State& s = *s_;
  if (!s.job && !std::holds_alternative<JobOpen>(m.body)) co_return NotMine{};
  Body reply;
  {
    if (auto* o = std::get_if<JobOpen>(&m.body)) {
      reply = Ready{s.open(*o)};
      s.reply_to = std::make_shared<Channel*>(&ch);
    } else if (auto* p = std::get_if<Peers>(&m.body)) {
      s.connect(*p);
      reply = Connected{};
    } else if (auto* a = std::get_if<UnitAlloc>(&m.body)) {
      LocalUnit& u = s.allocate(a->unit, a->replica);
      if (a->fill) {
        LocalUnit* unit = &u;
        auto fill = [unit] {  // never over the framework's memory: its bytes are the unit's
          std::vector<std::byte> staging;  // GPU memory is filled through a host copy
          for (std::size_t b = 0; b < unit->buffers.size(); ++b) {
            DeviceBuffer& m = unit->memory[b];
            if (m.borrowed()) continue;
            if (m.kind() == MemoryKind::host) {
              fill_buffer(*unit->one.model, unit->buffers[b], m.data());
              continue;
            }
            staging.resize(m.size());
            fill_buffer(*unit->one.model, unit->buffers[b], staging.data());
            copy_from_host(m.kind(), m.data(), staging.data(), staging.size());
          }
          return 0;
        };
        co_await s.offload(fill);  // gigabytes: off the event loop
      }
      reply = s.located(a->unit.id);
    } else if (auto* b = std::get_if<UnitBuild>(&m.body)) {
      s.build(*b, m.request_id);
      co_return Later{};  // run_build replies
    } else if (auto* r = std::get_if<StepRun>(&m.body)) {
      if (!s.host) {
        reply = StepDone{};  // no framework here: nothing to run
      } else {
        s.step(*r, m.request_id);
        co_return Later{};  // the framework's report is the reply
      }
    } else if (auto* f = std::get_if<UnitFree>(&m.body)) {
      s.free(f->id);
      reply = UnitFreed{f->id};
    } else if (std::holds_alternative<Verify>(m.body)) {
      const State* state = &s;
      auto check = [state] { return state->verify(); };
      const FillCheck c = co_await s.offload(check);
      reply = Verified{c.ok, c.ok, c.bytes, c.first_error};
    } else if (std::holds_alternative<Abort>(m.body)) {
      quarantine();  // the coordinator stops the graph: a node was lost, or a build failed
      const bool stopped = co_await s.abort(std::chrono::seconds(2));
      reply = Aborted{!stopped};
    } else {
      co_return NotMine{};
    }
  }
  co_return reply;
}

asio::awaitable<void> NodeJob::close() {
  State& s = *s_;
  if (s.reply_to) *s.reply_to = nullptr;
  if (!s.job) co_return;
  if (s.host) s.host->closed();
  s.streams_stepping.clear();
  s.in_step.clear();
  const bool stopped = co_await s.abort(std::chrono::seconds(2));  // joined when it returns true
  // No reply outlives the channel. On a live channel they end at once; one stuck behind
  // a write the coordinator does not read is cancelled (a sender waiting its turn leaves
  // the line without writing).
  if (!co_await s.replies.join_within(std::chrono::seconds(2))) {
    s.replies.cancel();
    co_await s.replies.join();
  }
  if (!stopped) {
    // A transfer that would not stop still writes a unit: leave this job's state, arenas'
    // buffers and UCX included, allocated for good rather than free memory under it.
    State* stuck = s_.release();
    ++stuck->metrics.stuck_parts;
    s_ = std::make_unique<State>(stuck->io, stuck->rank, stuck->devices, stuck->metrics, stuck->host, stuck->adopt);
    s_->machine = stuck->machine;
    co_return;
  }
  s.units.clear();
  if (s.ucx || s.cuda)
    for (const auto& r : s.regs) s.remote().deregister_memory(r);
  s.regs.clear();
  s.mixed.reset();
  if (s.ucx) co_await s.ucx->shutdown();
  s.ucx.reset();
  s.cuda.reset();
  // Their threads end with the job (a session serves many; the coordinator's own session
  // with itself lasts until after it answered the client).
  s.local.reset();
  s.offload.stop();
  s.job.reset();
  s.doom.cancel();
  s.doomed = false;
}

}  // namespace nereus::cluster
