#include "nereus/transport/ucx.hpp"

#include <ucp/api/ucp.h>
#include <sched.h>
#include <unistd.h>

#include <boost/asio/posix/descriptor_base.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <chrono>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <set>

#include "completion.hpp"
#include "nereus/base/error.hpp"

namespace nereus {

namespace {

std::string ucs(ucs_status_t s) { return ucs_status_string(s); }

}  // namespace

/// One posted list: outstanding UCP requests and the completion to post.
struct UcxBatch {
  UcxTransport::Impl* impl = nullptr;
  std::size_t remaining = 0;
  bool posting = true;     // still issuing requests: do not complete yet
  bool registered = false; // counted in impl->in_flight
  Status status;
  std::unique_ptr<detail::Completion> done;
  std::set<void*> requests;  // in flight, for cancellation
  std::uint64_t expected = 0;     // a recv's message length
  std::vector<std::byte> sink;    // where a recv puts a message longer than expected
  bool sends = false;             // a tagged send (abandon_sends)
  void finish_if_done();
};

struct UcxTransport::Impl {
  asio::io_context& io;
  UcxOptions options;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  asio::posix::stream_descriptor efd;
  asio::steady_timer tick;
  std::map<PeerId, ucp_ep_h> eps;
  std::map<PeerId, std::string> failed;  // peer → why
  /// A peer's registered memory on one device: its whole region (hi == 0) or one range.
  struct RemoteKey {
    std::uint64_t lo = 0, hi = 0;
    ucp_rkey_h rkey = nullptr;
  };
  std::map<std::pair<PeerId, DeviceId>, std::vector<RemoteKey>> rkeys;

  /// The key among a peer device's `keys` (sorted by lo, the whole region's first: lo 0)
  /// for [address, address + bytes): a range holding it, else the device's whole region;
  /// null when neither. Ranges starting at or before the address are tried nearest first,
  /// as memh_for does: a framework's disjoint tensors need one try.
  static ucp_rkey_h key_in(const std::vector<RemoteKey>& keys, std::uint64_t address, std::uint64_t bytes) {
    const ucp_rkey_h whole = !keys.empty() && keys.front().hi == 0 ? keys.front().rkey : nullptr;
    auto it = std::upper_bound(keys.begin(), keys.end(), address, [](std::uint64_t v, const RemoteKey& k) { return v < k.lo; });
    while (it != keys.begin())
      if (--it; it->hi != 0 && address + bytes <= it->hi) return it->rkey;
    return whole;
  }
  std::map<UcxBatch*, std::shared_ptr<UcxBatch>> batches;  // in flight
  /// Registered memory, for the memh our requests pass (UCX then registers nothing per
  /// request, and has nothing of its own to deregister when it purges one).
  struct Region {
    std::uintptr_t lo = 0, hi = 0;
    ucp_mem_h memh = nullptr;
  };
  std::vector<Region> regions;  // sorted by lo (memh_for)
  std::vector<Region> arenas;  // allocated by allocate_arena(), until released
  // Every memh, deregistered or not: unmapped only after the worker is destroyed.
  std::vector<ucp_mem_h> mapped;
  /// Set when a peer may have died or frozen with requests in flight (ucx.hpp,
  /// "Lifetimes"): the worker is then never destroyed.
  bool quarantined = false;
  // Work posted to the event loop holds this weakly: it may run after the transport is gone.
  std::shared_ptr<int> alive = std::make_shared<int>(0);
  std::size_t in_flight = 0;
  bool stopping = false;
  bool waiting = false;
  int loops = 0;                 // progress and tick loops still running
  asio::steady_timer loops_done;  // cancelled when a loop exits
  asio::steady_timer backoff;     // the progress loop's pause when arm stays busy

  Impl(asio::io_context& io_, UcxOptions opt)
      : io(io_), options(std::move(opt)), efd(io_), tick(io_), loops_done(io_), backoff(io_) {}

  void loop_exited() {
    --loops;
    loops_done.cancel();
  }

