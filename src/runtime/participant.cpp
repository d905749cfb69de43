#include "nereus/runtime/participant.hpp"

#include <sys/mman.h>
#include <cstdio>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <utility>


#include "nereus/core/bytes.hpp"
#include "nereus/base/error.hpp"

namespace nereus {

namespace {
UcxOptions ucx_options(const ReshardSpec& c) {
  UcxOptions o;
  o.peer_error_handling = c.ucx_peer_errors;
  return o;
}

}  // namespace

TransportNames transport_names(const ReshardSpec& c) {
  TransportNames n;
  n.local = c.cuda ? "cuda" : "local";
  n.remote = c.ipc ? "cuda-ipc" : c.nccl ? "nccl" : c.two_sided ? "ucx-tag" : "ucx";
  // With IPC, the mixed transport's second route; GPU memory over UCX goes as staged messages.
  n.across = c.ipc ? (c.nccl ? "nccl" : "ucx-tag") : n.remote;
  return n;
}

Participant::Participant(asio::io_context& io, const ReshardSpec& c, const PreparedReshard& p, std::vector<DeviceId> mine,
                         PeerId self, std::function<PeerId(DeviceId)> owner)
    : io_(io),
      c_(c),
      p_(p),
      mine_(std::move(mine)),
      self_(self),
      owner_(std::move(owner)),
      ucx_(c.nccl ? nullptr : std::make_unique<UcxTransport>(io, ucx_options(c))),
      cuda_(c.cuda ? make_cuda_transport(io, {.machine = c.machine}) : nullptr),
      store_(p.plan, mine_, c.capacity.empty() ? 0 : parse_capacity(c.capacity), self, c.shared_arenas ? ucx_.get() : nullptr,
             c.cuda ? MemoryKind::cuda : MemoryKind::host, c.cuda ? std::max(1, cuda_device_count()) : 1),
      local_({c.copy_threads, 1 << 20}),
      scope_(io.get_executor()) {
  if (c.ipc && !c.cuda) throw Error("CUDA IPC moves GPU memory: the units must be in CUDA memory");
  if (c.ipc && c.two_sided) throw Error("CUDA IPC moves by gets; two-sided messages need UCX or NCCL");
  if (c.nccl && !c.cuda) throw Error("NCCL moves GPU memory between processes: the units must be in CUDA memory");
  if (c.nccl) {
    NcclTransportOptions no;
    no.self = self_;
    no.devices = p.devices;
    no.owner_of = owner_;
    const int gpus = std::max(1, cuda_device_count());
    no.gpu_of = [gpus](DeviceId d) { return static_cast<int>(d) % gpus; };  // as the store places them
    nccl_ = make_nccl_transport(io, std::move(no));
  }
  if (c.ipc) mixed_ = std::make_unique<MixedTransport>(std::vector<Transport*>{cuda_.get(), nccl_ ? nccl_.get() : ucx_.get()});
}

Participant::~Participant() {
  if (scope_.pending() > 0) std::_Exit(3);  // a transfer that would not stop still writes our arenas
}

void Participant::fill() { store_.allocate_and_fill(c_.copy_threads); }

PeerInfo Participant::publish() {
  PeerInfo info;
  info.rank = self_;
  info.address = remote().address();
  if (cuda_) {
    const std::vector<std::byte> id = cuda_->address();  // the machine CUDA IPC reaches
    info.machine.assign(reinterpret_cast<const char*>(id.data()), id.size());
  }
  const Capabilities can = remote().capabilities();
  const auto& kinds = can.memory;
  for (auto& [d, dev] : store_.devices()) {
    // Peers reach regions only with gets; a two-sided-only transport (NCCL) has no keys.
    if (!can.remote_get) break;
    // Memory the remote transport does not move travels as staged messages: no region.
    if (std::find(kinds.begin(), kinds.end(), dev->kind()) == kinds.end()) continue;
    regs_.push_back(remote().register_memory({dev->arena(), dev->capacity(), d, dev->kind()}));
    info.regions.push_back({d, regs_.back().remote_key});
  }
  for (const auto& [key, b] : store_.table().all())
    if (key.side != kTargetSide) info.buffers.push_back({key.side, key.device, key.buffer, key.slot, b.address, b.bytes, b.kind});
  return info;
}

void Participant::connect(const std::vector<PeerInfo>& peers) {
  for (const PeerInfo& w : peers) {
    if (w.rank == self_) continue;
    if (Status st = remote().connect(w.rank, w.address); !st) throw Error(st.message());
    for (const auto& reg : w.regions)
      if (Status st = remote().add_remote_region(w.rank, reg.device, reg.key, reg.base, reg.size); !st) throw Error(st.message());
    for (const auto& b : w.buffers) {
      store_.table().bind({b.side, b.device, b.buffer, b.slot}, {b.address, b.bytes, w.rank, b.kind});
      if (!ucx_) continue;
      if (const std::byte* at = ucx_->mapped(w.rank, b.device, b.address)) mapped_sources_.push_back({at, b.bytes});
    }
  }
  ExecutorOptions eo;
  eo.per_link_concurrency = c_.per_link;
  eo.chunk_bytes = c_.chunk_bytes;
  eo.self = self_;
  // GPU memory across machines over UCX goes as staged messages; IPC peers keep their gets.
  eo.two_sided = c_.two_sided || (mixed_ && !nccl_);
  eo.rounds = c_.rounds;
  ex_ = std::make_unique<Executor>(cuda_ ? *cuda_ : static_cast<Transport&>(local_), &remote(), owner_, eo);
  bound_ = std::make_unique<BoundTransition>(ex_->bind(store_.transfers(), p_.target, store_.table()));
}

void Participant::warm() const {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  for (const auto& [at, bytes] : mapped_sources_) {
    if (bytes == 0) continue;
    const auto lo = reinterpret_cast<std::uintptr_t>(at) / page * page;
    const auto hi = (reinterpret_cast<std::uintptr_t>(at) + bytes + page - 1) / page * page;
#ifdef MADV_POPULATE_READ
    if (::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_READ) == 0) continue;
#endif
    volatile std::byte sink{};
    for (std::size_t off = 0; off < bytes; off += page) sink = at[off];  // older kernels
    (void)sink;
  }
}

