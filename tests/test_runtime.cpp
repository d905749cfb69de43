// Runtime: device arenas, the async scope, the executor against a mock transport, and
// the local transport moving real bytes.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <cstring>
#include <numeric>

#include "mock_transport.hpp"
#include "runtime_world.hpp"
#include "run_async.hpp"
#include "nereus/core/bytes.hpp"
#include "nereus/base/error.hpp"
#include "nereus/plan/reshard.hpp"
#include "nereus/runtime/executor.hpp"
#include "nereus/transport/cuda.hpp"
#include "nereus/transport/local.hpp"
#include "nereus/transport/ucx.hpp"

using namespace nereus;
using testing::error_of;
using testing::has;
using testing::run_on;
using testing::World;
using testing::coll;

namespace {



// Coroutine bodies are free functions: a capturing lambda coroutine would outlive its
// closure.
asio::awaitable<void> tick(int* done, int i) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  t.expires_after(std::chrono::microseconds(50 * (i % 5)));
  co_await t.async_wait(asio::use_awaitable);
  ++*done;
}

asio::awaitable<void> boom() {
  throw Error("boom");
  co_return;
}

}  // namespace

TEST_CASE("device arenas: cap, current and peak use, reuse after free") {
  auto dev = make_device({MemoryKind::host, 3, 1 << 20});
  Device& d = *dev;
  CHECK(d.kind() == MemoryKind::host);
  // CUDA devices: one error naming the device when CUDA is not built in, or no GPU is here.
  if (!cuda_built())
    CHECK(error_of([] { make_device({MemoryKind::cuda, 0, 1 << 20}); }).find("no cuda backend") != std::string::npos);
  else if (cuda_device_count() == 0)
    CHECK(error_of([] { make_device({MemoryKind::cuda, 0, 1 << 20}); }).find("device 0: no CUDA device 0") != std::string::npos);
  auto a = d.allocate(300 << 10, "a");
  auto b = d.allocate(300 << 10, "b");
  CHECK(d.used() >= 600 << 10);
  const std::string err = error_of([&] { d.allocate(600 << 10, "c"); });
  CHECK(err.find("device 3: cannot allocate") != std::string::npos);
  CHECK(err.find("for c") != std::string::npos);
  a = DeviceBuffer();
  auto c = d.allocate(300 << 10, "c");  // fits again
  CHECK(d.peak() >= 600 << 10);
  b = DeviceBuffer();
  c = DeviceBuffer();
  CHECK(d.used() == 0);
  auto whole = d.allocate(1 << 20, "whole");  // freed blocks coalesced
  CHECK(whole.size() == 1 << 20);
  auto q = d.make_queue();
  std::memset(whole.data(), 7, 64);
  q->copy(whole.data() + 64, whole.data(), 64);
  CHECK(q->record()->ready());
  CHECK(q->idle());
  CHECK(std::to_integer<int>(whole.data()[100]) == 7);
  CHECK(parse_capacity("2GiB") == (std::size_t{2} << 30));
  CHECK(parse_capacity("1.5GB") == 1500000000u);
  CHECK(error_of([] { parse_capacity("2GB/s"); }).find("unknown unit") != std::string::npos);
}

TEST_CASE("async scope joins everything it spawned and reports the first exception") {
  asio::io_context io;
  int done = 0;
  auto body = [&]() -> asio::awaitable<int> {
    AsyncScope scope(co_await asio::this_coro::executor);
    for (int i = 0; i < 50; ++i) scope.spawn(tick(&done, i));
    co_await scope.join();
    scope.spawn(boom());
    std::string what;
    try {
      co_await scope.join();
    } catch (const Error& e) {
      what = e.what();
    }
    co_return what == "boom" ? 1 : 0;
  };
  CHECK(run_on(io, body()) == 1);
  CHECK(done == 50);
}