  /// Asked for every run of every segment: `regions` is sorted by lo, so the regions
  /// starting at or before p are tried nearest first (a framework's disjoint tensors: the
  /// first holds the run or none does); any region holding the run serves.
  ucp_mem_h memh_for(const void* p, std::size_t n) const {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = std::upper_bound(regions.begin(), regions.end(), a, [](std::uintptr_t v, const Region& r) { return v < r.lo; });
    while (it != regions.begin())
      if (--it; a + n <= it->hi) return it->memh;
    return nullptr;
  }

  static void on_done(void* request, ucs_status_t st, void* user) {
    auto* b = static_cast<UcxBatch*>(user);
    b->requests.erase(request);
    if (st != UCS_OK) b->impl->quarantined = true;  // a peer failed, or a request was cut short
    if (st != UCS_OK && b->status.is_ok())
      b->status = st == UCS_ERR_CANCELED ? Status{StatusCode::cancelled, "ucx request cancelled"}
                                         : Status{StatusCode::peer_failed, "ucx request failed: " + ucs(st)};
    ucp_request_free(request);
    --b->remaining;
    // Inside ucp_worker_progress: finish_if_done() only posts the completion.
    b->finish_if_done();
  }

  /// A tagged receive: also a message of another length than the recv's is an error (both
  /// ends derive the same sizes from one plan, so it means they disagree).
  static void on_recv(void* request, ucs_status_t st, const ucp_tag_recv_info_t* info, void* user) {
    auto* b = static_cast<UcxBatch*>(user);
    if (st == UCS_OK && info->length != b->expected && b->status.is_ok())
      b->status = {StatusCode::invalid, "ucx: tagged message " + std::to_string(info->sender_tag) + " has " +
                                            std::to_string(info->length) + " bytes, " + std::to_string(b->expected) +
                                            " expected"};
    on_done(request, st, user);
  }

  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t st) {
    auto* self = static_cast<Impl*>(arg);
    self->quarantined = true;
    for (auto& [peer, e] : self->eps)
      if (e == ep) self->failed[peer] = "peer " + std::to_string(peer) + " failed: " + ucs(st);
  }

  /// Progress loop: busy while operations are in flight, armed fd wait when idle.
  asio::awaitable<void> progress_loop() {
    auto moved_at = std::chrono::steady_clock::now();
    while (!stopping) {
      if (in_flight > 0) {
        // A get from shared memory copies inside progress (a segment per call), so
        // "progress until nothing moves" could copy gigabytes without letting a timer or
        // a heartbeat in: back to the event loop after a millisecond at most.
        unsigned n = 0;
        const auto now = std::chrono::steady_clock::now();
        const auto until = now + std::chrono::milliseconds(1);
        while (ucp_worker_progress(worker) != 0)
          if (++n, std::chrono::steady_clock::now() >= until) break;
        if (n > 0) moved_at = now;
        if (n == 0 && now - moved_at >= std::chrono::milliseconds(2)) {
          // Nothing moved for a while: requests to a peer that died or froze may never
          // complete (gets UCX cannot cancel, left to a quarantined transport for the
          // process's life). Polling them flat out would take a core for good, and a
          // daemon's heartbeats with it; a millisecond's pause costs live transfers little.
          backoff.expires_after(std::chrono::milliseconds(1));
          co_await backoff.async_wait(asio::as_tuple(asio::use_awaitable));
          continue;
        }
        // Nothing moved just now: give the core to whoever does (copy threads, peers on
        // the same host) before polling again.
        if (n == 0) sched_yield();
        co_await asio::post(io, asio::use_awaitable);  // let completions run
        continue;
      }
      moved_at = std::chrono::steady_clock::now();  // idle: the next request starts a fresh wait
      const ucs_status_t st = ucp_worker_arm(worker);
      if (st == UCS_ERR_BUSY) {
        // Events pending. Progress, then yield to the event loop: never spin without
        // yielding (after a peer dies, arm can stay busy while progress finds nothing,
        // and a synchronous retry loop would starve every other coroutine). When
        // nothing moves, back off for a millisecond.
        if (ucp_worker_progress(worker) == 0) {
          backoff.expires_after(std::chrono::milliseconds(1));
          co_await backoff.async_wait(asio::as_tuple(asio::use_awaitable));
        } else {
          co_await asio::post(io, asio::use_awaitable);
        }
        continue;
      }
      waiting = true;
      co_await efd.async_wait(asio::posix::descriptor_base::wait_read, asio::as_tuple(asio::use_awaitable));
      waiting = false;
      if (stopping) break;
      while (ucp_worker_progress(worker) != 0) {
      }
    }
    loop_exited();
  }

