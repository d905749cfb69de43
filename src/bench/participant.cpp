#include "participant.hpp"

#include "nereus/core/bytes.hpp"
#include "nereus/core/error.hpp"

namespace nereus::bench {

namespace {
UcxOptions ucx_options(const TransitionConfig& c) {
  UcxOptions o;
  o.peer_error_handling = c.ucx_peer_errors;
  return o;
}

}  // namespace

Participant::Participant(asio::io_context& io, const TransitionConfig& c, const Prepared& p, std::vector<DeviceId> mine,
                         PeerId self, std::function<PeerId(DeviceId)> owner)
    : io_(io),
      c_(c),
      p_(p),
      mine_(std::move(mine)),
      self_(self),
      owner_(std::move(owner)),
      store_(p.plan, mine_, c.capacity.empty() ? 0 : parse_capacity(c.capacity), self),
      local_({c.copy_threads, 1 << 20}),
      ucx_(io, ucx_options(c)),
      scope_(io.get_executor()) {}

Participant::~Participant() {
  if (scope_.pending() > 0) std::_Exit(3);  // a transfer that would not stop still writes our arenas
}

void Participant::fill() { store_.allocate_and_fill(c_.copy_threads); }

PeerInfo Participant::publish() {
  PeerInfo info;
  info.rank = self_;
  info.address = ucx_.address();
  for (auto& [d, dev] : store_.devices()) {
    regs_.push_back(ucx_.register_memory({dev->arena(), dev->capacity(), d, MemoryKind::host}));
    info.regions.push_back({d, regs_.back().remote_key});
  }
  for (const auto& [key, b] : store_.table().all())
    if (key.side != kTargetSide) info.buffers.push_back({key.side, key.device, key.buffer, key.slot, b.address, b.bytes});
  return info;
}

void Participant::connect(const std::vector<PeerInfo>& peers) {
  for (const PeerInfo& w : peers) {
    if (w.rank == self_) continue;
    if (Status st = ucx_.connect(w.rank, w.address); !st) throw Error(st.message());
    for (const auto& reg : w.regions)
      if (Status st = ucx_.add_remote_region(w.rank, reg.device, reg.key); !st) throw Error(st.message());
    for (const auto& b : w.buffers) store_.table().bind({b.side, b.device, b.buffer, b.slot}, {b.address, b.bytes, w.rank});
  }
  ExecutorOptions eo;
  eo.per_link_concurrency = c_.per_link;
  eo.chunk_bytes = c_.chunk_bytes;
  eo.self = self_;
  ex_ = std::make_unique<Executor>(local_, &ucx_, owner_, eo);
  bound_ = std::make_unique<BoundTransition>(ex_->bind(p_.plan.transfers_touching(mine_), p_.target, store_.table()));
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
  if (ex_) ex_->cancel();
  stuck_ = !co_await scope_.join_within(limit);
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
  for (const auto& r : regs_) ucx_.deregister_memory(r);
  regs_.clear();
  co_await ucx_.shutdown();
  co_return true;
}

}  // namespace nereus::bench