TEST_CASE("async scope: cancelling a parent while it joins cancels the children and still waits for them") {
  // Before, the join threw at once and the scope went away with its children running
  // (an abort): a coordinator stopped while it closed a job's sessions did that.
  asio::io_context io;
  bool child_cancelled = false, parent_saw_it = false;
  auto child = [&]() -> asio::awaitable<void> {
    asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::seconds(30));
    auto [ec] = co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
    child_cancelled = ec == asio::error::operation_aborted;
  };
  auto parent = [&]() -> asio::awaitable<void> {
    AsyncScope scope(co_await asio::this_coro::executor);
    scope.spawn(child());
    co_await scope.join();  // returns once the child has ended
    try {
      asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(1));
      co_await t.async_wait(asio::use_awaitable);
    } catch (const boost::system::system_error&) {
      parent_saw_it = true;  // its own cancellation still holds after the join
    }
  };
  asio::cancellation_signal stop;
  bool done = false;
  asio::co_spawn(io, parent(), asio::bind_cancellation_slot(stop.slot(), [&](std::exception_ptr) { done = true; }));
  asio::steady_timer later(io, std::chrono::milliseconds(10));
  later.async_wait([&](auto) { stop.emit(asio::cancellation_type::terminal); });
  const auto t0 = std::chrono::steady_clock::now();
  io.run();
  CHECK(done);
  CHECK(child_cancelled);
  CHECK(parent_saw_it);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}

TEST_CASE("executor: per-link concurrency, commits after the last byte, failure, cancellation") {
  const auto src = coll("tp=2,pp=1,dp=1");
  const auto dst = coll("tp=1,pp=1,dp=2,devices=2:3");
  const auto plan = plan_reshard(src, dst);
  const auto transfers = plan.transfers();
  World w;
  w.bind_all(plan);
  asio::io_context io;
  testing::MockTransport mock(io.get_executor());
  ExecutorOptions opt;
  opt.per_link_concurrency = 2;
  Executor ex(mock, &mock, [](DeviceId) { return PeerId{0}; }, opt);
  const BoundTransition bound = ex.bind(transfers, plan.target(), w.table);
  CHECK(bound.size() == transfers.size());

  SUBCASE("runs every transfer, at most 2 per link, commits each unit once") {
    const auto report = run_on(io, ex.run(bound));
    CHECK(report.timings.size() == transfers.size());
    CHECK(mock.max_in_flight <= 2 * 4);  // 4 links (0->2, 1->2, 0->3, 1->3)
    CHECK(mock.max_in_flight >= 2);
    REQUIRE(report.commits.size() == 2);
    for (const auto& c : report.commits) {
      double last = 0;
      for (const auto& t : report.timings)
        if (t.dst == dst.units[c.unit].gpus[0]) last = std::max(last, t.end);
      CHECK(c.at >= last);
    }
    CHECK(report.link_bytes == plan.summary().moved_bytes);
  }
  SUBCASE("a failed transfer stops the run with its reason") {
    mock.fail_on = 5;
    const std::string err = error_of([&] { run_on(io, ex.run(bound)); });
    CHECK(err.find("failed: mock failure") != std::string::npos);
    CHECK(mock.in_flight == 0);
  }
  SUBCASE("cancel reaches in-flight transfers") {
    mock.hang_on = 3;
    asio::steady_timer t(io);
    t.expires_after(std::chrono::milliseconds(20));
    t.async_wait([&](auto) { ex.cancel(); });
    const std::string err = error_of([&] { run_on(io, ex.run(bound)); });
    CHECK(err.find("cancelled") != std::string::npos);
    CHECK(mock.in_flight == 0);
  }
}

TEST_CASE("executor rejects a transfer set that does not match its buffers before any byte moves") {
  const auto src = coll("tp=2,pp=1,dp=1");
  const auto dst = coll("tp=1,pp=1,dp=1,devices=2");
  const auto plan = plan_reshard(src, dst);
  auto transfers = plan.transfers();
  World w;
  w.bind_all(plan);
  asio::io_context io;
  testing::MockTransport mock(io.get_executor());
  Executor ex(mock, &mock, [](DeviceId) { return PeerId{0}; });
  auto bad = transfers;
  bad[3].dst_view.view.offset += 1 << 20;
  CHECK(error_of([&] { ex.bind(bad, plan.target(), w.table); }).find("overruns the bound destination buffer") != std::string::npos);
  bad = transfers;
  bad[1].src = 7;
  CHECK(error_of([&] { ex.bind(bad, plan.target(), w.table); }).find("no source buffer is bound on device 7") != std::string::npos);
  bad = transfers;
  bad[0].bytes += 1;
  CHECK(error_of([&] { ex.bind(bad, plan.target(), w.table); }).find("do not fit its box") != std::string::npos);
  // Memory kinds: GPU memory handed to a host-only transport is refused, naming it.
  BufferTable gpu = w.table;
  const Transfer& first = transfers[0];
  BoundBuffer on_gpu = *gpu.find({kTargetSide, first.dst, first.dst_view.buffer, first.slot});
  on_gpu.kind = MemoryKind::cuda;
  gpu.bind({kTargetSide, first.dst, first.dst_view.buffer, first.slot}, on_gpu);
  const std::string why = error_of([&] { ex.bind(transfers, plan.target(), gpu); });
  CHECK(has(why, "its destination is cuda memory, which the mock transport does not move"));
  CHECK(mock.posts == 0);
}