  /// Fallback tick: progress now and then even if an event was missed.
  asio::awaitable<void> tick_loop() {
    while (!stopping) {
      tick.expires_after(std::chrono::milliseconds(10));
      auto [ec] = co_await tick.async_wait(asio::as_tuple(asio::use_awaitable));
      if (ec || stopping) break;
      ucp_worker_progress(worker);
    }
    loop_exited();
  }

  void wake() {
    if (waiting) efd.cancel();
  }
};

UcxTransport::UcxTransport(asio::io_context& io, UcxOptions options)
    : impl_(std::make_shared<Impl>(io, std::move(options))) {
  ucp_config_t* cfg = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &cfg); s != UCS_OK)
    throw Error("ucx: cannot read configuration: " + ucs(s));
  if (!std::getenv("UCX_NET_DEVICES") && !impl_->options.net_devices.empty())
    ucp_config_modify(cfg, "NET_DEVICES", impl_->options.net_devices.c_str());
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  const ucs_status_t s = ucp_init(&params, cfg, &impl_->context);
  ucp_config_release(cfg);
  if (s != UCS_OK) throw Error("ucx: ucp_init failed: " + ucs(s));
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  if (ucs_status_t w = ucp_worker_create(impl_->context, &wp, &impl_->worker); w != UCS_OK) {
    ucp_cleanup(impl_->context);
    throw Error("ucx: ucp_worker_create failed: " + ucs(w));
  }
  int fd = -1;
  if (ucs_status_t e = ucp_worker_get_efd(impl_->worker, &fd); e != UCS_OK) {
    ucp_worker_destroy(impl_->worker);
    ucp_cleanup(impl_->context);
    throw Error("ucx: no worker event fd: " + ucs(e));
  }
  impl_->efd.assign(::dup(fd));  // Asio owns (and closes) its own copy
  impl_->loops = 2;
  // Each loop holds the Impl: after the destructor (stopping set, worker gone) a loop that
  // resumes sees `stopping` before touching UCX and exits; the Impl goes with the last.
  asio::co_spawn(io, [](std::shared_ptr<Impl> self) -> asio::awaitable<void> { co_await self->progress_loop(); }(impl_),
                 asio::detached);
  asio::co_spawn(io, [](std::shared_ptr<Impl> self) -> asio::awaitable<void> { co_await self->tick_loop(); }(impl_),
                 asio::detached);
}

namespace {

/// UCP state left alive for the rest of the process (ucx.hpp, "Lifetimes"). Reachable
/// from here, so leak checkers do not count it.
struct Quarantined {
  ucp_context_h context;
  ucp_worker_h worker;
};
std::vector<Quarantined>* quarantine_list = new std::vector<Quarantined>();

}  // namespace

UcxTransport::~UcxTransport() {
  Impl& x = *impl_;
  x.stopping = true;
  x.efd.close();
  x.tick.cancel();
  if (!x.quarantined) {
    for (auto& [key, list] : x.rkeys)
      for (const Impl::RemoteKey& k : list) ucp_rkey_destroy(k.rkey);
    x.rkeys.clear();
    close_endpoints(std::chrono::milliseconds(500));
  }
  if (x.quarantined || x.in_flight > 0) {
    // Requests may still be pending to a dead or frozen peer, also on endpoints UCX made
    // itself (replies to a peer's gets): destroying the worker would purge them, and a
    // purge touches memory handles and requests that are gone (SIGSEGV in
    // ucp_worker_destroy). Leave the context, the worker and the registrations alone.
    quarantine_list->push_back({x.context, x.worker});
    return;
  }
  ucp_worker_destroy(x.worker);
  for (ucp_mem_h m : x.mapped) ucp_mem_unmap(x.context, m);
  ucp_cleanup(x.context);
}

