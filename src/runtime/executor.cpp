#include "nereus/runtime/executor.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>
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

std::uint64_t message_tag(std::uint32_t run, DeviceId src, DeviceId dst, std::uint32_t ordinal) {
  return (std::uint64_t{run & 0xffffu} << 48) | (static_cast<std::uint64_t>(src & 0x3fff) << 34) |
         (static_cast<std::uint64_t>(dst & 0x3fff) << 20) | (ordinal & 0xfffffu);
}

LinkPath link_path(bool same_device, bool same_process, const Capabilities* remote, const ExecutorOptions& options) {
  if (same_device || (same_process && !(options.remote_links && remote))) return LinkPath::copy;
  if (!remote) return LinkPath::none;
  if (remote->two_sided && (options.two_sided || !remote->remote_get)) return LinkPath::message;
  if (remote->remote_get) return LinkPath::get;
  return LinkPath::none;
}

BoundTransition Executor::bind(std::span<const Transfer> transfers, const Collection& target,
                               const BufferTable& table) const {
  std::unordered_map<DeviceId, std::uint32_t> unit_of;
  for (std::uint32_t u = 0; u < target.units.size(); ++u)
    for (DeviceId d : target.units[u].gpus) unit_of[d] = u;
  BoundTransition b;
  b.runs_ = options_.first_run;
  b.unit_ops_.assign(target.units.size(), 0);
  // What each transport can move, asked once.
  const std::vector<MemoryKind> copies_move = copies_.capabilities().memory;
  const Capabilities remote_can = remote_ ? remote_->capabilities() : Capabilities{};
  // Per peer: a mixed transport reaches peers by different means. Asked once each.
  std::map<PeerId, Capabilities> can_of;
  auto reach_of = [&](PeerId peer) -> const Capabilities* {
    if (!remote_) return nullptr;
    auto it = can_of.find(peer);
    if (it == can_of.end()) it = can_of.emplace(peer, remote_->capabilities_for(peer)).first;
    return &it->second;
  };
  if (options_.two_sided && !remote_can.two_sided)
    throw Error(std::string("two-sided links need a transport with tagged messages; ") +
                (remote_ ? std::string(remote_->name()) + " has none" : "no remote transport is set"));
  auto moves = [](const std::vector<MemoryKind>& kinds, MemoryKind k) { return std::find(kinds.begin(), kinds.end(), k) != kinds.end(); };
  auto check_kind = [&](const Transfer& t, std::size_t i, bool local, MemoryKind kind, const char* end, const Capabilities* reach,
                        bool message = false) {
    // A transport moves only the kinds it says it can (a host-only transport handed GPU
    // memory would read garbage or crash), so a mismatch is an error here. A message's own
    // side may also be staged through host memory: the copy transport moves it there (GPU
    // memory over a host-only UCX).
    const bool stage_through_host = reach && moves(reach->memory, MemoryKind::host);
    if (moves(local ? copies_move : reach->memory, kind)) return;
    if (message && stage_through_host && moves(copies_move, kind)) return;
    throw Error(describe(t, i) + ": its " + end + " is " + std::string(to_string(kind)) + " memory, which the " +
                std::string((local ? copies_ : *remote_).name()) + " transport does not move" +
                (!local && !message && stage_through_host && moves(copies_move, kind)
                     ? " (as two-sided messages it would be staged through host memory)"
                     : ""));
  };
  for (std::size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& t = transfers[i];
    const bool dst_here = owner_of_(t.dst) == options_.self;
    // A message is sent by the source's process (and, with every link remote, received
    // by this same process when the destination is here too).
    const Capabilities* to_dst = reach_of(owner_of_(t.dst));
    const bool send_here = owner_of_(t.src) == options_.self && t.src != t.dst &&
                           link_path(false, dst_here, to_dst, options_) == LinkPath::message;
    if (!dst_here && !send_here) continue;
    // The plan's FP8 transfers carry weight and scales as one; the executor moves element
    // runs, so they reach it split (executable_transfers, fp8_moves.hpp).
    if (t.fp8 != Fp8Move::none)
      throw Error(describe(t, i) + ": an FP8 transfer as planned; bind executable_transfers() of the plan instead");
    auto unit = unit_of.find(t.dst);
    if (unit == unit_of.end()) throw Error(describe(t, i) + ": destination device is not in the target collection");
    const BoundBuffer* src = table.find({t.source, t.src, t.src_view.buffer, t.slot});
    if (!src) throw Error(describe(t, i) + ": no source buffer is bound on device " + std::to_string(t.src));
    const std::uint64_t elems = static_cast<std::uint64_t>(t.box.elements());
    if (elems == 0 || t.bytes % elems != 0 || t.box.rank < 1)
      throw Error(describe(t, i) + ": " + std::to_string(t.bytes) + " bytes do not fit its box");
    const std::uint64_t w = t.bytes / elems;
    const std::uint64_t so = check_view(t, i, t.src_view.view, w, src->bytes, "source");
    if (send_here) {
      // The receiver checks its own buffer; here only the layout of its runs matters (the
      // offsets give both ends the same segments, hence the same chunks).
      if (src->owner != options_.self) throw Error(describe(t, i) + ": source buffer is bound in another process");
      check_kind(t, i, false, src->kind, "source", to_dst, true);
      BoundTransition::BoundOp op{static_cast<std::uint32_t>(i), BoundTransition::kNone, {}, false, {}};
      op.grouped = to_dst->grouped;
      op.in_rounds = options_.rounds || op.grouped;
      op.peer_moves = moves(to_dst->memory, src->kind);
      op.peer_packs = to_dst->strided_messages;
      op.list.op = Op::send;
      op.list.kind = src->kind;
      op.list.peer = owner_of_(t.dst);
      op.list.local_device = t.src;
      op.list.remote_device = t.dst;
      add_segments(t, src->address + so, static_cast<std::uint64_t>(t.dst_view.view.offset) * w, w, op.list.segments);
      b.ops_.push_back(std::move(op));
    }
    if (!dst_here) continue;
    const BoundBuffer* dst = table.find({kTargetSide, t.dst, t.dst_view.buffer, t.slot});
    if (!dst) throw Error(describe(t, i) + ": no destination buffer is bound on device " + std::to_string(t.dst));
    if (dst->owner != options_.self) throw Error(describe(t, i) + ": destination buffer is bound in another process");
    const std::uint64_t dof = check_view(t, i, t.dst_view.view, w, dst->bytes, "destination");
    if (t.keep && src->address == dst->address && src->owner == dst->owner) {
      b.skipped_keep_ += t.bytes;
      continue;
    }
    const Capabilities* reach = reach_of(src->owner);
    const LinkPath path = link_path(t.src == t.dst, src->owner == options_.self, reach, options_);
    if (path == LinkPath::none && !remote_)
      throw Error(describe(t, i) + ": its source is in process " + std::to_string(src->owner) + " but no remote transport is set");
    if (path == LinkPath::none)
      throw Error(describe(t, i) + ": its source is in process " + std::to_string(src->owner) + " and the " +
                  std::string(remote_->name()) + " transport has neither gets nor tagged messages");
    const bool local = path == LinkPath::copy;
    if (path != LinkPath::message) check_kind(t, i, local, src->kind, "source", reach);  // a sender stages its own side
    check_kind(t, i, local, dst->kind, "destination", reach, path == LinkPath::message);
    BoundTransition::BoundOp op{static_cast<std::uint32_t>(i), unit->second, {}, t.src == t.dst, {}};
    op.grouped = path == LinkPath::message && reach->grouped;
    op.in_rounds = path == LinkPath::message && (options_.rounds || op.grouped);
    op.peer_moves = path == LinkPath::message && moves(reach->memory, dst->kind);
    op.peer_packs = path == LinkPath::message && reach->strided_messages;
    op.list.op = local ? Op::copy : path == LinkPath::message ? Op::recv : Op::get;
    op.list.kind = dst->kind;
    op.list.peer = src->owner;
    op.list.local_device = t.dst;
    op.list.remote_device = t.src;
    // A recv's source offset stands for the sender's address: only the runs' shape counts.
    add_segments(t, op.list.op == Op::recv ? so : src->address + so, dst->address + dof, w, op.list.segments);
    ++b.unit_ops_[op.unit];
    ++b.landing_ops_;
    b.ops_.push_back(std::move(op));
  }
  // Messages are numbered per link in transfer order: each process binds the transfers
  // touching it, in the plan's order, so both ends of a link see the same sequence.
  std::map<std::pair<DeviceId, DeviceId>, std::uint64_t> sent_on, received_on;
  for (auto& op : b.ops_) {
    op.parts = chunked(op.list, options_.chunk_bytes);
    if (op.list.op != Op::send && op.list.op != Op::recv) continue;
    const Transfer& t = transfers[op.transfer];
    if (t.src < 0 || t.src >= kTagDevices || t.dst < 0 || t.dst >= kTagDevices)
      throw Error(describe(t, op.transfer) + ": two-sided tags name devices below " + std::to_string(kTagDevices));
    std::uint64_t& next = (op.list.op == Op::send ? sent_on : received_on)[{t.src, t.dst}];
    if (next + op.parts.size() > kTagOrdinals)
      throw Error(describe(t, op.transfer) + ": more than " + std::to_string(kTagOrdinals) + " messages on its link; raise the chunk size");
    op.first_message = static_cast<std::uint32_t>(next);
    next += op.parts.size();
  }
  // Rounds: round r takes each link's ordinals [r·c, (r + 1)·c); inside a round the order
  // is (source, destination, ordinal, receive first), which both ends of a link compute.
  std::map<std::tuple<std::uint64_t, DeviceId, DeviceId, std::uint32_t, bool>, BoundTransition::Part> by_round;
  const unsigned c = options_.per_link_concurrency;
  for (std::uint32_t i = 0; i < b.ops_.size(); ++i) {
    const auto& op = b.ops_[i];
    if (!op.in_rounds) continue;
    for (std::uint32_t k = 0; k < op.parts.size(); ++k) {
      const std::uint32_t ordinal = op.first_message + k;
      by_round[{ordinal / c, op.src(), op.dst(), ordinal, op.list.op == Op::send}] = {i, k};
    }
  }
  for (const auto& [key, part] : by_round) {
    const std::uint64_t r = std::get<0>(key);
    if (b.rounds_.size() <= r) b.rounds_.resize(r + 1);
    b.rounds_[r].push_back(part);
  }
  std::map<std::tuple<DeviceId, DeviceId, bool>, std::size_t> link_of;
  for (std::uint32_t i = 0; i < b.ops_.size(); ++i) {
    const auto& op = b.ops_[i];
    auto [it, fresh] = link_of.try_emplace(std::make_tuple(op.src(), op.dst(), op.list.op == Op::send), b.links_.size());
    if (fresh) b.links_.emplace_back();
    b.links_[it->second].push_back(i);
  }
  return b;
}

