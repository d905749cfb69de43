#include "nereus/transport/local.hpp"

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <cstring>

#include "completion.hpp"
#include "nereus/base/error.hpp"

namespace nereus {

struct LocalTransport::Pool {
  explicit Pool(unsigned n) : threads(n) {}
  asio::thread_pool threads;
};

LocalTransport::LocalTransport(LocalTransportOptions options)
    : pool_(std::make_unique<Pool>(std::max(1u, options.threads))), options_(options) {
  if (options_.chunk_bytes == 0) options_.chunk_bytes = 1 << 20;
}

LocalTransport::~LocalTransport() { pool_->threads.join(); }

Capabilities LocalTransport::capabilities() const {
  return {true, false, false, true, {MemoryKind::host}};
}

Registration LocalTransport::register_memory(const MemoryRegion& region) {
  if (region.kind != MemoryKind::host) throw Error("local transport: only host memory can be registered");
  return {region, {}, 0};
}

namespace {

/// One posted list: chunks left, cancellation, and where to complete.
struct Batch {
  std::atomic<std::size_t> remaining{0};
  std::atomic<bool> cancelled{false};
  std::unique_ptr<detail::Completion> done;

  void finish() {
    done->complete(cancelled.load() ? Status{StatusCode::cancelled, "local copy cancelled"} : Status::ok());
  }
};

/// A piece of one segment: rows [row, row + rows), bytes [lo, hi) of each row.
struct Chunk {
  Segment seg;
  std::uint64_t row, rows, lo, hi;
  void run() const {
    for (std::uint64_t i = row; i < row + rows; ++i) {
      auto* dst = reinterpret_cast<std::byte*>(seg.dst + i * seg.dst_stride + lo);
      const auto* src = reinterpret_cast<const std::byte*>(seg.src + i * seg.src_stride + lo);
      std::memcpy(dst, src, hi - lo);
    }
  }
};

void split(const Segment& s, std::size_t chunk, std::vector<Chunk>& out) {
  if (s.bytes == 0 || s.count == 0) return;
  if (s.bytes >= chunk) {
    for (std::uint64_t i = 0; i < s.count; ++i)
      for (std::uint64_t lo = 0; lo < s.bytes; lo += chunk) out.push_back({s, i, 1, lo, std::min(s.bytes, lo + chunk)});
    return;
  }
  const std::uint64_t rows = std::max<std::uint64_t>(1, chunk / s.bytes);
  for (std::uint64_t i = 0; i < s.count; i += rows) out.push_back({s, i, std::min(rows, s.count - i), 0, s.bytes});
}

struct LocalInitiate {
  asio::thread_pool* pool;
  std::size_t chunk_bytes;
  DescriptorList list;

  template <class Handler>
  void operator()(Handler&& handler) {
    auto batch = std::make_shared<Batch>();
    auto slot = asio::get_associated_cancellation_slot(handler);
    if (slot.is_connected())
      slot.assign([b = std::weak_ptr<Batch>(batch)](asio::cancellation_type) {
        if (auto p = b.lock()) p->cancelled = true;
      });
    batch->done = detail::make_completion(std::forward<Handler>(handler));
    std::vector<Chunk> chunks;
    for (const Segment& s : list.segments) split(s, chunk_bytes, chunks);
    if (chunks.empty()) {
      batch->finish();
      return;
    }
    batch->remaining = chunks.size();
    for (const Chunk& c : chunks)
      asio::post(*pool, [batch, c] {
        if (!batch->cancelled.load(std::memory_order_relaxed)) c.run();
        if (batch->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) batch->finish();
      });
  }
};

}  // namespace

asio::awaitable<Status> LocalTransport::post(DescriptorList list) {
  if (list.op != Op::copy)
    co_return Status{StatusCode::not_supported, "local transport copies inside one process only"};
  if (list.kind != MemoryKind::host) co_return Status{StatusCode::not_supported, "local transport moves host memory only"};
  LocalInitiate init{&pool_->threads, options_.chunk_bytes, std::move(list)};
  co_return co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(Status)>(std::move(init),
                                                                                          asio::use_awaitable);
}

}  // namespace nereus