void UcxTransport::close_endpoints(std::chrono::milliseconds limit) {
  Impl& x = *impl_;
  std::vector<void*> closing;
  for (auto& [peer, ep] : x.eps) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* req = ucp_ep_close_nbx(ep, &p);
    if (UCS_PTR_IS_PTR(req)) closing.push_back(req);
  }
  x.eps.clear();
  // Bounded: a daemon must not hang its event loop on a peer that died mid-transfer.
  const auto until = std::chrono::steady_clock::now() + limit;
  auto pending = [&] {
    return std::any_of(closing.begin(), closing.end(), [](void* r) { return ucp_request_check_status(r) == UCS_INPROGRESS; });
  };
  while (pending() && std::chrono::steady_clock::now() < until) ucp_worker_progress(x.worker);
  if (pending()) x.quarantined = true;
  for (void* r : closing) ucp_request_free(r);
}

void UcxTransport::quarantine() { impl_->quarantined = true; }

std::size_t UcxTransport::abandon_sends() {
  Impl& x = *impl_;
  std::size_t ended = 0;
  for (auto& [ptr, b] : x.batches) {
    if (!b->sends || !b->done || b->posting || b->remaining == 0) continue;
    // The batch stays in `batches` (a late callback finds it); finish_if_done() no longer
    // completes or counts it.
    x.quarantined = true;
    if (b->registered) {
      b->registered = false;
      --x.in_flight;
    }
    std::exchange(b->done, nullptr)->complete({StatusCode::abandoned, "ucx: a tagged send its peer never took was abandoned"});
    ++ended;
  }
  return ended;
}

// Waits for both loops to exit: they use the worker, which the destructor destroys (a
// daemon runs many transitions in one event loop, so they must be gone, not just told).
asio::awaitable<void> UcxTransport::shutdown() {
  Impl& x = *impl_;
  // Our requests end first: cancelled, then progressed until they complete (bounded; what
  // does not complete quarantines the worker).
  for (auto& [ptr, b] : x.batches) {
    const std::set<void*> reqs = b->requests;  // callbacks edit the set
    for (void* r : reqs) ucp_request_cancel(x.worker, r);
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  while (x.in_flight > 0 && std::chrono::steady_clock::now() < until) {
    ucp_worker_progress(x.worker);
    co_await asio::post(x.io, asio::use_awaitable);  // completions run, the loop stays live
  }
  if (x.in_flight > 0) x.quarantined = true;
  impl_->stopping = true;
  impl_->wake();
  impl_->tick.cancel();
  while (impl_->loops > 0) {
    impl_->efd.cancel();
    impl_->tick.cancel();
    impl_->backoff.cancel();
    impl_->loops_done.expires_after(std::chrono::milliseconds(20));
    co_await impl_->loops_done.async_wait(asio::as_tuple(asio::use_awaitable));
  }
}

Capabilities UcxTransport::capabilities() const { return {false, true, true, false, {MemoryKind::host}, true}; }

std::byte* UcxTransport::allocate_arena(DeviceId id, std::size_t bytes) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = nullptr;
  mp.length = bytes;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h memh = nullptr;
  if (ucs_status_t s = ucp_mem_map(impl_->context, &mp, &memh); s != UCS_OK)
    throw Error("device " + std::to_string(id) + ": UCX cannot allocate " + std::to_string(bytes) + " bytes: " + ucs(s));
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  if (ucs_status_t s = ucp_mem_query(memh, &attr); s != UCS_OK) {
    ucp_mem_unmap(impl_->context, memh);
    throw Error("device " + std::to_string(id) + ": UCX allocated memory it cannot describe: " + ucs(s));
  }
  impl_->mapped.push_back(memh);  // unmapped after the worker is gone, like every memh
  const auto lo = reinterpret_cast<std::uintptr_t>(attr.address);
  impl_->arenas.push_back({lo, lo + attr.length, memh});
  return static_cast<std::byte*>(attr.address);
}

void UcxTransport::release_arena(std::byte* arena, std::size_t) {
  const auto lo = reinterpret_cast<std::uintptr_t>(arena);
  auto gone = [lo](const Impl::Region& r) { return r.lo == lo; };
  std::erase_if(impl_->arenas, gone);
  std::erase_if(impl_->regions, gone);
}

