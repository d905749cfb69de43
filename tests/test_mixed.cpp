// Mixed transports in one transition: each peer reached by the first transport that
// connected to it, and the executor binding each link by its peer's transport — gets
// through one, grouped messages in rounds through another — with both ends agreeing.
#include <doctest/doctest.h>

#include <set>

#include "run_async.hpp"
#include "runtime_world.hpp"
#include "test_util.hpp"
#include "nereus/runtime/executor.hpp"
#include "nereus/runtime/participant.hpp"
#include "nereus/transport/local.hpp"
#include "nereus/transport/mixed.hpp"

using namespace nereus;
using testing::coll;
using testing::error_of;
using testing::run_on;

namespace {

std::vector<std::byte> bytes_of(const std::string& s) {
  std::vector<std::byte> out;
  for (char c : s) out.push_back(static_cast<std::byte>(c));
  return out;
}

/// A remote transport that reaches the peers it is told to, records what it is asked,
/// and completes every post at once (it moves no bytes).
class RouteMock final : public Transport {
 public:
  RouteMock(std::string name, Capabilities can, std::set<PeerId> refuses) : name_(std::move(name)), can_(std::move(can)), refuses_(std::move(refuses)) {}
  std::string_view name() const override { return name_; }
  Capabilities capabilities() const override { return can_; }
  Registration register_memory(const MemoryRegion& r) override { return {r, bytes_of(name_ + "-key"), 7}; }
  void deregister_memory(const Registration& r) override { deregistered += r.handle == 7; }
  std::vector<std::byte> address() const override { return bytes_of(name_ + "-address"); }
  Status connect(PeerId peer, std::span<const std::byte> address) override {
    if (refuses_.count(peer)) return {StatusCode::invalid, name_ + " refuses peer " + std::to_string(peer)};
    CHECK(std::vector<std::byte>(address.begin(), address.end()) == bytes_of(name_ + "-address"));
    return Status::ok();
  }
  Status add_remote_region(PeerId peer, DeviceId, std::span<const std::byte> key, std::uint64_t, std::uint64_t) override {
    CHECK(std::vector<std::byte>(key.begin(), key.end()) == bytes_of(name_ + "-key"));
    regions.insert(peer);
    return Status::ok();
  }
  asio::awaitable<Status> post(DescriptorList list) override {
    posted.push_back(list);
    co_return Status::ok();
  }
  asio::awaitable<Status> post_group(std::vector<DescriptorList> lists) override {
    groups.push_back(lists);
    co_return Status::ok();
  }
  std::vector<DescriptorList> posted;
  std::vector<std::vector<DescriptorList>> groups;
  std::set<PeerId> regions;
  int deregistered = 0;

 private:
  std::string name_;
  Capabilities can_;
  std::set<PeerId> refuses_;
};

Capabilities gets_only() {
  Capabilities c;
  c.remote_get = true;
  c.memory = {MemoryKind::host};
  return c;
}
Capabilities grouped_messages() {
  Capabilities c;
  c.two_sided = c.grouped = c.strided_messages = true;
  c.memory = {MemoryKind::host};
  return c;
}

}  // namespace

TEST_CASE("framing: addresses and keys of several transports in one, and back; anything else is no frame") {
  const std::vector<std::vector<std::byte>> parts = {bytes_of("abc"), {}, bytes_of("de")};
  CHECK(unframe(frame(parts)) == parts);
  CHECK(unframe(frame({})).empty());
  auto cut = frame(parts);
  cut.pop_back();
  CHECK(unframe(cut).empty());
  CHECK(unframe(bytes_of("xy")).empty());
}

TEST_CASE("mixed transport: each peer's route is the first transport that connected to it") {
  RouteMock ipc("ipc", gets_only(), {2, 3}), net("net", grouped_messages(), {3});
  MixedTransport mixed({&ipc, &net});
  const auto address = mixed.address();
  for (PeerId p : {0u, 1u, 2u}) REQUIRE(mixed.connect(p, address).is_ok());
  CHECK(mixed.route_name(1) == "ipc");
  CHECK(mixed.route_name(2) == "net");
  CHECK(mixed.capabilities_for(1).remote_get);
  CHECK(mixed.capabilities_for(2).grouped);
  CHECK(mixed.capabilities_for(9).memory.empty());  // not connected: nothing
  const Capabilities all = mixed.capabilities();
  CHECK((all.remote_get && all.two_sided && all.grouped));
  const std::string none = error_of([&] {
    if (Status st = mixed.connect(3, address); !st) throw Error(st.message());
  });
  CHECK(none.find("no transport reaches peer 3 (ipc: ipc refuses peer 3; net: net refuses peer 3)") != std::string::npos);
  CHECK(!mixed.connect(4, bytes_of("not a frame")).is_ok());
  // Keys: each transport registers and later gets its own; a peer's regions reach the
  // transports connected to it.
  std::vector<std::byte> arena(64);
  const Registration r = mixed.register_memory({arena.data(), arena.size(), 0, MemoryKind::host});
  REQUIRE(mixed.add_remote_region(1, 0, r.remote_key).is_ok());
  REQUIRE(mixed.add_remote_region(2, 0, r.remote_key).is_ok());
  CHECK(ipc.regions == std::set<PeerId>{1});
  CHECK(net.regions == std::set<PeerId>{1, 2});
  mixed.deregister_memory(r);
  CHECK(ipc.deregistered + net.deregistered == 2);
}

