#include "nereus/transport/nccl.hpp"

#include "../base/cuda_device.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "nereus/base/error.hpp"
#include "strided_copy.hpp"

namespace nereus {

namespace {

using detail::cuda_error;

/// The NCCL entry points this transport calls, from a dlopen()ed library.
struct NcclApi {
  void* handle = nullptr;
  decltype(&::ncclGetVersion) get_version = nullptr;
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&::ncclCommGetAsyncError) async_error = nullptr;
  decltype(&::ncclCommAbort) abort = nullptr;
  decltype(&::ncclGetErrorString) error_string = nullptr;
  decltype(&::ncclGetLastError) last_error = nullptr;
  decltype(&::ncclGroupStart) group_start = nullptr;
  decltype(&::ncclGroupEnd) group_end = nullptr;
  decltype(&::ncclSend) send = nullptr;
  decltype(&::ncclRecv) recv = nullptr;
  int version = 0;

  explicit NcclApi(const std::string& library) {
    handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* why = ::dlerror();
      throw Error("cannot load NCCL from " + library + ": " + (why ? why : "dlopen failed") +
                  " (set NEREUS_NCCL_LIBRARY to a libnccl.so.2)");
    }
    auto load = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(handle, name));
      if (!fn) throw Error(library + " has no " + name + ": not an NCCL library, or one older than 2.14");
    };
    try {
      load(get_version, "ncclGetVersion");
      load(get_unique_id, "ncclGetUniqueId");
      load(init_rank_config, "ncclCommInitRankConfig");
      load(async_error, "ncclCommGetAsyncError");
      load(abort, "ncclCommAbort");
      load(error_string, "ncclGetErrorString");
      load(last_error, "ncclGetLastError");
      load(group_start, "ncclGroupStart");
      load(group_end, "ncclGroupEnd");
      load(send, "ncclSend");
      load(recv, "ncclRecv");
    } catch (...) {
      ::dlclose(handle);
      throw;
    }
    if (const ncclResult_t r = get_version(&version); r != ncclSuccess) {
      const std::string why = error_string(r);
      ::dlclose(handle);
      throw Error("nccl: ncclGetVersion failed: " + why);
    }
  }
  ~NcclApi() { ::dlclose(handle); }
  NcclApi(const NcclApi&) = delete;
  NcclApi& operator=(const NcclApi&) = delete;

  std::string what(ncclResult_t r, ncclComm_t comm = nullptr) const {
    std::string s = error_string(r);
    if (const char* last = last_error(comm); last && *last) s += ": " + std::string(last);
    return s;
  }
};

/// One rank this process holds: its communicator, stream, event and staging on its GPU.
struct LocalRank {
  int rank = 0;
  int gpu = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  std::byte* staging = nullptr;  ///< packed runs of this rank's strided messages
  std::size_t staging_size = 0;
};

