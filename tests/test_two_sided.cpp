// Two-sided transitions (tagged send/recv, as NCCL and UCX tags move bytes): every pair of
// processes derives the same messages in the same order per link, checked against the
// plan's own transfers; real bytes through UCX tagged messages in one process.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "mock_transport.hpp"
#include "run_async.hpp"
#include "runtime_world.hpp"
#include "test_util.hpp"
#include "nereus/base/error.hpp"
#include "nereus/runtime/async_scope.hpp"
#include "nereus/runtime/executor.hpp"
#include "nereus/runtime/participant.hpp"
#include "nereus/transport/local.hpp"
#include "nereus/transport/ucx.hpp"

using namespace nereus;
using testing::coll;
using testing::error_of;
using testing::run_on;

namespace {

/// Closes a UCX transport the test made (its worker ends on the test's loop).
void shut_down(asio::io_context& io, UcxTransport& ucx) {
  run_on(io, [&]() -> asio::awaitable<int> {
    co_await ucx.shutdown();
    co_return 0;
  }());
}

/// What process `self` of `procs` binds: its own target buffers and every source buffer
/// (as the peers publish them), at made-up addresses: bind() touches no memory.
BufferTable table_of(const ReshardPlan& plan, const std::function<PeerId(DeviceId)>& owner, PeerId self) {
  BufferTable table;
  std::uint64_t next = 1 << 20;
  for (const Transfer& t : plan.transfers()) {
    const BufferKey src{t.source, t.src, t.src_view.buffer, t.slot}, dst{kTargetSide, t.dst, t.dst_view.buffer, t.slot};
    if (!table.find(src)) table.bind(src, {next += 1 << 26, 1 << 25, owner(t.src)});
    if (owner(t.dst) == self && !table.find(dst)) table.bind(dst, {next += 1 << 26, 1 << 25, self});
  }
  return table;
}

using LinkMessages = std::vector<std::tuple<DeviceId, DeviceId, std::uint32_t, std::uint64_t>>;  // src, dst, ordinal, bytes

LinkMessages of(const std::vector<Message>& all, Op op, PeerId peer) {
  LinkMessages out;
  for (const Message& m : all)
    if (m.op == op && m.peer == peer) out.emplace_back(m.src, m.dst, m.ordinal, m.bytes);
  return out;
}

}  // namespace