std::uint64_t BoundTransition::bytes() const {
  std::uint64_t n = 0;
  for (const BoundOp& op : ops_)
    if (op.list.op != Op::send) n += op.list.bytes();
  return n;
}

std::vector<Message> BoundTransition::messages() const {
  // Link queue by link queue, ops and their chunks in order: what run() posts on each link
  // (its workers take a queue's ops in this order).
  std::vector<Message> out;
  for (const auto& queue : links_)
    for (std::uint32_t i : queue) {
      const BoundOp& op = ops_[i];
      if (op.list.op != Op::send && op.list.op != Op::recv) continue;
      for (std::uint32_t k = 0; k < op.parts.size(); ++k)
        out.push_back({op.list.op, op.list.peer, op.src(), op.dst(), op.first_message + k, op.parts[k].bytes(), op.transfer, k});
    }
  return out;
}

std::vector<std::vector<Message>> BoundTransition::rounds() const {
  std::vector<std::vector<Message>> out(rounds_.size());
  for (std::size_t r = 0; r < rounds_.size(); ++r)
    for (const Part& p : rounds_[r]) {
      const BoundOp& op = ops_[p.op];
      out[r].push_back({op.list.op, op.list.peer, op.src(), op.dst(), op.first_message + p.chunk, op.parts[p.chunk].bytes(),
                        op.transfer, p.chunk});
    }
  return out;
}