/// Makes `gpu` current for a scope and restores the previous device.
class OnGpu {
 public:
  explicit OnGpu(int gpu) {
    cudaGetDevice(&previous_);
    if (const cudaError_t e = cudaSetDevice(gpu); e != cudaSuccess)
      throw Error("GPU " + std::to_string(gpu) + ": " + cuda_error(e));
  }
  ~OnGpu() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

class NcclTransport final : public Transport {
 public:
  NcclTransport(asio::io_context& io, NcclTransportOptions o)
      : io_(io), o_(std::move(o)), api_(library_of(o_)), ranks_(nccl_ranks(o_)) {
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess) {
      cudaGetLastError();
      gpus = 0;
    }
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      if (ranks_[r].process != o_.self) continue;
      if (ranks_[r].gpu < 0 || ranks_[r].gpu >= gpus)
        throw Error("nccl: this process's rank " + std::to_string(r) + " is on GPU " + std::to_string(ranks_[r].gpu) +
                    ", but this machine has " + std::to_string(gpus) + " CUDA device(s)");
      local_.push_back({static_cast<int>(r), ranks_[r].gpu});
    }
    if (local_.empty()) throw Error("nccl: process " + std::to_string(o_.self) + " holds none of the group's devices");
  }

  ~NcclTransport() override {
    // Abort rather than destroy: ncclCommDestroy may wait for peers on this thread, the
    // event loop's; after a transition nothing of ours is in flight anyway.
    abort_all("transport closed");
    for (LocalRank& l : local_) {
      OnGpu on(l.gpu);
      if (l.staging) cudaFree(l.staging);
      if (l.done) cudaEventDestroy(l.done);
      if (l.stream) cudaStreamDestroy(l.stream);
    }
  }

  std::string_view name() const override { return "nccl"; }
  Capabilities capabilities() const override {
    Capabilities c;
    c.memory = {MemoryKind::cuda};
    c.two_sided = c.grouped = c.strided_messages = true;
    return c;
  }
  Registration register_memory(const MemoryRegion& region) override {
    if (region.kind != MemoryKind::cuda)
      throw Error("nccl moves CUDA memory only; device " + std::to_string(region.device) + " is " +
                  std::string(to_string(region.kind)) + " memory");
    return {region, {}, 0};
  }

  /// Rank 0's process: the unique id (made on first ask; NCCL then keeps a bootstrap
  /// thread until the communicators form). Others: nothing.
  std::vector<std::byte> address() const override {
    if (local_.front().rank != 0) return {};
    if (!id_) {
      ncclUniqueId id{};
      if (const ncclResult_t r = api_.get_unique_id(&id); r != ncclSuccess)
        throw Error("nccl: ncclGetUniqueId failed: " + api_.what(r));
      id_ = id;
    }
    const auto* p = reinterpret_cast<const std::byte*>(id_->internal);
    return {p, p + sizeof id_->internal};
  }

  /// Takes the unique id from rank 0's process and starts creating the communicators as
  /// soon as the id is known: every rank must join, including a process that will have
  /// no NCCL message of its own (its peers all reached by CUDA IPC in a mixed transport).
  Status connect(PeerId peer, std::span<const std::byte> address) override {
    if (peer == ranks_.front().process && local_.front().rank != 0) {
      if (address.size() != sizeof(ncclUniqueId::internal))
        return {StatusCode::invalid, "nccl: process " + std::to_string(peer) + " holds rank 0, but its address is " +
                                         std::to_string(address.size()) + " bytes, not an NCCL unique id"};
      ncclUniqueId id{};
      std::memcpy(id.internal, address.data(), address.size());
      id_ = id;
    }
    if (local_.front().rank == 0 && !id_) (void)this->address();  // makes the id
    if (!id_ || started_ || !failed_.empty()) return Status::ok();
    started_ = true;
    Status st = start_init();
    if (!st) abort_all(st.message());
    return st;
  }

  asio::awaitable<Status> post(DescriptorList list) override {
    std::vector<DescriptorList> one;
    one.push_back(std::move(list));
    co_return co_await post_group(std::move(one));
  }

  asio::awaitable<Status> post_group(std::vector<DescriptorList> lists) override {
    if (!failed_.empty()) co_return Status{StatusCode::io_error, "nccl: communicators were aborted (" + failed_ + ")"};
    // One group at a time: groups share each rank's staging, and two in flight would
    // interleave their sends and receives in an order the peers did not derive.
    if (in_group_) co_return Status{StatusCode::invalid, "nccl: a group was posted while another was in flight"};
    // Cleared on every way out, a cancelled or destroyed wait in ready() included: a flag
    // left set would refuse every later group.
    struct InGroup {
      bool& flag;
      explicit InGroup(bool& f) : flag(f) { flag = true; }
      ~InGroup() { flag = false; }
      InGroup(const InGroup&) = delete;
      InGroup& operator=(const InGroup&) = delete;
    } in_group(in_group_);
    Status st = co_await ready();
    std::vector<Issue> issues;
    std::vector<LocalRank*> used;
    if (st) st = issue(lists, issues);
    if (st) st = co_await enqueued(issues.size());
    if (st) st = finish(issues, used);
    if (st) st = co_await wait_for_events(used);
    else if (failed_.empty()) abort_all(st.message());
    co_return st;
  }

 private:
  static std::string library_of(const NcclTransportOptions& o) {
    const char* env = std::getenv("NEREUS_NCCL_LIBRARY");
    return env && *env ? env : o.library;
  }

  LocalRank* local_rank(DeviceId d) {
    const int gpu = o_.gpu_of(d);
    for (LocalRank& l : local_)
      if (l.gpu == gpu) return &l;
    return nullptr;
  }
  int rank_of(PeerId process, int gpu) const {
    for (std::size_t r = 0; r < ranks_.size(); ++r)
      if (ranks_[r] == NcclRank{process, gpu}) return static_cast<int>(r);
    return -1;
  }

  /// Creates the communicators on first use: non-blocking init, polled, bounded in time.
  asio::awaitable<Status> ready() {
    while (initializing_) {  // another post is creating them
      asio::steady_timer t(io_);
      t.expires_after(std::chrono::milliseconds(1));
      co_await t.async_wait(asio::use_awaitable);
    }
    if (!failed_.empty()) co_return Status{StatusCode::io_error, "nccl: " + failed_};
    if (formed_) co_return Status::ok();
    if (!started_)
      co_return Status{StatusCode::invalid, "nccl: no unique id from process " + std::to_string(ranks_.front().process) +
                                                " (rank 0): connect to it first"};
    initializing_ = true;
    Status st = Status::ok();
    const auto deadline = std::chrono::steady_clock::now() + o_.init_timeout;
    while (st) {
      bool pending = false;
      for (LocalRank& l : local_) {
        ncclResult_t state = ncclSuccess;
        api_.async_error(l.comm, &state);
        if (state == ncclInProgress) pending = true;
        else if (state != ncclSuccess) st = {StatusCode::peer_failed, "nccl: rank " + std::to_string(l.rank) + " did not join: " + api_.what(state, l.comm)};
      }
      if (!pending || !st) break;
      if (std::chrono::steady_clock::now() > deadline) {
        st = {StatusCode::timed_out, "nccl: the communicator of " + std::to_string(ranks_.size()) + " ranks did not form within " +
                                         std::to_string(o_.init_timeout.count()) + " s (a process missing?)"};
        break;
      }
      asio::steady_timer t(io_);
      t.expires_after(std::chrono::milliseconds(1));
      auto [ec] = co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
      if (ec) st = {StatusCode::cancelled, "nccl: communicator creation cancelled"};
    }
    initializing_ = false;
    if (!st) abort_all(st.message());
    formed_ = st.is_ok();
    co_return st;
  }

  Status start_init() {
    ncclResult_t r = api_.group_start();
    for (LocalRank& l : local_) {
      if (r != ncclSuccess) break;
      OnGpu on(l.gpu);
      if (!l.stream && cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking) != cudaSuccess)
        return {StatusCode::io_error, "nccl: no CUDA stream on GPU " + std::to_string(l.gpu)};
      if (!l.done && cudaEventCreateWithFlags(&l.done, cudaEventDisableTiming) != cudaSuccess)
        return {StatusCode::io_error, "nccl: no CUDA event on GPU " + std::to_string(l.gpu)};
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;  // init returns at once; ready() polls
      r = api_.init_rank_config(&l.comm, static_cast<int>(ranks_.size()), *id_, l.rank, &config);
      if (r == ncclInProgress) r = ncclSuccess;
    }
    const ncclResult_t end = api_.group_end();
    if (r == ncclSuccess && end != ncclInProgress) r = end;
    if (r != ncclSuccess) return {StatusCode::io_error, "nccl: ncclCommInitRankConfig failed: " + api_.what(r)};
    return Status::ok();
  }

  /// Grows a rank's staging to `bytes` (between groups only: cudaFree synchronizes).
  Status reserve_staging(LocalRank& l, std::size_t bytes) {
    if (l.staging_size >= bytes) return Status::ok();
    OnGpu on(l.gpu);
    if (l.staging) {
      // Its last group may still read or write it: wait, and keep it when that fails (the
      // stream's error is the group's; memory freed under a running copy is not ours).
      if (const cudaError_t e = cudaStreamSynchronize(l.stream); e != cudaSuccess)
        return {StatusCode::io_error, "nccl: GPU " + std::to_string(l.gpu) + "'s stream failed before its staging could grow: " + cuda_error(e)};
      if (const cudaError_t e = cudaFree(l.staging); e != cudaSuccess)
        return {StatusCode::io_error, "nccl: freeing the staging on GPU " + std::to_string(l.gpu) + ": " + cuda_error(e)};
    }
    l.staging = nullptr;
    l.staging_size = 0;
    if (const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&l.staging), bytes); e != cudaSuccess)
      return {StatusCode::io_error, "nccl: staging of " + std::to_string(bytes) + " bytes on GPU " + std::to_string(l.gpu) + ": " + cuda_error(e)};
    l.staging_size = bytes;
    return Status::ok();
  }

  /// One message as issued: its buffer (its own contiguous run, or its place in staging).
  struct Issue {
    const DescriptorList* list;
    LocalRank* local;
    int peer;
    std::byte* buffer;
    std::uint64_t bytes;
    bool staged;
  };

  /// Packs staged sends and issues the group, each on its rank's stream; finish() then
  /// unpacks staged receives after it, in the same stream order.
  Status issue(const std::vector<DescriptorList>& lists, std::vector<Issue>& issues) {
    std::map<LocalRank*, std::size_t> staged_bytes;
    for (const DescriptorList& l : lists) {
      if (l.op != Op::send && l.op != Op::recv) return {StatusCode::invalid, "nccl moves two-sided messages only (send, recv)"};
      if (l.kind != MemoryKind::cuda) return {StatusCode::invalid, "nccl moves CUDA memory only"};
      LocalRank* local = local_rank(l.local_device);
      const int peer = rank_of(l.peer, o_.gpu_of(l.remote_device));
      if (!local || peer < 0)
        return {StatusCode::invalid, "nccl: device " + std::to_string(local ? l.remote_device : l.local_device) + " is not in the group's ranks"};
      const bool sends = l.op == Op::send;
      const bool contiguous = l.segments.size() == 1 && l.segments[0].count == 1;
      const std::uint64_t at = contiguous ? (sends ? l.segments[0].src : l.segments[0].dst) : 0;
      issues.push_back({&l, local, peer, reinterpret_cast<std::byte*>(at), l.bytes(), !contiguous});
      if (!contiguous) staged_bytes[local] += l.bytes();
    }
    for (auto& [local, bytes] : staged_bytes)
      if (Status st = reserve_staging(*local, bytes); !st) return st;
    std::map<LocalRank*, std::size_t> offset;
    for (Issue& i : issues)
      if (i.staged) {
        i.buffer = i.local->staging + offset[i.local];
        offset[i.local] += i.bytes;
      }
    for (const Issue& i : issues)
      if (i.staged && i.list->op == Op::send)
        if (Status st = copy_runs(i, true); !st) return st;
    ncclResult_t r = api_.group_start();
    for (const Issue& i : issues) {
      if (r != ncclSuccess && r != ncclInProgress) break;
      r = i.list->op == Op::send ? api_.send(i.buffer, i.bytes, ncclUint8, i.peer, i.local->comm, i.local->stream)
                                 : api_.recv(i.buffer, i.bytes, ncclUint8, i.peer, i.local->comm, i.local->stream);
    }
    const ncclResult_t end = api_.group_end();
    if (r == ncclSuccess || r == ncclInProgress) r = end;
    if (r != ncclSuccess && r != ncclInProgress)
      return {StatusCode::io_error, "nccl: group of " + std::to_string(issues.size()) + " messages failed: " + api_.what(r)};
    return Status::ok();
  }

  /// Non-blocking communicators may still be enqueueing the group (connecting to a new
  /// peer, say): polled on a timer until every one is done.
  asio::awaitable<Status> enqueued(std::size_t messages) {
    for (;;) {
      bool pending = false;
      for (LocalRank& l : local_) {
        ncclResult_t state = ncclSuccess;
        api_.async_error(l.comm, &state);
        if (state == ncclInProgress) pending = true;
        else if (state != ncclSuccess)
          co_return Status{StatusCode::peer_failed, "nccl: group of " + std::to_string(messages) + " messages failed: " + api_.what(state, l.comm)};
      }
      if (!pending) co_return Status::ok();
      asio::steady_timer t(io_);
      t.expires_after(o_.poll);
      auto [ec] = co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
      if (ec) co_return Status{StatusCode::cancelled, "nccl: post cancelled (communicators aborted)"};
    }
  }

  /// Unpacks staged receives and records every used rank's event.
  Status finish(const std::vector<Issue>& issues, std::vector<LocalRank*>& used) {
    for (const Issue& i : issues)
      if (i.staged && i.list->op == Op::recv)
        if (Status st = copy_runs(i, false); !st) return st;
    for (const Issue& i : issues)
      if (std::find(used.begin(), used.end(), i.local) == used.end()) used.push_back(i.local);
    for (LocalRank* l : used) {
      OnGpu on(l->gpu);
      if (const cudaError_t e = cudaEventRecord(l->done, l->stream); e != cudaSuccess)
        return {StatusCode::io_error, "nccl: event on GPU " + std::to_string(l->gpu) + ": " + cuda_error(e)};
    }
    return Status::ok();
  }

  /// Packs a message's runs into its staging (`pack`) or unpacks them, on its rank's stream:
  /// one launch of the strided-copy kernel per 64 runs (strided_copy.hpp).
  static Status copy_runs(const Issue& i, bool pack) {
    OnGpu on(i.local->gpu);
    std::vector<Segment> runs;
    std::uint64_t off = 0;
    for (const Segment& s : i.list->segments) {
      const auto packed = reinterpret_cast<std::uint64_t>(i.buffer + off);
      // A side with stride 0 holds its rows back to back (as cudaMemcpy2DAsync had it).
      if (pack) runs.push_back({s.src, packed, s.bytes, s.count, std::max(s.src_stride, s.bytes), s.bytes});
      else runs.push_back({packed, s.dst, s.bytes, s.count, s.bytes, std::max(s.dst_stride, s.bytes)});
      off += s.total();
    }
    if (const auto e = static_cast<cudaError_t>(detail::launch_strided_copies(runs, i.local->stream)); e != cudaSuccess)
      return {StatusCode::io_error, "nccl: staging copy on GPU " + std::to_string(i.local->gpu) + ": " + cuda_error(e)};
    return Status::ok();
  }

  /// Polls the used ranks' events and communicators on a short timer; the loop never
  /// blocks. A peer's failure shows as a communicator error; cancellation aborts.
  asio::awaitable<Status> wait_for_events(const std::vector<LocalRank*>& used) {
    for (;;) {
      bool pending = false;
      for (LocalRank* l : used) {
        ncclResult_t state = ncclSuccess;
        api_.async_error(l->comm, &state);
        if (state != ncclSuccess && state != ncclInProgress) {
          const std::string why = "nccl: rank " + std::to_string(l->rank) + ": " + api_.what(state, l->comm);
          abort_all(why);
          co_return Status{StatusCode::peer_failed, why};
        }
        const cudaError_t e = cudaEventQuery(l->done);
        if (e == cudaErrorNotReady) pending = true;
        else if (e != cudaSuccess) {
          const std::string why = "nccl: GPU " + std::to_string(l->gpu) + ": " + cuda_error(e);
          abort_all(why);
          co_return Status{StatusCode::io_error, why};
        }
      }
      if (!pending) co_return Status::ok();
      asio::steady_timer t(io_);
      t.expires_after(o_.poll);
      auto [ec] = co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
      if (ec) {
        // Kernels NCCL launched cannot be recalled; aborting the communicators ends them.
        abort_all("a post was cancelled");
        co_return Status{StatusCode::cancelled, "nccl: post cancelled (communicators aborted)"};
      }
    }
  }

  void abort_all(const std::string& why) {
    if (failed_.empty()) failed_ = why;
    for (LocalRank& l : local_)
      if (l.comm) {
        api_.abort(l.comm);
        l.comm = nullptr;
      }
  }

  asio::io_context& io_;
  NcclTransportOptions o_;
  NcclApi api_;
  std::vector<NcclRank> ranks_;
  std::vector<LocalRank> local_;
  bool in_group_ = false;
  mutable std::optional<ncclUniqueId> id_;
  bool started_ = false;       ///< communicator creation began (at connect)
  bool formed_ = false;        ///< every local communicator joined
  bool initializing_ = false;  ///< a post is polling their creation
  std::string failed_;  ///< why the communicators were aborted
};

}  // namespace

bool nccl_built() { return true; }

std::unique_ptr<Transport> make_nccl_transport(asio::io_context& io, NcclTransportOptions options) {
  return std::make_unique<NcclTransport>(io, std::move(options));
}

}  // namespace nereus