TEST_CASE("executor: each bound list carries its buffers' memory kind") {
  const auto src = coll("tp=2,pp=1,dp=1");
  const auto dst = coll("tp=1,pp=1,dp=1,devices=2");
  const auto plan = plan_reshard(src, dst);
  World w;
  w.bind_all(plan);
  asio::io_context io;
  testing::MockTransport mock(io.get_executor());
  mock.memory = {MemoryKind::host, MemoryKind::cuda};
  Executor ex(mock, &mock, [](DeviceId) { return PeerId{0}; });
  const auto transfers = plan.transfers();
  for (const Transfer& t : transfers) {  // every target buffer "on a GPU"
    BoundBuffer b = *w.table.find({kTargetSide, t.dst, t.dst_view.buffer, t.slot});
    b.kind = MemoryKind::cuda;
    w.table.bind({kTargetSide, t.dst, t.dst_view.buffer, t.slot}, b);
  }
  const BoundTransition bound = ex.bind(transfers, plan.target(), w.table);
  testing::run_on(io, ex.run(bound));
  REQUIRE(!mock.posted.empty());
  for (const DescriptorList& l : mock.posted) CHECK(l.kind == MemoryKind::cuda);
}

TEST_CASE("local transport moves real bytes, strided and chunked, through the executor") {
  const auto src = coll("tp=4,pp=1,dp=1,packing=fused", true);
  const auto dst = coll("tp=2,pp=1,dp=2,devices=2:5:4:6", true);
  const auto plan = plan_reshard(src, dst);
  const auto transfers = plan.transfers();
  World w;
  w.bind_all(plan);
  w.pattern_sources();
  asio::io_context io;
  LocalTransport local({2, 4096});
  ExecutorOptions opt;
  opt.chunk_bytes = 10000;
  Executor ex(local, nullptr, [](DeviceId) { return PeerId{0}; }, opt);
  const auto report = run_on(io, ex.run(ex.bind(transfers, plan.target(), w.table)));
  CHECK(report.link_bytes == plan.summary().moved_bytes);
  CHECK(testing::landed_as_planned(transfers, w.table));  // every destination element equals its source
  // No view reaches outside: a second run is byte-identical and sources are untouched.
  CHECK_NOTHROW(run_on(io, ex.run(ex.bind(transfers, plan.target(), w.table))));
}

TEST_CASE("local transport: empty posts complete through the executor's event loop") {
  asio::io_context io;
  LocalTransport local;
  auto body = [&]() -> asio::awaitable<int> {
    int n = 0;
    for (int i = 0; i < 1000; ++i) {
      const Status st = co_await local.post(DescriptorList{});
      n += st.is_ok();
    }
    co_return n;
  };
  CHECK(run_on(io, body()) == 1000);
  DescriptorList get;
  get.op = Op::get;
  auto refuse = [&]() -> asio::awaitable<int> { co_return static_cast<int>((co_await local.post(get)).code()); };
  CHECK(run_on(io, refuse()) == static_cast<int>(StatusCode::not_supported));
}

TEST_CASE("ucx: an arena the transport allocates is mapped for gets, and its bytes arrive") {
  asio::io_context io;
  UcxTransport ucx(io);
  const std::size_t n = 1 << 20;
  auto src = make_device({MemoryKind::host, 0, n, &ucx});  // shared memory from UCX
  auto dst = make_device({MemoryKind::host, 1, n});         // our own anonymous memory
  DeviceBuffer from = src->allocate(256 << 10, "source");
  DeviceBuffer to = dst->allocate(256 << 10, "target");
  for (std::size_t i = 0; i < from.size(); ++i) from.data()[i] = static_cast<std::byte>(i * 7 + 3);
  const Registration rs = ucx.register_memory({src->arena(), src->capacity(), 0, MemoryKind::host});
  const Registration rd = ucx.register_memory({dst->arena(), dst->capacity(), 1, MemoryKind::host});
  REQUIRE(ucx.connect(0, ucx.address()).is_ok());
  REQUIRE(ucx.add_remote_region(0, 0, rs.remote_key).is_ok());
  const auto at = reinterpret_cast<std::uint64_t>(from.data());
  CHECK(ucx.mapped(0, 0, at) != nullptr);  // readable directly: one copy per get
  CHECK(ucx.mapped(0, 1, at) == nullptr);  // no rkey for device 1 of peer 0
  DescriptorList get;
  get.op = Op::get;
  get.peer = 0;
  get.local_device = 1;
  get.remote_device = 0;
  get.segments.push_back({at, reinterpret_cast<std::uint64_t>(to.data()), from.size(), 1, 0, 0});
  const Status st = testing::run_on(io, [&]() -> asio::awaitable<Status> { co_return co_await ucx.post(get); }());
  CHECK(st.is_ok());
  CHECK(std::memcmp(from.data(), to.data(), from.size()) == 0);
  testing::run_on(io, [&]() -> asio::awaitable<int> {
    co_await ucx.shutdown();
    co_return 0;
  }());
  ucx.deregister_memory(rs);
  ucx.deregister_memory(rd);
}


