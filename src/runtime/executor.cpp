#include "nereus/runtime/executor.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <unordered_map>

#include "nereus/base/error.hpp"

namespace nereus {

Executor::Executor(Transport& copies, Transport* remote, std::function<PeerId(DeviceId)> owner_of,
                   ExecutorOptions options)
    : copies_(copies), remote_(remote), owner_of_(std::move(owner_of)), options_(options) {
  if (options_.per_link_concurrency == 0) options_.per_link_concurrency = 1;
  if (options_.chunk_bytes == 0) options_.chunk_bytes = 64 << 20;
}

namespace {

std::string describe(const Transfer& t, std::size_t i) {
  return "transfer " + std::to_string(i) + " (device " + std::to_string(t.src) + " -> " + std::to_string(t.dst) +
         ", tensor id " + std::to_string(t.tensor) + ", slot " + std::string(to_string(t.slot)) + ")";
}

/// Checks that the view's elements lie inside a buffer of `bytes`; returns the byte
/// offset of its first element.
std::uint64_t check_view(const Transfer& t, std::size_t i, const LocalView& v, std::uint64_t w, std::uint64_t bytes,
                         const char* side) {
  std::int64_t last = v.offset;
  for (int d = 0; d < t.box.rank; ++d) last += (t.box.dims[d].size() - 1) * v.strides[d];
  if (v.offset < 0 || static_cast<std::uint64_t>(last + 1) * w > bytes)
    throw Error(describe(t, i) + ": its " + side + " view [" + std::to_string(v.offset) + ", " + std::to_string(last + 1) +
                ") elements overruns the bound " + side + " buffer of " + std::to_string(bytes) + " bytes");
  if (t.box.rank > 0 && v.strides[t.box.rank - 1] != 1)
    throw Error(describe(t, i) + ": " + side + " view's innermost dimension is not contiguous");
  return static_cast<std::uint64_t>(v.offset) * w;
}

/// Runs of a box: the innermost dimension is contiguous; the next one becomes the
/// segment's count; outer ones (none in sharding.md's tensors) become more segments.
void add_segments(const Transfer& t, std::uint64_t src, std::uint64_t dst, std::uint64_t w, std::vector<Segment>& out) {
  const int rank = t.box.rank;
  const std::uint64_t inner = static_cast<std::uint64_t>(t.box.dims[rank - 1].size()) * w;
  if (rank == 1) {
    out.push_back({src, dst, inner, 1, 0, 0});
    return;
  }
  const auto& sv = t.src_view.view;
  const auto& dv = t.dst_view.view;
  const auto rows = static_cast<std::uint64_t>(t.box.dims[rank - 2].size());
  const auto ss = static_cast<std::uint64_t>(sv.strides[rank - 2]) * w;
  const auto ds = static_cast<std::uint64_t>(dv.strides[rank - 2]) * w;
  std::uint64_t outer = 1;
  for (int d = 0; d < rank - 2; ++d) outer *= static_cast<std::uint64_t>(t.box.dims[d].size());
  for (std::uint64_t o = 0; o < outer; ++o) {
    std::uint64_t so = 0, dof = 0, rem = o;
    for (int d = rank - 3; d >= 0; --d) {
      const auto n = static_cast<std::uint64_t>(t.box.dims[d].size());
      so += (rem % n) * static_cast<std::uint64_t>(sv.strides[d]) * w;
      dof += (rem % n) * static_cast<std::uint64_t>(dv.strides[d]) * w;
      rem /= n;
    }
    if (ss == inner && ds == inner) out.push_back({src + so, dst + dof, inner * rows, 1, 0, 0});
    else out.push_back({src + so, dst + dof, inner, rows, ss, ds});
  }
}

/// Splits a list into lists of at most `chunk` bytes.
std::vector<DescriptorList> chunked(const DescriptorList& l, std::size_t chunk) {
  std::vector<DescriptorList> out;
  DescriptorList cur = l;
  cur.segments.clear();
  std::uint64_t in_cur = 0;
  auto flush = [&] {
    if (!cur.segments.empty()) out.push_back(cur);
    cur.segments.clear();
    in_cur = 0;
  };
  for (const Segment& s : l.segments) {
    if (s.count == 1) {
      for (std::uint64_t lo = 0; lo < s.bytes; lo += chunk) {
        const std::uint64_t n = std::min<std::uint64_t>(chunk, s.bytes - lo);
        if (in_cur + n > chunk) flush();
        cur.segments.push_back({s.src + lo, s.dst + lo, n, 1, 0, 0});
        in_cur += n;
      }
    } else {
      const std::uint64_t rows = std::max<std::uint64_t>(1, chunk / std::max<std::uint64_t>(1, s.bytes));
      for (std::uint64_t i = 0; i < s.count; i += rows) {
        const std::uint64_t n = std::min(rows, s.count - i);
        if (in_cur + n * s.bytes > chunk) flush();
        cur.segments.push_back({s.src + i * s.src_stride, s.dst + i * s.dst_stride, s.bytes, n, s.src_stride, s.dst_stride});
        in_cur += n * s.bytes;
      }
    }
  }
  flush();
  return out;
}

}  // namespace

BoundTransition Executor::bind(std::span<const Transfer> transfers, const Collection& target,
                               const BufferTable& table) const {
  std::unordered_map<DeviceId, std::uint32_t> unit_of;
  for (std::uint32_t u = 0; u < target.units.size(); ++u)
    for (DeviceId d : target.units[u].gpus) unit_of[d] = u;
  BoundTransition b;
  b.unit_ops_.assign(target.units.size(), 0);
  // What each transport can move, asked once.
  const std::vector<MemoryKind> copies_move = copies_.capabilities().memory;
  const std::vector<MemoryKind> remote_moves = remote_ ? remote_->capabilities().memory : std::vector<MemoryKind>{};
  for (std::size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& t = transfers[i];
    if (owner_of_(t.dst) != options_.self) continue;
    auto unit = unit_of.find(t.dst);
    if (unit == unit_of.end()) throw Error(describe(t, i) + ": destination device is not in the target collection");
    const BoundBuffer* dst = table.find({kTargetSide, t.dst, t.dst_view.buffer, t.slot});
    if (!dst) throw Error(describe(t, i) + ": no destination buffer is bound on device " + std::to_string(t.dst));
    if (dst->owner != options_.self) throw Error(describe(t, i) + ": destination buffer is bound in another process");
    const BoundBuffer* src = table.find({t.source, t.src, t.src_view.buffer, t.slot});
    if (!src) throw Error(describe(t, i) + ": no source buffer is bound on device " + std::to_string(t.src));
    const std::uint64_t elems = static_cast<std::uint64_t>(t.box.elements());
    if (elems == 0 || t.bytes % elems != 0 || t.box.rank < 1)
      throw Error(describe(t, i) + ": " + std::to_string(t.bytes) + " bytes do not fit its box");
    const std::uint64_t w = t.bytes / elems;
    const std::uint64_t so = check_view(t, i, t.src_view.view, w, src->bytes, "source");
    const std::uint64_t dof = check_view(t, i, t.dst_view.view, w, dst->bytes, "destination");
    if (t.keep && src->address == dst->address && src->owner == dst->owner) {
      b.skipped_keep_ += t.bytes;
      continue;
    }
    const bool local = src->owner == options_.self && !(options_.remote_links && remote_ && t.src != t.dst);
    if (!local && !remote_)
      throw Error(describe(t, i) + ": its source is in process " + std::to_string(src->owner) + " but no remote transport is set");
    // Memory kinds: a transport moves only the kinds it says it can (a host-only transport
    // handed GPU memory would read garbage or crash), so a mismatch is an error here.
    const Transport& by = local ? copies_ : *remote_;
    const std::vector<MemoryKind>& moves = local ? copies_move : remote_moves;
    for (const auto& [kind, end] : {std::pair{src->kind, "source"}, std::pair{dst->kind, "destination"}})
      if (std::find(moves.begin(), moves.end(), kind) == moves.end())
        throw Error(describe(t, i) + ": its " + end + " is " + std::string(to_string(kind)) + " memory, which the " +
                    std::string(by.name()) + " transport does not move");
    BoundTransition::BoundOp op{static_cast<std::uint32_t>(i), unit->second, {}, t.src == t.dst};
    op.list.op = local ? Op::copy : Op::get;
    op.list.kind = dst->kind;
    op.list.peer = src->owner;
    op.list.local_device = t.dst;
    op.list.remote_device = t.src;
    add_segments(t, src->address + so, dst->address + dof, w, op.list.segments);
    ++b.unit_ops_[op.unit];
    b.ops_.push_back(std::move(op));
  }
  return b;
}

std::uint64_t BoundTransition::bytes() const {
  std::uint64_t n = 0;
  for (const BoundOp& op : ops_) n += op.list.bytes();
  return n;
}

asio::awaitable<ExecutionReport> Executor::run(const BoundTransition& bound) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto since = [t0] { return std::chrono::duration<double>(clock::now() - t0).count(); };
  ExecutionReport report;
  report.started_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count();
  report.skipped_keep = bound.skipped_keep_;
  landed_ = 0;