TEST_CASE("two-sided schedule: sender and receiver derive the same messages per link, covering the plan") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"tp=4,pp=1,dp=1,packing=fused", "tp=2,pp=1,dp=2"},
      {"tp=2,pp=2,dp=1", "tp=4,pp=1,dp=2,packing=fused"},
      {"tp=1,pp=4,dp=1", "tp=2,pp=1,dp=3,devices=4:5:6:7:0:1"}};
  for (const auto& fromto : cases)
    for (int procs : {2, 3, 4})
      for (std::size_t chunk : {std::size_t{4096}, std::size_t{100000}, std::size_t{64} << 20}) {
        const std::string& from = fromto.first;  // not a structured binding: CAPTURE takes it in a lambda
        const std::string& to = fromto.second;
        CAPTURE(from);
        CAPTURE(to);
        CAPTURE(procs);
        CAPTURE(chunk);
        const auto plan = plan_reshard(coll(from, true), coll(to, true));
        std::set<DeviceId> devs;
        for (const Transfer& t : plan.transfers()) devs.insert(t.src), devs.insert(t.dst);
        const std::vector<DeviceId> all(devs.begin(), devs.end());
        std::map<DeviceId, PeerId> owner_map;
        for (int r = 0; r < procs; ++r)
          for (DeviceId d : devices_of(all, r, procs)) owner_map[d] = static_cast<PeerId>(r);
        const std::function<PeerId(DeviceId)> owner = [&](DeviceId d) { return owner_map.at(d); };
        asio::io_context io;
        testing::MockTransport mock(io.get_executor());
        mock.two_sided = true;
        std::vector<std::vector<Message>> msgs(static_cast<std::size_t>(procs));
        for (int r = 0; r < procs; ++r) {
          ExecutorOptions o;
          o.self = static_cast<PeerId>(r);
          o.two_sided = true;
          o.chunk_bytes = chunk;
          Executor ex(mock, &mock, owner, o);
          // Each process binds only the transfers touching its devices, as Participant does.
          const auto mine = devices_of(all, r, procs);
          const BoundTransition b = ex.bind(plan.transfers_touching(mine), plan.target(), table_of(plan, owner, o.self));
          msgs[static_cast<std::size_t>(r)] = b.messages();
        }
        for (PeerId a = 0; a < static_cast<PeerId>(procs); ++a)
          for (PeerId b = 0; b < static_cast<PeerId>(procs); ++b) {
            if (a == b) continue;
            const LinkMessages sent = of(msgs[a], Op::send, b), received = of(msgs[b], Op::recv, a);
            CHECK(sent == received);
            // Independent count: the plan's transfers from a's devices to b's, whole.
            std::uint64_t want = 0, got = 0;
            for (const Transfer& t : plan.transfers())
              if (owner(t.src) == a && owner(t.dst) == b) want += t.bytes;
            for (const auto& m : sent) got += std::get<3>(m);
            CHECK(got == want);
            // Ordinals on each link run 0, 1, 2, ... in posting order, none over the chunk.
            std::map<std::pair<DeviceId, DeviceId>, std::uint32_t> next;
            for (const auto& [s, d, ordinal, bytes] : sent) {
              CHECK(ordinal == next[{s, d}]++);
              CHECK(bytes <= chunk);
            }
          }
        // Rounds: for every pair, round by round, the sender's list to the receiver is the
        // receiver's from the sender, in the same order; no link has more than c messages
        // in a round; every message is in exactly one round.
        std::vector<std::vector<std::vector<Message>>> rounds(static_cast<std::size_t>(procs));
        for (int r = 0; r < procs; ++r) {
          ExecutorOptions o;
          o.self = static_cast<PeerId>(r);
          o.two_sided = o.rounds = true;
          o.chunk_bytes = chunk;
          Executor ex(mock, &mock, owner, o);
          const auto mine = devices_of(all, r, procs);
          rounds[static_cast<std::size_t>(r)] = ex.bind(plan.transfers_touching(mine), plan.target(), table_of(plan, owner, o.self)).rounds();
          std::size_t n = 0;
          for (const auto& round : rounds[static_cast<std::size_t>(r)]) {
            std::map<std::tuple<DeviceId, DeviceId, Op>, unsigned> per_link;
            for (const Message& m : round) CHECK(++per_link[{m.src, m.dst, m.op}] <= o.per_link_concurrency);
            n += round.size();
          }
          CHECK(n == msgs[static_cast<std::size_t>(r)].size());
        }
        for (PeerId a = 0; a < static_cast<PeerId>(procs); ++a)
          for (PeerId b = 0; b < static_cast<PeerId>(procs); ++b) {
            if (a == b) continue;
            const std::size_t n = std::max(rounds[a].size(), rounds[b].size());
            for (std::size_t k = 0; k < n; ++k) {
              const LinkMessages sent = k < rounds[a].size() ? of(rounds[a][k], Op::send, b) : LinkMessages{};
              const LinkMessages received = k < rounds[b].size() ? of(rounds[b][k], Op::recv, a) : LinkMessages{};
              CHECK(sent == received);
            }
          }
        // Nothing inside one process travels as a message.
        for (int r = 0; r < procs; ++r)
          for (const Message& m : msgs[static_cast<std::size_t>(r)]) CHECK(owner(m.src) != owner(m.dst));
      }
}

TEST_CASE("two-sided tags: a message's tag names its run, link and ordinal, none shared") {
  std::set<std::uint64_t> seen;
  for (std::uint32_t run : {0u, 1u, 255u, 256u, 65535u})
    for (DeviceId s : {0, 1, 1023, kTagDevices - 1})
      for (DeviceId d : {0, 7, kTagDevices - 1})
        for (std::uint32_t k : {0u, 1u, static_cast<std::uint32_t>(kTagOrdinals - 1)}) CHECK(seen.insert(message_tag(run, s, d, k)).second);
  CHECK(message_tag(65536, 3, 4, 5) == message_tag(0, 3, 4, 5));  // runs wrap after 65,536
}