TEST_CASE("ucx: memory registered on its own is reached through its own key, beside the device's") {
  asio::io_context io;
  UcxTransport ucx(io);
  const std::size_t n = 1 << 20;
  auto src = make_device({MemoryKind::host, 0, n, &ucx});
  auto dst = make_device({MemoryKind::host, 1, n});
  DeviceBuffer in_arena = src->allocate(64 << 10, "arena source");
  std::vector<std::byte> framework(96 << 10);  // a framework's buffer of device 0, outside its arena
  DeviceBuffer to = dst->allocate(160 << 10, "target");
  for (std::size_t i = 0; i < in_arena.size(); ++i) in_arena.data()[i] = static_cast<std::byte>(i * 5 + 1);
  for (std::size_t i = 0; i < framework.size(); ++i) framework[i] = static_cast<std::byte>(i * 3 + 2);
  const Registration whole = ucx.register_memory({src->arena(), src->capacity(), 0, MemoryKind::host});
  const Registration own = ucx.register_memory({framework.data(), framework.size(), 0, MemoryKind::host});
  const Registration rd = ucx.register_memory({dst->arena(), dst->capacity(), 1, MemoryKind::host});
  REQUIRE(ucx.connect(0, ucx.address()).is_ok());
  const auto fw = reinterpret_cast<std::uint64_t>(framework.data());
  DescriptorList get;
  get.op = Op::get;
  get.peer = 0;
  get.local_device = 1;
  get.remote_device = 0;
  auto post = [&] { return testing::run_on(io, [&]() -> asio::awaitable<Status> { co_return co_await ucx.post(get); }()); };
  // Only the framework buffer's key so far: an address outside it is named, not read.
  REQUIRE(ucx.add_remote_region(0, 0, own.remote_key, fw, framework.size()).is_ok());
  get.segments = {{reinterpret_cast<std::uint64_t>(in_arena.data()), reinterpret_cast<std::uint64_t>(to.data()), 4096, 1, 0, 0}};
  const Status outside = post();
  CHECK(has(outside.message(), "no region of device 0 of peer 0 holds address"));
  // More of the framework's buffers, their keys added out of address order: each get finds
  // the range holding it; one that runs a byte past a range is refused.
  std::vector<std::vector<std::byte>> more(3, std::vector<std::byte>(8192));
  std::vector<Registration> more_regs;
  for (auto& m : more) {
    for (std::size_t i = 0; i < m.size(); ++i) m[i] = static_cast<std::byte>(i * 7 + more_regs.size());
    more_regs.push_back(ucx.register_memory({m.data(), m.size(), 0, MemoryKind::host}));
  }
  for (const std::size_t k : {2u, 0u, 1u})
    REQUIRE(ucx.add_remote_region(0, 0, more_regs[k].remote_key, reinterpret_cast<std::uint64_t>(more[k].data()), more[k].size()).is_ok());
  for (const auto& m : more) {
    const auto base = reinterpret_cast<std::uint64_t>(m.data());
    get.segments = {{base + 100, reinterpret_cast<std::uint64_t>(to.data()), m.size() - 100, 1, 0, 0}};
    REQUIRE(post().is_ok());
    CHECK(std::memcmp(to.data(), m.data() + 100, m.size() - 100) == 0);
    get.segments = {{base + 100, reinterpret_cast<std::uint64_t>(to.data()), m.size() - 99, 1, 0, 0}};
    CHECK(has(post().message(), "no region of device 0 of peer 0 holds address"));
  }
  // With the device's key too, one list reads from both: each segment takes its own key.
  REQUIRE(ucx.add_remote_region(0, 0, whole.remote_key).is_ok());
  const auto at = reinterpret_cast<std::uint64_t>(to.data());
  get.segments = {{reinterpret_cast<std::uint64_t>(in_arena.data()), at, in_arena.size(), 1, 0, 0},
                  {fw, at + in_arena.size(), framework.size(), 1, 0, 0}};
  CHECK(post().is_ok());
  CHECK(std::memcmp(to.data(), in_arena.data(), in_arena.size()) == 0);
  CHECK(std::memcmp(to.data() + in_arena.size(), framework.data(), framework.size()) == 0);
  testing::run_on(io, [&]() -> asio::awaitable<int> {
    co_await ucx.shutdown();
    co_return 0;
  }());
  for (const Registration* r : {&whole, &own, &rd}) ucx.deregister_memory(*r);
  for (const Registration& r : more_regs) ucx.deregister_memory(r);
}
TEST_CASE("cuda transport, without a GPU: refuses host memory at bind and at post, with one clear error") {
  if (!cuda_built()) return;  // nothing to check: make_cuda_transport() throws, as the absent backend should
  const auto plan = plan_reshard(coll("tp=2,pp=1,dp=1"), coll("tp=1,pp=1,dp=2,devices=2:3"));
  World w;
  w.bind_all(plan);
  asio::io_context io;
  auto cuda = make_cuda_transport(io);
  CHECK(cuda->name() == "cuda");
  CHECK(cuda->capabilities().memory == std::vector<MemoryKind>{MemoryKind::cuda});
  Executor ex(*cuda, nullptr, [](DeviceId) { return PeerId{0}; });
  const auto transfers = plan.transfers();
  CHECK(has(error_of([&] { ex.bind(transfers, plan.target(), w.table); }), "host memory, which the cuda transport does not move"));
  // Posted anyway (a caller that skipped bind): the list is refused, nothing is enqueued.
  std::vector<std::byte> a(64), b(64);
  DescriptorList l;
  l.segments.push_back({reinterpret_cast<std::uint64_t>(a.data()), reinterpret_cast<std::uint64_t>(b.data()), 64, 1, 0, 0});
  const Status st = run_on(io, [&]() -> asio::awaitable<Status> { co_return co_await cuda->post(l); }());
  CHECK(has(st.message(), "is not in CUDA device memory"));
  l.op = Op::get;  // from a peer region never added
  const Status get = run_on(io, [&]() -> asio::awaitable<Status> { co_return co_await cuda->post(l); }());
  CHECK(get.code() == StatusCode::invalid);
  CHECK(has(get.message(), "no region of device 0 of peer 0 was added"));
  l.op = Op::put;
  const Status put = run_on(io, [&]() -> asio::awaitable<Status> { co_return co_await cuda->post(l); }());
  CHECK(put.code() == StatusCode::not_supported);
}