Registration UcxTransport::register_memory(const MemoryRegion& region) {
  const auto lo = reinterpret_cast<std::uintptr_t>(region.base);
  ucp_mem_h memh = nullptr;
  for (const Impl::Region& a : impl_->arenas)  // an arena we allocated is mapped already
    if (lo >= a.lo && lo + region.size <= a.hi) memh = a.memh;
  const bool ours = memh != nullptr;
  if (!ours) {
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = region.base;
    mp.length = region.size;
    if (ucs_status_t s = ucp_mem_map(impl_->context, &mp, &memh); s != UCS_OK)
      throw Error("ucx: cannot register device " + std::to_string(region.device) + " memory: " + ucs(s));
  }
  void* buf = nullptr;
  std::size_t len = 0;
  if (ucs_status_t s = ucp_rkey_pack(impl_->context, memh, &buf, &len); s != UCS_OK) {
    if (!ours) ucp_mem_unmap(impl_->context, memh);
    throw Error("ucx: cannot pack rkey of device " + std::to_string(region.device) + ": " + ucs(s));
  }
  Registration r{region, std::vector<std::byte>(static_cast<std::byte*>(buf), static_cast<std::byte*>(buf) + len),
                 reinterpret_cast<std::uint64_t>(memh)};
  ucp_rkey_buffer_release(buf);
  auto& regions = impl_->regions;
  regions.insert(std::upper_bound(regions.begin(), regions.end(), lo, [](std::uintptr_t v, const Impl::Region& g) { return v < g.lo; }),
                 {lo, lo + region.size, memh});
  if (!ours) impl_->mapped.push_back(memh);
  return r;
}

void UcxTransport::deregister_memory(const Registration& r) {
  // New requests no longer use it; requests already posted may: it stays mapped until
  // the worker is gone.
  auto& regions = impl_->regions;
  regions.erase(std::remove_if(regions.begin(), regions.end(),
                               [&](const Impl::Region& g) { return g.memh == reinterpret_cast<ucp_mem_h>(r.handle); }),
                regions.end());
}

std::vector<std::byte> UcxTransport::address() const {
  ucp_address_t* a = nullptr;
  std::size_t len = 0;
  if (ucs_status_t s = ucp_worker_get_address(impl_->worker, &a, &len); s != UCS_OK)
    throw Error("ucx: cannot get the worker address: " + ucs(s));
  std::vector<std::byte> out(reinterpret_cast<std::byte*>(a), reinterpret_cast<std::byte*>(a) + len);
  ucp_worker_release_address(impl_->worker, a);
  return out;
}

Status UcxTransport::connect(PeerId peer, std::span<const std::byte> address) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  p.address = reinterpret_cast<const ucp_address_t*>(address.data());
  p.err_mode = impl_->options.peer_error_handling ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  // The handler also without peer error handling: UCX (>= 1.12) then calls it for a
  // failed endpoint instead of aborting the process (a peer killed mid-transfer).
  p.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.err_handler.cb = &Impl::on_ep_error;
  p.err_handler.arg = impl_.get();
  ucp_ep_h ep = nullptr;
  if (ucs_status_t s = ucp_ep_create(impl_->worker, &p, &ep); s != UCS_OK)
    return {StatusCode::io_error, "ucx: cannot connect to peer " + std::to_string(peer) + ": " + ucs(s)};
  // A peer that comes back (a restarted node) gets a new endpoint. The old one, failed or
  // to a dead process, is left open rather than closed: closing it could wait on that
  // peer (ucx.hpp, "Lifetimes"); it is a few kB until the transport goes.
  impl_->eps[peer] = ep;
  impl_->failed.erase(peer);
  return Status::ok();
}