Executor::Staging Executor::staging(std::size_t bytes) {
  for (auto it = spare_staging_.begin(); it != spare_staging_.end(); ++it)
    if (it->size >= bytes) {
      Staging buf = std::move(*it);
      spare_staging_.erase(it);
      return buf;
    }
  return {std::unique_ptr<std::byte, FreeHost>(copies_.alloc_host(bytes), FreeHost{&copies_}), bytes};  // not zeroed
}

void Executor::give_back(Staging buffer) {
  // Kept for the next messages (no allocation or first-touch faults per chunk), a few at most.
  if (spare_staging_.size() < 16) spare_staging_.push_back(std::move(buffer));
}

void Executor::keep_or_give_back(Staging buffer, const Status& posted) {
  if (!buffer.memory) return;
  // An abandoned send's request may still read it (a peer resuming over TCP): never
  // reused, never freed. At most one chunk per send abandoned after an abort.
  if (posted.code() == StatusCode::abandoned) (void)buffer.memory.release();
  else give_back(std::move(buffer));
}

Executor::Outgoing Executor::outgoing(const BoundTransition::BoundOp& op, std::uint32_t chunk, std::uint64_t tag) {
  const DescriptorList& part = op.parts[chunk];
  const bool sends = part.op == Op::send;
  Outgoing out;
  out.msg = part;
  out.msg.tag = tag;
  const bool remote_moves_it = op.peer_moves;  // what bind() found its peer's transport does
  if (remote_moves_it && op.peer_packs) return out;  // the transport packs and unpacks itself
  // Our side's runs, in message order; contiguous when each starts where the last ended.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> runs;  // address, bytes
  for (const Segment& s : part.segments) {
    const std::uint64_t at = sends ? s.src : s.dst, stride = sends ? s.src_stride : s.dst_stride;
    for (std::uint64_t r = 0; r < s.count; ++r) {
      const std::uint64_t a = at + r * stride;
      if (!runs.empty() && runs.back().first + runs.back().second == a) runs.back().second += s.bytes;
      else runs.push_back({a, s.bytes});
    }
  }
  if (runs.size() == 1 && remote_moves_it) {
    out.msg.segments = {sends ? Segment{runs[0].first, 0, runs[0].second} : Segment{0, runs[0].first, runs[0].second}};
    return out;
  }
  // Strided on our side, or memory the remote transport does not move (GPU memory over a
  // host-only UCX): pack into contiguous host staging before sending, or unpack after
  // receiving, with the copy transport (copy threads, or a CUDA stream), never on the
  // event loop. Chunks in flight on a link overlap one's copy with another's message.
  out.msg.kind = MemoryKind::host;
  const std::uint64_t total = part.bytes();
  out.buffer = staging(total);
  const auto base = reinterpret_cast<std::uint64_t>(out.buffer.memory.get());
  out.copy.op = Op::copy;
  out.copy.kind = part.kind;
  out.copy.local_device = out.copy.remote_device = part.local_device;
  std::uint64_t off = 0;
  for (const Segment& s : part.segments) {
    if (sends) out.copy.segments.push_back({s.src, base + off, s.bytes, s.count, s.src_stride, s.bytes});
    else out.copy.segments.push_back({base + off, s.dst, s.bytes, s.count, s.bytes, s.dst_stride});
    off += s.total();
  }
  out.msg.segments = {sends ? Segment{base, 0, total} : Segment{0, base, total}};
  return out;
}

