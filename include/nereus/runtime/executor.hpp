#pragma once
// The executor: binds a transfer set to buffers (descriptor lists), posts transfers
// with a per-link concurrency limit and chunking, records per-transfer timings, and
// commits a destination unit only when all its bytes have landed.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "nereus/plan/transfer.hpp"
#include "nereus/runtime/async_scope.hpp"
#include "nereus/runtime/buffers.hpp"
#include "nereus/transport/transport.hpp"

namespace nereus {

struct ExecutorOptions {
  unsigned per_link_concurrency = 2;   ///< transfers in flight per (src, dst) device pair
  std::size_t chunk_bytes = 64 << 20;  ///< a transfer is posted in lists of at most this much
  PeerId self = 0;                     ///< this process
  bool remote_links = false;           ///< send link transfers inside this process through `remote` too
  /// Links between processes move as tagged messages (`remote` must be two-sided, as NCCL
  /// and UCX tags are): the source's process sends each chunk, the destination's receives
  /// it. Both derive the same messages, in the same order per link, from the same plan
  /// (BoundTransition::messages). One two-sided transition runs on a transport at a time.
  /// Without it, links between processes still move as messages when `remote` has no
  /// gets but has tagged messages (link_path).
  bool two_sided = false;
  /// Two-sided links in rounds (BoundTransition::rounds): a process posts one round's
  /// sends and receives together and the next round once all of them completed, rather
  /// than each link streaming on its own. Needed where messages between two processes
  /// match in the order they were issued across all their links, in groups (NCCL), so
  /// always on when `remote` says `grouped`; UCX tagged messages may ask for it.
  bool rounds = false;
  /// The run number of a bound transition's first run; tags carry it (message_tag), and
  /// each later run of the same binding counts up from it. Two-sided transitions that share
  /// one transport at the same time — a job's concurrent builds — each take their own.
  std::uint32_t first_run = 0;
};

/// How a transfer crosses its link: the executor's per-link choice of transport and
/// operation (what `nereus bench transition --transport auto` runs).
enum class LinkPath : std::uint8_t {
  none,     ///< no transport reaches it
  copy,     ///< both ends in this process: the copy transport
  get,      ///< the source in another process: a one-sided get on the remote transport
  message,  ///< a tagged message the source's process sends and the destination's receives
};

/// The path of one link. `same_process`: its source and destination are bound in one
/// process; `remote`: the remote transport's capabilities with the peer across the link
/// (null when there is none); `options.remote_links` sends links between two devices of
/// one process through it too (benches), `options.two_sided` picks messages wherever the
/// peer's transport has them, even beside gets (a peer reached by gets only, as CUDA IPC
/// beside NCCL, keeps its gets). A copy inside one device stays a copy. Both processes of a link compute it from the same inputs (the
/// same transport type runs at both), which two-sided messages need.
LinkPath link_path(bool same_device, bool same_process, const Capabilities* remote, const ExecutorOptions& options);

/// One message of a two-sided run as bind() scheduled it: the `chunk`-th piece of a
/// transfer, which `peer` receives (Op::send) or sends (Op::recv). Its `ordinal` counts
/// the messages before it on its link (src → dst): the identity both ends share, since
/// each process binds only the transfers touching it, and so numbers them differently.
struct Message {
  Op op = Op::send;
  PeerId peer = 0;
  DeviceId src = 0, dst = 0;
  std::uint32_t ordinal = 0;
  std::uint64_t bytes = 0;
  std::uint32_t transfer = 0;  ///< index into this process's bound transfer list
  std::uint32_t chunk = 0;
};

/// The tag of a message: run (mod 2^16), source and destination device (< kTagDevices),
/// ordinal on that link (< kTagOrdinals). Unique per transition and run, so it also names
/// its sender; a message left over from an aborted run matches no run until 65,536 runs
/// later. Runs get the most bits since they are what can repeat within one transport's
/// life: a job's builds each take one (docs/cluster.md, "Two-sided builds").
std::uint64_t message_tag(std::uint32_t run, DeviceId src, DeviceId dst, std::uint32_t ordinal);
inline constexpr DeviceId kTagDevices = 1 << 14;
inline constexpr std::uint64_t kTagOrdinals = std::uint64_t{1} << 20;

/// When one transfer ran (seconds from the start of the run).
struct TransferTiming {
  std::uint32_t transfer;  ///< index into the bound transfer list
  DeviceId src;
  DeviceId dst;
  std::uint64_t bytes;
  double start;
  double end;
};

/// A destination unit whose bytes (those this process receives) have all landed.
struct UnitCommit {
  std::uint32_t unit;
  double at;
};

struct ExecutionReport {
  std::vector<TransferTiming> timings;
  std::vector<UnitCommit> commits;
  double seconds = 0;
  std::int64_t started_ns = 0;    ///< the run's start on this process's steady clock (timings count from it)
  std::uint64_t link_bytes = 0;   ///< bytes moved between devices
  std::uint64_t local_bytes = 0;  ///< bytes copied inside a device
  std::uint64_t skipped_keep = 0; ///< kept buffers bound in place: nothing to copy
  std::uint64_t sent_bytes = 0;   ///< two-sided: bytes this process sent (its peers count them as received)
};

/// A transfer set bound to memory: one descriptor list per transfer.
class BoundTransition {
 public:
  std::size_t size() const { return ops_.size(); }
  /// The bytes a run lands in this process (every bound transfer's but those it sends).
  std::uint64_t bytes() const;
  /// The two-sided messages this process sends and receives, in the order each link
  /// posts them: for any two processes, the sender's messages to the receiver and the
  /// receiver's from the sender are the same list.
  std::vector<Message> messages() const;
  /// The same messages in rounds: round r holds the messages of each link whose ordinal
  /// is in [r·c, (r + 1)·c), c the per-link concurrency, sorted by (source, destination,
  /// ordinal), a receive before a send. A message's round and place follow from its link
  /// and ordinal alone, so the two processes of any link agree on both.
  std::vector<std::vector<Message>> rounds() const;

