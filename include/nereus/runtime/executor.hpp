#pragma once
// The executor: binds a transfer set to buffers (descriptor lists), posts transfers
// with a per-link concurrency limit and chunking, records per-transfer timings, and
// commits a destination unit only when all its bytes have landed.
#include <cstdint>
#include <functional>
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
};

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
};

/// A transfer set bound to memory: one descriptor list per transfer.
class BoundTransition {
 public:
  std::size_t size() const { return ops_.size(); }
  /// The bytes a run moves (every bound transfer's).
  std::uint64_t bytes() const;

 private:
  friend class Executor;
  struct BoundOp {
    std::uint32_t transfer;
    std::uint32_t unit;
    DescriptorList list;
    bool local;
  };
  std::vector<BoundOp> ops_;
  std::vector<std::uint32_t> unit_ops_;  ///< ops per target unit
  std::uint64_t skipped_keep_ = 0;
};

class Executor {
 public:
  /// `copies` moves bytes inside this process; `remote` (may be null) reaches peers.
  /// `owner_of` tells which process holds a device.
  Executor(Transport& copies, Transport* remote, std::function<PeerId(DeviceId)> owner_of, ExecutorOptions options = {});

  /// Binds the transfers whose destination is in this process. Rejects the whole set,
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
  Transport& copies_;
  Transport* remote_;
  std::function<PeerId(DeviceId)> owner_of_;
  ExecutorOptions options_;
  AsyncScope* running_ = nullptr;
  std::uint64_t landed_ = 0;
};

}  // namespace nereus