TEST_CASE("cuda IPC, without a GPU: peers on this machine only, keys checked before CUDA sees them") {
  if (!cuda_built()) return;
  asio::io_context io;
  auto cuda = make_cuda_transport(io);
  CHECK(cuda->capabilities().remote_get);
  std::vector<std::byte> host(64);
  CHECK(has(error_of([&] { cuda->register_memory({host.data(), host.size(), 5, MemoryKind::host}); }),
            "device 5's region is host memory; it registers cuda memory only"));
  const std::vector<std::byte> me = cuda->address();
  const std::string text(reinterpret_cast<const char*>(me.data()), me.size());
  CHECK(text.starts_with("cuda-ipc "));
  const std::string elsewhere = "cuda-ipc 00000000-0000-0000-0000-000000000000";
  const Status far = cuda->connect(1, std::as_bytes(std::span(elsewhere)));
  CHECK(far.code() == StatusCode::not_supported);
  CHECK(has(far.message(), "peer 1 runs on another machine"));
  const std::string junk = "ucx-address";
  CHECK(cuda->connect(2, std::as_bytes(std::span(junk))).code() == StatusCode::invalid);
  const std::vector<std::byte> key(88, std::byte{7});
  CHECK(has(cuda->add_remote_region(1, 4, key).message(), "peer 1 is not connected"));
  REQUIRE(cuda->connect(3, me).is_ok());
  const Status bad = cuda->add_remote_region(3, 4, key);
  CHECK(bad.code() == StatusCode::invalid);
  CHECK(has(bad.message(), "device 4 of peer 3: the remote key is not a cuda IPC key"));
}