TEST_CASE("two-sided binding needs a transport with tagged messages") {
  const auto plan = plan_reshard(coll("tp=2,pp=1,dp=1"), coll("tp=1,pp=1,dp=2,devices=2:3"));
  asio::io_context io;
  testing::MockTransport mock(io.get_executor());  // says two_sided = false
  ExecutorOptions o;
  o.two_sided = true;
  o.self = 0;
  Executor ex(mock, &mock, [](DeviceId d) { return static_cast<PeerId>(d >= 2); }, o);
  const auto transfers = plan.transfers();
  CHECK(error_of([&] { ex.bind(transfers, plan.target(), table_of(plan, [](DeviceId d) { return static_cast<PeerId>(d >= 2); }, 0)); })
            .find("need a transport with tagged messages; mock has none") != std::string::npos);
}

TEST_CASE("ucx tagged messages move real bytes, strided sides staged, through the executor") {
  const auto src = coll("tp=4,pp=1,dp=1,packing=fused", true);
  const auto dst = coll("tp=2,pp=1,dp=2,devices=2:5:4:6", true);
  const auto plan = plan_reshard(src, dst);
  const auto transfers = plan.transfers();
  testing::World w;
  w.bind_all(plan);
  w.pattern_sources();
  asio::io_context io;
  UcxTransport ucx(io);
  REQUIRE(ucx.connect(0, ucx.address()).is_ok());
  LocalTransport local({2, 4096});
  ExecutorOptions opt;
  opt.chunk_bytes = 10000;  // many chunks; strided boxes staged on one side or both
  opt.remote_links = true;  // every link as messages, sent and received in this process
  opt.two_sided = true;
  Executor ex(local, &ucx, [](DeviceId) { return PeerId{0}; }, opt);
  const BoundTransition bound = ex.bind(transfers, plan.target(), w.table);
  std::uint64_t sends = 0, recvs = 0;
  for (const Message& m : bound.messages()) (m.op == Op::send ? sends : recvs) += m.bytes;
  CHECK(sends == plan.summary().moved_bytes);
  CHECK(recvs == sends);
  for (int run = 0; run < 2; ++run) {  // the second run's tags differ: nothing stale matches
    const auto report = run_on(io, ex.run(bound));
    CHECK(report.link_bytes == plan.summary().moved_bytes);
    CHECK(report.sent_bytes == plan.summary().moved_bytes);
    CHECK(report.commits.size() == dst.units.size());
  }
  CHECK(testing::landed_as_planned(transfers, w.table));
  shut_down(io, ucx);
}

TEST_CASE("link path: copies inside a process, gets across, messages where asked or where gets are missing") {
  Capabilities gets, tags, both, neither;
  gets.remote_get = true;
  tags.two_sided = true;
  both.remote_get = both.two_sided = true;
  ExecutorOptions plain, forced, all_remote;
  forced.two_sided = true;
  all_remote.remote_links = true;
  // Inside one device, and between devices of one process: the copy transport.
  for (const Capabilities* r : std::vector<const Capabilities*>{nullptr, &gets, &tags, &both, &neither}) {
    CHECK(link_path(true, true, r, all_remote) == LinkPath::copy);
    CHECK(link_path(false, true, r, plain) == LinkPath::copy);
    CHECK(link_path(false, true, r, forced) == LinkPath::copy);
  }
  // Across processes.
  CHECK(link_path(false, false, nullptr, plain) == LinkPath::none);
  CHECK(link_path(false, false, &neither, plain) == LinkPath::none);
  CHECK(link_path(false, false, &gets, plain) == LinkPath::get);
  CHECK(link_path(false, false, &gets, forced) == LinkPath::get);  // messages where the peer's transport has them
  CHECK(link_path(false, false, &tags, plain) == LinkPath::message);  // NCCL: no gets
  CHECK(link_path(false, false, &both, plain) == LinkPath::get);      // UCX: gets unless asked
  CHECK(link_path(false, false, &both, forced) == LinkPath::message);
  // Every link remote (benches): links inside the process take the remote path as well.
  CHECK(link_path(false, true, &both, all_remote) == LinkPath::get);
  CHECK(link_path(false, true, &tags, all_remote) == LinkPath::message);
}