 private:
  friend class Executor;
  struct BoundOp {
    std::uint32_t transfer;
    std::uint32_t unit;  ///< target unit it lands in; kNone for a send
    DescriptorList list;
    bool local;
    std::vector<DescriptorList> parts;  ///< the list in chunks, as posted
    std::uint32_t first_message = 0;    ///< two-sided: the ordinal of parts[0] on its link
    bool in_rounds = false;             ///< two-sided and run in rounds (options.rounds, or a grouped peer)
    bool grouped = false;               ///< its peer's transport takes it in post_group()
    bool peer_moves = false;            ///< message: its peer's transport moves its memory kind
    bool peer_packs = false;            ///< message: and packs strided runs itself (strided_messages)
    DeviceId src() const { return list.op == Op::send ? list.local_device : list.remote_device; }
    DeviceId dst() const { return list.op == Op::send ? list.remote_device : list.local_device; }
  };
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};
  std::vector<BoundOp> ops_;
  std::vector<std::uint32_t> unit_ops_;  ///< ops per target unit
  /// The ops of each link queue, queues in order of first appearance, ops in transfer
  /// order: what run() posts and messages() lists. A link's sends and receives queue
  /// apart (key: source, destination, is a send).
  std::vector<std::vector<std::uint32_t>> links_;
  struct Part {
    std::uint32_t op, chunk;
  };
  std::vector<std::vector<Part>> rounds_;  ///< two-sided chunks in rounds (rounds())
  std::size_t landing_ops_ = 0;          ///< ops that land bytes here (not sends)
  std::uint64_t skipped_keep_ = 0;
  mutable std::uint32_t runs_ = 0;       ///< the next run's number (tags): first_run, then one more per run
};

class Executor {
 public:
  /// `copies` moves bytes inside this process; `remote` (may be null) reaches peers.
  /// `owner_of` tells which process holds a device.
  Executor(Transport& copies, Transport* remote, std::function<PeerId(DeviceId)> owner_of, ExecutorOptions options = {});

  /// Binds the transfers whose destination is in this process (and, two-sided, those
  /// whose source is here and destination in another process: sends). Rejects the whole set,
  /// before any byte moves, with an Error naming the first transfer that does not match
  /// its buffers (unknown device or buffer, a view outside the buffer, a remote source
  /// without a remote transport).
  BoundTransition bind(std::span<const Transfer> transfers, const Collection& target, const BufferTable& table) const;

  /// Runs a bound transition; throws Error on the first failed transfer (after stopping
  /// the others) and on cancellation. Bytes already landed stay; no source is touched.
  asio::awaitable<ExecutionReport> run(const BoundTransition& bound);

  /// Cancels a running run(): in-flight transfers are cancelled, run() throws.
  void cancel();

  /// Bytes of the current run (the last, once it ended) whose posts completed, chunk by
  /// chunk: what a progress line shows while one long transition runs. Read it on the
  /// event loop that runs run().
  std::uint64_t landed_bytes() const { return landed_; }

 private:
  /// One chunk of a two-sided op, staged through contiguous memory when its runs are not.
  asio::awaitable<Status> message(const BoundTransition::BoundOp& op, std::uint32_t chunk, std::uint64_t tag);
  /// A contiguous staging buffer from the copy transport (alloc_host) and its real size
  /// (a reused one may be larger than asked).
  struct FreeHost {
    Transport* owner;
    void operator()(std::byte* p) const { owner->free_host(p); }
  };
  struct Staging {
    std::unique_ptr<std::byte, FreeHost> memory{nullptr, FreeHost{nullptr}};
    std::size_t size = 0;
  };
  Staging staging(std::size_t bytes);
  void give_back(Staging buffer);
  /// Gives back a message's staging, unless its post was abandoned (then it is leaked).
  void keep_or_give_back(Staging buffer, const Status& posted);

  Transport& copies_;
  Transport* remote_;
  std::function<PeerId(DeviceId)> owner_of_;
  ExecutorOptions options_;
  AsyncScope* running_ = nullptr;
  std::uint64_t landed_ = 0;
  /// A message as the remote transport moves it, and the copy that packs (send) or
  /// unpacks (recv) it through `buffer` when it is staged.
  struct Outgoing {
    DescriptorList msg;
    DescriptorList copy;
    Staging buffer;
    bool staged() const { return !copy.segments.empty(); }
  };
  Outgoing outgoing(const BoundTransition::BoundOp& op, std::uint32_t chunk, std::uint64_t tag);
  std::vector<Staging> spare_staging_;  // reused across runs

};

}  // namespace nereus