Status UcxTransport::add_remote_region(PeerId peer, DeviceId device, std::span<const std::byte> key, std::uint64_t base,
                                      std::uint64_t size) {
  auto ep = impl_->eps.find(peer);
  if (ep == impl_->eps.end()) return {StatusCode::invalid, "ucx: peer " + std::to_string(peer) + " is not connected"};
  ucp_rkey_h rk = nullptr;
  if (ucs_status_t s = ucp_ep_rkey_unpack(ep->second, key.data(), &rk); s != UCS_OK)
    return {StatusCode::invalid, "ucx: bad rkey for device " + std::to_string(device) + ": " + ucs(s)};
  const std::uint64_t hi = size == 0 ? 0 : base + size;
  const std::uint64_t lo = size == 0 ? 0 : base;
  auto& list = impl_->rkeys[{peer, device}];  // sorted by lo (key_in)
  for (Impl::RemoteKey& k : list)
    if (k.lo == lo && k.hi == hi) {  // the same region again (a peer that came back)
      ucp_rkey_destroy(k.rkey);
      k.rkey = rk;
      return Status::ok();
    }
  list.insert(std::upper_bound(list.begin(), list.end(), lo, [](std::uint64_t v, const Impl::RemoteKey& k) { return v < k.lo; }),
              {lo, hi, rk});
  return Status::ok();
}

const std::byte* UcxTransport::mapped(PeerId peer, DeviceId device, std::uint64_t address) const {
  const auto keys = impl_->rkeys.find({peer, device});
  ucp_rkey_h rk = keys == impl_->rkeys.end() ? nullptr : Impl::key_in(keys->second, address, 1);
  if (!rk) return nullptr;
  void* local = nullptr;
  if (ucp_rkey_ptr(rk, address, &local) != UCS_OK) return nullptr;
  return static_cast<const std::byte*>(local);
}

void UcxBatch::finish_if_done() {
  if (posting || remaining != 0 || !done) return;
  std::exchange(done, nullptr)->complete(status);
  if (registered) {
    --impl->in_flight;
    // Called from inside ucp_worker_progress: drop our reference later, not here.
    asio::post(impl->io, [impl = impl, alive = std::weak_ptr<int>(impl->alive), self = this] {
      if (!alive.expired()) impl->batches.erase(self);
    });
  }
}

namespace {

struct UcxInitiate {
  UcxTransport::Impl* impl;
  DescriptorList list;