namespace {

/// UCX seen as a transport with tagged messages and no gets, as NCCL is: what the
/// executor's choice sees (the bytes still move through real UCX).
class TagsOnly final : public Transport {
 public:
  /// `grouped`: also says messages go in groups (as NCCL does): post_group posts its
  /// lists at once and completes when all did, recording each group's size.
  explicit TagsOnly(UcxTransport& inner, bool grouped = false) : inner_(inner), grouped_(grouped) {}
  std::string_view name() const override { return grouped_ ? "grouped-tags" : "tags-only"; }
  Capabilities capabilities() const override {
    Capabilities c = inner_.capabilities();
    c.remote_get = c.remote_put = false;
    c.grouped = grouped_;
    return c;
  }
  Registration register_memory(const MemoryRegion& r) override { return inner_.register_memory(r); }
  void deregister_memory(const Registration& r) override { inner_.deregister_memory(r); }
  asio::awaitable<Status> post(DescriptorList list) override {
    if (grouped_) co_return Status{StatusCode::invalid, "grouped-tags: a message posted outside a group"};
    if (list.op == Op::get || list.op == Op::put) co_return Status{StatusCode::not_supported, "tags-only: no gets"};
    co_return co_await inner_.post(std::move(list));
  }
  asio::awaitable<Status> post_group(std::vector<DescriptorList> lists) override {
    groups.push_back(lists.size());
    std::vector<Status> status(lists.size());
    AsyncScope all(co_await asio::this_coro::executor);
    auto one = [this](DescriptorList& l, Status& st) -> asio::awaitable<void> { st = co_await inner_.post(l); };
    for (std::size_t i = 0; i < lists.size(); ++i) all.spawn(one(lists[i], status[i]));
    co_await all.join();
    for (const Status& st : status)
      if (!st) co_return st;
    co_return Status::ok();
  }
  std::vector<std::size_t> groups;

 private:
  UcxTransport& inner_;
  bool grouped_;
};

}  // namespace

TEST_CASE("a remote transport without gets moves links as messages without being asked") {
  testing::Patterned r("tp=2,pp=1,dp=1", "tp=1,pp=1,dp=2,devices=2:3");
  const auto& plan = r.plan;  // references, not a structured binding: lambdas use them (clang 14)
  const auto& transfers = r.transfers;
  auto& w = r.w;
  asio::io_context io;
  UcxTransport ucx(io);
  REQUIRE(ucx.connect(0, ucx.address()).is_ok());
  TagsOnly tags(ucx);
  LocalTransport local({1, 4096});
  ExecutorOptions opt;
  opt.chunk_bytes = 1 << 16;
  opt.remote_links = true;  // two_sided left false: the transport's capabilities decide
  Executor ex(local, &tags, [](DeviceId) { return PeerId{0}; }, opt);
  const BoundTransition bound = ex.bind(transfers, plan.target(), w.table);
  CHECK(!bound.messages().empty());
  const auto report = run_on(io, ex.run(bound));
  CHECK(report.sent_bytes == plan.summary().moved_bytes);
  CHECK(report.link_bytes == plan.summary().moved_bytes);
  CHECK(testing::landed_as_planned(transfers, w.table));
  shut_down(io, ucx);
}

TEST_CASE("two-sided tags: a device beyond the tags' range is one clear error at bind") {
  const auto plan = plan_reshard(coll("tp=2,pp=1,dp=1"), coll("tp=1,pp=1,dp=2,devices=16383:16384"));
  asio::io_context io;
  UcxTransport ucx(io);
  TagsOnly tags(ucx);
  LocalTransport local({1, 4096});
  ExecutorOptions o;
  o.two_sided = true;
  o.self = 0;
  auto owner = [](DeviceId d) { return static_cast<PeerId>(d >= 2); };
  Executor ex(local, &tags, owner, o);
  const auto transfers = plan.transfers();
  CHECK(testing::has(error_of([&] { ex.bind(transfers, plan.target(), table_of(plan, owner, 0)); }),
                     "two-sided tags name devices below 16384"));
  shut_down(io, ucx);
}