asio::awaitable<Status> Executor::message(const BoundTransition::BoundOp& op, std::uint32_t chunk, std::uint64_t tag) {
  Outgoing o = outgoing(op, chunk, tag);
  const bool sends = op.list.op == Op::send;
  Status st;
  if (sends && o.staged()) st = co_await copies_.post(o.copy);
  if (st) st = co_await remote_->post(std::move(o.msg));
  if (st && !sends && o.staged()) st = co_await copies_.post(o.copy);
  keep_or_give_back(std::move(o.buffer), st);
  co_return st;
}

asio::awaitable<ExecutionReport> Executor::run(const BoundTransition& bound) {
  using clock = std::chrono::steady_clock;
  using BoundOp = BoundTransition::BoundOp;
  const auto t0 = clock::now();
  auto since = [t0] { return std::chrono::duration<double>(clock::now() - t0).count(); };
  ExecutionReport report;
  report.started_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count();
  report.skipped_keep = bound.skipped_keep_;
  landed_ = 0;
  const std::uint32_t run_number = bound.runs_++;

  // Each link queue gets `per_link_concurrency` workers. A link's sends and receives queue
  // apart: when one process does both (every link remote), a send waiting for its receive
  // must not hold the worker that would post it. In rounds, one coroutine posts every
  // two-sided chunk instead.
  const auto& links = bound.links_;
  auto two_sided = [](const BoundOp& op) { return op.list.op == Op::send || op.list.op == Op::recv; };
  std::vector<std::size_t> next(links.size(), 0);
  std::vector<std::uint32_t> left = bound.unit_ops_;
  for (std::uint32_t u = 0; u < left.size(); ++u)
    if (left[u] == 0 && bound.landing_ops_ > 0) report.commits.push_back({u, 0.0});
  std::string error;

  auto ex = co_await asio::this_coro::executor;
  AsyncScope scope(ex);
  running_ = &scope;
  auto fail = [&](const BoundOp& op, const Status& st) {
    if (!error.empty()) return;
    error = "transfer " + std::to_string(op.transfer) + " (device " + std::to_string(op.src()) + " -> " +
            std::to_string(op.dst()) + ") failed: " + st.message();
    scope.cancel();  // the caller too: AsyncScope clears that as it ends
  };
  auto op_done = [&](const BoundOp& op, double start) {
    const std::uint64_t bytes = op.list.bytes();
    if (op.unit == BoundTransition::kNone) {  // a send: its receiver times and commits it
      report.sent_bytes += bytes;
      return;
    }
    report.timings.push_back({op.transfer, op.list.remote_device, op.list.local_device, bytes, start, since()});
    (op.local ? report.local_bytes : report.link_bytes) += bytes;
    if (--left[op.unit] == 0) report.commits.push_back({op.unit, since()});
  };
  auto worker = [&](std::size_t link) -> asio::awaitable<void> {
    while (error.empty() && next[link] < links[link].size()) {
      const auto& op = bound.ops_[links[link][next[link]++]];
      const double start = since();
      Transport& tr = op.list.op == Op::copy ? copies_ : *remote_;
      for (std::uint32_t k = 0; k < op.parts.size(); ++k) {
        const DescriptorList& part = op.parts[k];
        Status st;  // no co_await inside ?: (GCC 12 destroys the temporaries twice)
        if (two_sided(op)) st = co_await message(op, k, message_tag(run_number, op.src(), op.dst(), op.first_message + k));
        else st = co_await tr.post(part);
        if (!st) co_return fail(op, st);
        if (op.unit != BoundTransition::kNone) landed_ += part.bytes();
      }
      op_done(op, start);
    }
  };
  // Rounds: pack the round's staged sends, post all its messages together (one group on a
  // grouped transport), unpack its staged receives, then the next round.
  std::vector<double> op_start(bound.ops_.size(), -1.0);
  std::vector<std::size_t> parts_left(bound.ops_.size());
  for (std::size_t i = 0; i < bound.ops_.size(); ++i) parts_left[i] = bound.ops_[i].parts.size();
  auto post_one = [&](Outgoing& o, Status& st) -> asio::awaitable<void> { st = co_await remote_->post(o.msg); };
  auto post_grouped = [&](std::vector<DescriptorList> lists, Status& st) -> asio::awaitable<void> {
    st = co_await remote_->post_group(std::move(lists));
  };
  auto rounds = [&]() -> asio::awaitable<void> {
    for (const auto& round : bound.rounds_) {
      if (!error.empty()) co_return;
      const double start = since();
      std::vector<Outgoing> outs;
      outs.reserve(round.size());
      for (const auto& p : round) {
        const BoundOp& op = bound.ops_[p.op];
        if (op_start[p.op] < 0) op_start[p.op] = start;
        outs.push_back(outgoing(op, p.chunk, message_tag(run_number, op.src(), op.dst(), op.first_message + p.chunk)));
      }
      std::vector<Status> status(round.size());
      for (std::size_t i = 0; i < outs.size() && error.empty(); ++i)
        if (outs[i].msg.op == Op::send && outs[i].staged()) {
          status[i] = co_await copies_.post(outs[i].copy);
          if (!status[i]) fail(bound.ops_[round[i].op], status[i]);
        }
      if (error.empty()) {
        // Every message of the round in flight at once: those of grouped peers as one group
        // (NCCL), the others each on its own.
        AsyncScope together(ex);
        std::vector<DescriptorList> group;
        std::size_t first_grouped = round.size();
        for (std::size_t i = 0; i < outs.size(); ++i)
          if (bound.ops_[round[i].op].grouped) {
            group.push_back(outs[i].msg);
            first_grouped = std::min(first_grouped, i);
          } else {
            together.spawn(post_one(outs[i], status[i]));
          }
        Status group_status;
        if (!group.empty()) together.spawn(post_grouped(std::move(group), group_status));
        co_await together.join();
        for (std::size_t i = 0; i < outs.size(); ++i)
          if (!status[i]) fail(bound.ops_[round[i].op], status[i]);
        if (!group_status) fail(bound.ops_[round[first_grouped].op], group_status);
      }
      for (std::size_t i = 0; i < outs.size() && error.empty(); ++i)
        if (outs[i].msg.op == Op::recv && outs[i].staged()) {
          status[i] = co_await copies_.post(outs[i].copy);
          if (!status[i]) fail(bound.ops_[round[i].op], status[i]);
        }
      for (std::size_t i = 0; i < outs.size(); ++i) keep_or_give_back(std::move(outs[i].buffer), status[i]);
      if (!error.empty()) co_return;
      for (const auto& p : round) {
        const BoundOp& op = bound.ops_[p.op];
        if (op.unit != BoundTransition::kNone) landed_ += op.parts[p.chunk].bytes();
        if (--parts_left[p.op] == 0) op_done(op, op_start[p.op]);
      }
    }
  };
  for (std::size_t l = 0; l < links.size(); ++l) {
    if (bound.ops_[links[l].front()].in_rounds) continue;  // a link queue's ops share one path and peer
    for (unsigned k = 0; k < options_.per_link_concurrency && k < links[l].size(); ++k) scope.spawn(worker(l));
  }
  if (!bound.rounds_.empty()) scope.spawn(rounds());
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