TEST_CASE("mixed transport in the executor: gets where the peer is reached by gets, grouped rounds where by messages") {
  // Devices 0-1 in process 0, 2-3 in process 1 (reached by `ipc`: same machine), 4-5 in
  // process 2 (reached by `net` only). Process 0 pulls from 1 and receives from 2 in rounds.
  const auto plan = plan_reshard(coll("tp=4,pp=1,dp=1,devices=2:3:4:5"), coll("tp=2,pp=1,dp=1,devices=0:1"));
  const std::function<PeerId(DeviceId)> owner = [](DeviceId d) { return static_cast<PeerId>(d / 2); };
  std::map<PeerId, std::vector<std::vector<Message>>> rounds;
  for (PeerId self : {0u, 2u}) {
    RouteMock ipc("ipc", gets_only(), {2}), net("net", grouped_messages(), {});
    if (self == 2) ipc = RouteMock("ipc", gets_only(), {0, 1});  // process 2 is on the other machine
    MixedTransport mixed({&ipc, &net});
    for (PeerId p : {0u, 1u, 2u})
      if (p != self) REQUIRE(mixed.connect(p, mixed.address()).is_ok());
    testing::World w;
    w.bind_all(plan);  // every buffer here; owners say where each one lives
    BufferTable table;
    for (const auto& [key, b] : w.table.all()) table.bind(key, {b.address, b.bytes, owner(key.device), b.kind});
    LocalTransport local;
    ExecutorOptions opt;
    opt.self = self;
    opt.chunk_bytes = 1 << 14;
    Executor ex(local, &mixed, owner, opt);
    std::vector<DeviceId> mine;
    for (DeviceId d = 0; d < 6; ++d)
      if (owner(d) == self) mine.push_back(d);
    const BoundTransition bound = ex.bind(plan.transfers_touching(mine), plan.target(), table);
    rounds[self] = bound.rounds();
    asio::io_context io;
    run_on(io, ex.run(bound));
    if (self == 0) {
      REQUIRE(!ipc.posted.empty());
      for (const DescriptorList& l : ipc.posted) CHECK((l.op == Op::get && l.peer == 1));
      REQUIRE(!net.groups.empty());
      CHECK(net.posted.empty());
      for (const auto& g : net.groups)
        for (const DescriptorList& l : g) CHECK((l.op == Op::recv && l.peer == 2));
      CHECK(net.groups.size() == rounds[self].size());
    } else {
      CHECK(ipc.posted.empty());
      for (const auto& g : net.groups)
        for (const DescriptorList& l : g) CHECK((l.op == Op::send && l.peer == 0));
    }
  }
  // Both ends of the net links agree, round by round.
  REQUIRE(rounds[0].size() == rounds[2].size());
  for (std::size_t k = 0; k < rounds[0].size(); ++k) {
    REQUIRE(rounds[0][k].size() == rounds[2][k].size());
    for (std::size_t i = 0; i < rounds[0][k].size(); ++i) {
      CHECK(rounds[0][k][i].src == rounds[2][k][i].src);
      CHECK(rounds[0][k][i].dst == rounds[2][k][i].dst);
      CHECK(rounds[0][k][i].ordinal == rounds[2][k][i].ordinal);
      CHECK(rounds[0][k][i].bytes == rounds[2][k][i].bytes);
    }
  }
}

TEST_CASE("transport names: what the benches' and the daemons' reports call each link, by the flags they run with") {
  ReshardSpec c;
  TransportNames n = transport_names(c);  // host memory, UCX gets
  CHECK(n(true, true, true) == "local copy");
  CHECK(n(false, true, true) == "local");
  CHECK(n(false, false, true) == "ucx");
  CHECK(n(false, false, false) == "ucx");
  c.two_sided = true;
  CHECK(transport_names(c)(false, false, false) == "ucx-tag");
  c = {};
  c.cuda = c.ipc = true;  // --transport cuda / auto --memory cuda: IPC inside a machine, staged tagged messages across
  n = transport_names(c);
  CHECK(n(false, true, true) == "cuda");
  CHECK(n(false, false, true) == "cuda-ipc");
  CHECK(n(false, false, false) == "ucx-tag");
  c.nccl = true;  // --across nccl
  CHECK(transport_names(c)(false, false, false) == "nccl");
  CHECK(transport_names(c)(false, false, true) == "cuda-ipc");
  c.ipc = false;  // --transport nccl: every link between processes
  CHECK(transport_names(c)(false, false, true) == "nccl");
}