void Participant::run(std::function<asio::awaitable<void>(RunResult)> done) {
  if (!ex_) throw Error("run before connect");
  scope_.spawn([](Participant& self, std::function<asio::awaitable<void>(RunResult)> done) -> asio::awaitable<void> {
    RunResult r;
    try {
      r.report = co_await self.ex_->run(*self.bound_);
      r.ok = true;
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    co_await done(std::move(r));
  }(*this, std::move(done)));
}

asio::awaitable<bool> Participant::abort(std::chrono::milliseconds limit) {
  quarantine();  // aborted because a peer failed: its requests may never complete
  if (ex_) ex_->cancel();
  stuck_ = !co_await scope_.join_within(limit);
  // Tagged sends a dead peer (or one that aborted too) never takes: ended, since only their
  // receiver reads their buffers (UcxTransport::abandon_sends).
  if (stuck_ && ucx_ && ucx_->abandon_sends() > 0) stuck_ = !co_await scope_.join_within(std::chrono::seconds(1));
  co_return !stuck_;
}

asio::awaitable<void> Participant::settle() {
  if (!stuck_) co_await scope_.join();
}

FillCheck Participant::verify_sources() const { return store_.verify_sources(c_.copy_threads); }
FillCheck Participant::verify_targets() const { return store_.verify_targets(c_.copy_threads); }
nlohmann::json Participant::dump(const std::string& dir) const { return store_.dump(dir); }

asio::awaitable<bool> Participant::finish(std::chrono::milliseconds limit) {
  if (ex_) ex_->cancel();
  if (stuck_ || !co_await scope_.join_within(limit)) co_return false;
  for (const auto& r : regs_) remote().deregister_memory(r);
  regs_.clear();
  if (ucx_) co_await ucx_->shutdown();
  co_return true;
}

PreparedReshard prepare_reshard(const ReshardSpec& c) {
  if (c.train && c.sync) throw Error("--train and --sync exclude each other");
  auto model = load_model(c.model);
  // An error names the side it is about: "--from tp=3,...: ...".
  auto side = [&](const char* flag, const std::string& s, const char* name, bool train) {
    try {
      return Collection::from_spec(model, name, parse_collection_spec(s), train);
    } catch (const Error& e) {
      throw Error(std::string(flag) + " " + s + ": " + e.what());
    }
  };
  Collection src = side("--from", c.from, "source", c.train || c.sync);
  Collection dst = side("--to", c.to, "target", c.train);
  ReshardOptions opt;
  opt.links.gpus_per_node = c.gpus_per_node;
  ReshardPlan plan = plan_reshard(src, dst, opt);
  std::set<DeviceId> all;
  for (DeviceId d : src.devices()) all.insert(d);
  for (DeviceId d : dst.devices()) all.insert(d);
  std::vector<DeviceId> devices(all.begin(), all.end());
  return {model, {std::move(src)}, std::move(dst), std::move(plan), std::move(devices)};
}

namespace {

std::pair<double, double> median_min(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front()};
}

}  // namespace

nlohmann::json run_figures(const PreparedReshard& p, const std::vector<double>& secs, std::uint64_t copied,
                           const std::vector<double>& quantize_secs) {
  const auto [median, min] = median_min(secs);
  nlohmann::json out = {{"seconds_median", median},
                        {"seconds_min", min},
                        {"gbps", static_cast<double>(p.plan.summary().moved_bytes) / median / 1e9},
                        {"copied_bytes", copied},
                        {"copy_gbps", static_cast<double>(copied) / median / 1e9}};
  if (!quantize_secs.empty()) out["quantize_seconds_median"] = median_min(quantize_secs).first;
  return out;
}

nlohmann::json failure_figures(const std::string& error, double detected, bool sources_ok, std::size_t survivors) {
  nlohmann::json out{{"error", error}, {"verified_sources", sources_ok}, {"surviving_workers", survivors}};
  if (detected > 0) out["failure_detected_seconds"] = detected;
  return out;
}

std::vector<DeviceId> devices_of(const std::vector<DeviceId>& all, int rank, int procs) {
  const std::size_t n = all.size();
  const std::size_t lo = n * static_cast<std::size_t>(rank) / static_cast<std::size_t>(procs);
  const std::size_t hi = n * static_cast<std::size_t>(rank + 1) / static_cast<std::size_t>(procs);
  return {all.begin() + static_cast<std::ptrdiff_t>(lo), all.begin() + static_cast<std::ptrdiff_t>(hi)};
}

}  // namespace nereus