namespace {

/// The local copy transport presented as moving GPU memory too, counting its copies and
/// staging: host memory labelled cuda stands in for a GPU's, so that the executor's
/// staging of memory the remote transport does not move runs here (the GPU suite has the
/// real CUDA copies).
class CountingCopies final : public Transport {
 public:
  std::string_view name() const override { return "copies"; }
  Capabilities capabilities() const override {
    Capabilities c = inner_.capabilities();
    c.memory = {MemoryKind::host, MemoryKind::cuda};
    return c;
  }
  Registration register_memory(const MemoryRegion& r) override { return inner_.register_memory(r); }
  asio::awaitable<Status> post(DescriptorList list) override {
    ++posts;
    list.kind = MemoryKind::host;  // what the "GPU memory" really is
    co_return co_await inner_.post(std::move(list));
  }
  std::byte* alloc_host(std::size_t bytes) override {
    ++allocated;
    return inner_.alloc_host(bytes);
  }
  void free_host(std::byte* p) override {
    ++freed;
    inner_.free_host(p);
  }
  int posts = 0, allocated = 0, freed = 0;

 private:
  LocalTransport inner_{{1, 4096}};
};

}  // namespace

TEST_CASE("memory the remote transport does not move is staged through host memory, both ends") {
  testing::Patterned r("tp=2,pp=1,dp=1", "tp=1,pp=1,dp=2,devices=2:3");
  r.as_gpu_memory();
  const auto& plan = r.plan;  // references, not a structured binding: lambdas use them (clang 14)
  const auto& transfers = r.transfers;
  auto& w = r.w;
  asio::io_context io;
  UcxTransport ucx(io);  // moves host memory only
  REQUIRE(ucx.connect(0, ucx.address()).is_ok());
  CountingCopies copies;
  ExecutorOptions opt;
  opt.chunk_bytes = 1 << 14;
  opt.remote_links = true;
  // Gets would hand UCX the GPU memory: refused, naming the way that works.
  Executor gets(copies, &ucx, [](DeviceId) { return PeerId{0}; }, opt);
  CHECK(error_of([&] { gets.bind(transfers, plan.target(), w.table); })
            .find("cuda memory, which the ucx transport does not move (as two-sided messages it would be staged") !=
        std::string::npos);
  opt.two_sided = true;
  {
    Executor ex(copies, &ucx, [](DeviceId) { return PeerId{0}; }, opt);
    const BoundTransition bound = ex.bind(transfers, plan.target(), w.table);
    std::size_t messages = 0;
    for (const Message& m : bound.messages()) messages += m.op == Op::send;
    REQUIRE(messages > 0);
    const auto report = run_on(io, ex.run(bound));
    CHECK(report.sent_bytes == plan.summary().moved_bytes);
    CHECK(testing::landed_as_planned(transfers, w.table));
    // Every message staged at both ends (a pack before each send, an unpack after each
    // receive), in buffers of the copy transport that the executor keeps for reuse.
    CHECK(copies.posts >= static_cast<int>(2 * messages));
    CHECK(copies.allocated > 0);
    CHECK(copies.allocated < static_cast<int>(messages));
  }
  CHECK(copies.freed == copies.allocated);  // given back with the executor
  shut_down(io, ucx);
}

TEST_CASE("a staging copy that fails at once stops a two-sided run with its error, every worker joined") {
  // The failing worker cancels its siblings and so itself; before AsyncScope cleared that,
  // asio threw the cancellation out of the event loop and left the run's workers behind.
  testing::Patterned r("tp=2,pp=1,dp=1", "tp=1,pp=1,dp=2,devices=2:3");
  r.as_gpu_memory();  // every message staged by the copy transport
  const auto& plan = r.plan;  // references, not a structured binding: lambdas use them (clang 14)
  const auto& transfers = r.transfers;
  auto& w = r.w;
  asio::io_context io;
  UcxTransport ucx(io);
  REQUIRE(ucx.connect(0, ucx.address()).is_ok());
  testing::MockTransport broken(io.get_executor());  // every copy fails before it suspends
  broken.memory = {MemoryKind::host, MemoryKind::cuda};
  broken.fail_at_once = true;
  ExecutorOptions opt;
  opt.chunk_bytes = 1 << 14;
  opt.remote_links = true;
  opt.two_sided = true;
  Executor ex(broken, &ucx, [](DeviceId) { return PeerId{0}; }, opt);
  const BoundTransition bound = ex.bind(transfers, plan.target(), w.table);
  std::string why;
  try {
    run_on(io, ex.run(bound));
  } catch (const Error& e) {
    why = e.what();
  }
  CHECK(why.find("failed: mock failure at once") != std::string::npos);
  shut_down(io, ucx);
}