  template <class Handler>
  void operator()(Handler&& handler) {
    UcxTransport::Impl& x = *impl;
    auto batch = std::make_shared<UcxBatch>();
    batch->impl = impl;
    auto slot = asio::get_associated_cancellation_slot(handler);
    batch->done = detail::make_completion(std::forward<Handler>(handler));
    auto fail = [&](Status st) {
      batch->status = std::move(st);
      batch->posting = false;
      batch->finish_if_done();
    };
    if (auto f = x.failed.find(list.peer); f != x.failed.end()) return fail({StatusCode::peer_failed, f->second});
    auto ep = x.eps.find(list.peer);
    if (ep == x.eps.end()) return fail({StatusCode::invalid, "ucx: peer " + std::to_string(list.peer) + " is not connected"});
    const bool tagged = list.op == Op::send || list.op == Op::recv;
    if (tagged && (list.segments.size() != 1 || list.segments[0].count != 1))
      return fail({StatusCode::invalid, "ucx: a tagged message is one contiguous segment (the executor stages others)"});
    const auto keys = x.rkeys.find({list.peer, list.remote_device});  // looked up once per list
    if (!tagged && keys == x.rkeys.end())
      return fail({StatusCode::invalid, "ucx: no rkey for device " + std::to_string(list.remote_device) + " of peer " +
                                            std::to_string(list.peer)});
    x.batches.emplace(batch.get(), batch);
    batch->sends = list.op == Op::send;
    batch->registered = true;
    ++x.in_flight;
    if (slot.is_connected())
      slot.assign([w = std::weak_ptr<UcxBatch>(batch)](asio::cancellation_type) {
        auto b = w.lock();
        if (!b) return;
        const std::set<void*> reqs = b->requests;  // callbacks edit the set
        for (void* r : reqs) ucp_request_cancel(b->impl->worker, r);
      });
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &UcxTransport::Impl::on_done;
    p.user_data = batch.get();
    auto track = [&](ucs_status_ptr_t r, const char* what) {
      if (r == nullptr) return;
      if (UCS_PTR_IS_ERR(r)) {
        batch->status = {StatusCode::io_error, std::string("ucx: ") + what + " failed: " + ucs(UCS_PTR_STATUS(r))};
        return;
      }
      batch->requests.insert(r);
      ++batch->remaining;
    };
    if (tagged) {
      const Segment& s = list.segments[0];
      void* local = reinterpret_cast<void*>(list.op == Op::recv ? s.dst : s.src);
      ucp_request_param_t q = p;
      if (ucp_mem_h m = x.memh_for(local, s.bytes)) {
        q.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        q.memh = m;
      }
      if (list.op == Op::send) {
        track(ucp_tag_send_nbx(ep->second, local, s.bytes, list.tag, &q), "tagged send");
      } else {
        // Matched on the whole tag: it names the transfer, and so its sender.
        q.cb.recv = &UcxTransport::Impl::on_recv;
        batch->expected = s.bytes;
        // A message already here is taken by probing first: its length is known before
        // it lands (UCX 1.13 leaves recv_info unset when a recv completes at once).
        ucp_tag_recv_info_t info{};
        if (ucp_tag_message_h m = ucp_tag_probe_nb(x.worker, list.tag, ~ucp_tag_t{0}, 1, &info)) {
          if (info.length != s.bytes)
            batch->status = {StatusCode::invalid, "ucx: tagged message " + std::to_string(list.tag) + " has " +
                                                      std::to_string(info.length) + " bytes, " + std::to_string(s.bytes) +
                                                      " expected"};
          // Received either way, so it leaves UCX: one too long lands in a buffer the batch
          // holds until it completes, and only the error reaches the caller.
          void* into = local;
          if (info.length > s.bytes) {
            batch->sink.resize(info.length);
            into = batch->sink.data();
            q.op_attr_mask &= ~static_cast<std::uint32_t>(UCP_OP_ATTR_FIELD_MEMH);
          }
          track(ucp_tag_msg_recv_nbx(x.worker, into, info.length, m, &q), "tagged recv");
        } else {
          track(ucp_tag_recv_nbx(x.worker, local, s.bytes, list.tag, ~ucp_tag_t{0}, &q), "tagged recv");
        }
      }
    }
    for (const Segment& s : tagged ? std::span<const Segment>{} : std::span<const Segment>(list.segments)) {
      if (!batch->status.is_ok()) break;
      // One key per segment: all its runs lie in one buffer, so in one registered region.
      const bool get = list.op == Op::get;
      const std::uint64_t remote = get ? s.src : s.dst;
      const std::uint64_t span = (s.count - 1) * (get ? s.src_stride : s.dst_stride) + s.bytes;
      ucp_rkey_h rk = s.count == 0 ? nullptr : UcxTransport::Impl::key_in(keys->second, remote, span);
      if (s.count > 0 && !rk) {
        batch->status = {StatusCode::invalid, "ucx: no region of device " + std::to_string(list.remote_device) + " of peer " +
                                                  std::to_string(list.peer) + " holds address " + std::to_string(remote)};
        break;
      }
      for (std::uint64_t i = 0; i < s.count && batch->status.is_ok(); ++i) {
        const std::uint64_t src = s.src + i * s.src_stride, dst = s.dst + i * s.dst_stride;
        void* local = reinterpret_cast<void*>(get ? dst : src);
        ucp_request_param_t q = p;
        if (ucp_mem_h m = x.memh_for(local, s.bytes)) {
          q.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
          q.memh = m;
        }
        if (list.op == Op::get)
          track(ucp_get_nbx(ep->second, local, s.bytes, src, rk, &q), "get");
        else
          track(ucp_put_nbx(ep->second, local, s.bytes, dst, rk, &q), "put");
      }
    }
    // A put completes locally; flush so its bytes are visible at the peer.
    if (list.op == Op::put && batch->status.is_ok()) track(ucp_ep_flush_nbx(ep->second, &p), "flush");
    batch->posting = false;
    batch->finish_if_done();
    x.wake();
  }
};

}  // namespace

asio::awaitable<Status> UcxTransport::post(DescriptorList list) {
  if (list.op == Op::copy) co_return Status{StatusCode::not_supported, "ucx transport: use the local transport for copies"};
  // A named initiation: GCC 12 destroys temporaries of a co_await expression twice.
  UcxInitiate init{impl_.get(), std::move(list)};
  co_return co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(Status)>(std::move(init), asio::use_awaitable);
}

}  // namespace nereus