  // Links in order of first appearance; each gets `per_link_concurrency` workers.
  std::map<std::pair<DeviceId, DeviceId>, std::size_t> link_of;
  std::vector<std::vector<std::size_t>> links;
  for (std::size_t i = 0; i < bound.ops_.size(); ++i) {
    const auto& l = bound.ops_[i].list;
    const auto key = std::make_pair(l.remote_device, l.local_device);
    auto [it, fresh] = link_of.try_emplace(key, links.size());
    if (fresh) links.emplace_back();
    links[it->second].push_back(i);
  }
  std::vector<std::size_t> next(links.size(), 0);
  std::vector<std::uint32_t> left = bound.unit_ops_;
  for (std::uint32_t u = 0; u < left.size(); ++u)
    if (left[u] == 0 && !bound.ops_.empty()) report.commits.push_back({u, 0.0});
  std::string error;

  auto ex = co_await asio::this_coro::executor;
  AsyncScope scope(ex);
  running_ = &scope;
  auto worker = [&](std::size_t link) -> asio::awaitable<void> {
    while (error.empty() && next[link] < links[link].size()) {
      const auto& op = bound.ops_[links[link][next[link]++]];
      const double start = since();
      Transport& tr = op.list.op == Op::copy ? copies_ : *remote_;
      for (const DescriptorList& part : chunked(op.list, options_.chunk_bytes)) {
        const Status st = co_await tr.post(part);
        if (!st) {
          if (error.empty()) {
            error = "transfer " + std::to_string(op.transfer) + " (device " + std::to_string(op.list.remote_device) +
                    " -> " + std::to_string(op.list.local_device) + ") failed: " + st.message();
            scope.cancel();
          }
          co_return;
        }
        landed_ += part.bytes();
      }
      const std::uint64_t bytes = op.list.bytes();
      report.timings.push_back({op.transfer, op.list.remote_device, op.list.local_device, bytes, start, since()});
      (op.local ? report.local_bytes : report.link_bytes) += bytes;
      if (--left[op.unit] == 0) report.commits.push_back({op.unit, since()});
    }
  };
  for (std::size_t l = 0; l < links.size(); ++l)
    for (unsigned k = 0; k < options_.per_link_concurrency && k < links[l].size(); ++k) scope.spawn(worker(l));
  std::string failure;
  try {
    co_await scope.join();
  } catch (const std::exception& e) {
    failure = e.what();  // a worker stopped by cancellation between two posts
  }
  running_ = nullptr;
  if (!error.empty()) throw Error(error);
  if (!failure.empty()) throw Error("transition stopped: " + failure);
  report.seconds = since();
  co_return report;
}

void Executor::cancel() {
  if (running_) running_->cancel();
}

}  // namespace nereus