TEST_CASE("rounds: real bytes through UCX tagged messages, round by round, grouped or not") {
  testing::Patterned r("tp=4,pp=1,dp=1", "tp=1,pp=2,dp=2,devices=4:5:6:7");
  const auto& plan = r.plan;  // references, not a structured binding: lambdas use them (clang 14)
  const auto& transfers = r.transfers;
  auto& w = r.w;
  asio::io_context io;
  UcxTransport ucx(io);
  REQUIRE(ucx.connect(0, ucx.address()).is_ok());
  LocalTransport local({1, 4096});
  ExecutorOptions opt;
  opt.chunk_bytes = 1 << 14;  // several rounds per link
  opt.remote_links = opt.two_sided = opt.rounds = true;
  SUBCASE("ungrouped: each round's messages posted at once") {
    Executor ex(local, &ucx, [](DeviceId) { return PeerId{0}; }, opt);
    const BoundTransition bound = ex.bind(transfers, plan.target(), w.table);
    REQUIRE(bound.rounds().size() > 2);
    const auto report = run_on(io, ex.run(bound));
    CHECK(report.sent_bytes == plan.summary().moved_bytes);
    CHECK(report.link_bytes == plan.summary().moved_bytes);
    CHECK(report.commits.size() == plan.target().units.size());
  }
  SUBCASE("grouped: one post_group per round, holding that round's sends and receives") {
    TagsOnly grouped(ucx, true);
    opt.rounds = false;  // a grouped transport runs in rounds without being asked
    Executor ex(local, &grouped, [](DeviceId) { return PeerId{0}; }, opt);
    const BoundTransition bound = ex.bind(transfers, plan.target(), w.table);
    const auto rounds = bound.rounds();
    const auto report = run_on(io, ex.run(bound));
    CHECK(report.link_bytes == plan.summary().moved_bytes);
    REQUIRE(grouped.groups.size() == rounds.size());
    for (std::size_t k = 0; k < rounds.size(); ++k) CHECK(grouped.groups[k] == rounds[k].size());
  }
  CHECK(testing::landed_as_planned(transfers, w.table));
  shut_down(io, ucx);
}

TEST_CASE("rounds: a failed group stops the run naming a transfer; strided messages reach a transport that packs them") {
  testing::Patterned r("tp=2,pp=1,dp=1", "tp=1,pp=1,dp=2,devices=2:3");
  const auto& plan = r.plan;  // references, not a structured binding: lambdas use them (clang 14)
  const auto& transfers = r.transfers;
  auto& w = r.w;
  asio::io_context io;
  testing::MockTransport mock(io.get_executor());
  mock.two_sided = mock.grouped = mock.strided_messages = true;
  LocalTransport local({1, 4096});
  ExecutorOptions opt;
  opt.chunk_bytes = 1 << 14;
  opt.remote_links = opt.two_sided = true;  // the mock has gets too
  Executor ex(local, &mock, [](DeviceId) { return PeerId{0}; }, opt);
  const BoundTransition bound = ex.bind(transfers, plan.target(), w.table);
  run_on(io, ex.run(bound));
  // Nothing staged: the lists go as bound, their strided runs intact, each tagged.
  bool strided = false;
  std::set<std::uint64_t> tags;
  for (const auto& g : mock.groups)
    for (const DescriptorList& l : g) {
      for (const Segment& s : l.segments) strided |= s.count > 1;
      tags.insert(l.tag);
    }
  CHECK(strided);
  CHECK(mock.posted.empty());
  std::size_t n = 0;
  for (const auto& round : bound.rounds()) n += round.size();
  CHECK(tags.size() * 2 == n);  // a send and its receive share a tag
  mock.groups.clear();
  mock.fail_group = 2;
  CHECK(error_of([&] { run_on(io, ex.run(bound)); }).find("failed: mock group failure") != std::string::npos);
  CHECK(mock.groups.size() == 2);  // no round after the failed one
}

TEST_CASE("two-sided tags: a binding's first run takes the run number asked for, so concurrent bindings share no tag") {
  testing::Patterned r("tp=2,pp=1,dp=1", "tp=1,pp=1,dp=2,devices=2:3");
  asio::io_context io;
  testing::MockTransport mock(io.get_executor());
  mock.two_sided = true;
  LocalTransport local({1, 4096});
  auto tags_of_run = [&](std::uint32_t first_run, int runs) {
    ExecutorOptions opt;
    opt.chunk_bytes = 1 << 14;
    opt.remote_links = opt.two_sided = true;
    opt.first_run = first_run;
    Executor ex(local, &mock, [](DeviceId) { return PeerId{0}; }, opt);
    const BoundTransition bound = ex.bind(r.transfers, r.plan.target(), r.w.table);
    std::set<std::uint64_t> tags;
    for (int k = 0; k < runs; ++k) {
      mock.posted.clear();
      run_on(io, ex.run(bound));
    }
    for (const DescriptorList& l : mock.posted) tags.insert(l.tag);
    return tags;
  };
  const std::set<std::uint64_t> build7 = tags_of_run(7, 1), build8 = tags_of_run(8, 1), third = tags_of_run(5, 3);
  REQUIRE(!build7.empty());
  CHECK(build7 == third);  // run 5, 6, then 7: the same tags as a binding that starts at 7
  std::vector<std::uint64_t> shared;
  std::set_intersection(build7.begin(), build7.end(), build8.begin(), build8.end(), std::back_inserter(shared));
  CHECK(shared.empty());
}

TEST_CASE("ucx: a tagged send nobody takes is abandoned, its post ending as cancelled; receives are not") {
  // A send UCX cannot cancel: its peer (here a second worker that never receives it) is
  // lost or aborted. abandon_sends() ends the wait, so its owner can free its memory.
  asio::io_context io;
  UcxTransport a(io), b(io);
  REQUIRE(a.connect(1, b.address()).is_ok());
  REQUIRE(b.connect(0, a.address()).is_ok());
  std::vector<std::byte> big(16 << 20, std::byte{7}), into(4096);
  auto list = [](Op op, PeerId peer, std::uint64_t tag, std::byte* p, std::size_t n) {
    DescriptorList l;
    l.op = op;
    l.peer = peer;
    l.tag = tag;
    const auto at = reinterpret_cast<std::uint64_t>(p);
    l.segments.push_back({op == Op::send ? at : 0, op == Op::recv ? at : 0, n});
    return l;
  };
  std::optional<Status> sent, received;
  asio::cancellation_signal stop_send, stop_recv;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> { sent = co_await a.post(list(Op::send, 1, 41, big.data(), big.size())); },
                 asio::bind_cancellation_slot(stop_send.slot(), asio::detached));
  asio::co_spawn(io, [&]() -> asio::awaitable<void> { received = co_await b.post(list(Op::recv, 0, 42, into.data(), into.size())); },
                 asio::bind_cancellation_slot(stop_recv.slot(), asio::detached));
  auto run_for = [&](std::chrono::milliseconds d) {
    io.restart();
    io.run_for(d);
  };
  run_for(std::chrono::milliseconds(200));
  REQUIRE(!sent);  // rendezvous: waits for a receive that never comes
  REQUIRE(!received);
  stop_send.emit(asio::cancellation_type::terminal);  // what an aborted run does first
  run_for(std::chrono::milliseconds(200));
  CHECK(!sent);  // UCX does not cancel a send
  CHECK(b.abandon_sends() == 0);  // a receive is never abandoned: it writes its buffer
  CHECK(a.abandon_sends() == 1);
  run_for(std::chrono::milliseconds(50));
  REQUIRE(sent);
  CHECK(sent->code() == StatusCode::abandoned);
  CHECK(a.abandon_sends() == 0);  // once
  stop_recv.emit(asio::cancellation_type::terminal);  // a receive cancels
  run_for(std::chrono::milliseconds(200));
  REQUIRE(received);
  CHECK(received->code() == StatusCode::cancelled);
  b.quarantine();  // its worker holds the message nobody took
  shut_down(io, a);
  shut_down(io, b);
}
