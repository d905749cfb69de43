// The control plane's pure parts: frames (round trip, and every way a frame can be bad),
// HMAC against RFC 4231, the challenge-response, launcher environments, membership.
// The daemons themselves are tested across processes in test_daemons.py.
#include <doctest/doctest.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <boost/asio/write.hpp>

#include <chrono>
#include <map>
#include <random>
#include <thread>
#include <sys/stat.h>
#include <unistd.h>

#include "control.capnp.h"
#include "../src/cluster/unit_build.hpp"
#include "nereus/cluster/auth.hpp"
#include "nereus/cluster/channel.hpp"
#include "nereus/cluster/launch.hpp"
#include "nereus/cluster/clock_sync.hpp"
#include "nereus/cluster/membership.hpp"
#include "nereus/cluster/messages.hpp"
#include "nereus/cluster/metrics.hpp"
#include "nereus/cluster/transition_service.hpp"
#include "nereus/core/job.hpp"
#include "run_async.hpp"
#include "test_util.hpp"

using namespace nereus;
using namespace nereus::cluster;
using testing::error_of;
using testing::has;

namespace {

Envelope decode_frame(const Bytes& f) {
  const std::uint32_t n = frame_length(std::span<const std::uint8_t, 4>(f.data(), 4));
  REQUIRE(n + 4 == f.size());
  return decode_body(std::span<const std::uint8_t>(f).subspan(4));
}

std::string decode_error(const Bytes& body) {
  return error_of([&] { decode_body(body); });
}

/// A Channel reading one end of a loopback TCP connection, and the raw socket writing the
/// other (frames go in as bytes, exactly as a peer would send them).
struct Loopback {
  boost::asio::io_context io;
  tcp::acceptor acc{io, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0)};
  tcp::socket writer{io};
  Channel ch{(writer.connect(acc.local_endpoint()), acc.accept())};
  Loopback() { ch.set_peer("peer"); }
};

Bytes flat(capnp::MessageBuilder& m) {
  const auto words = capnp::messageToFlatArray(m);
  return Bytes(words.asBytes().begin(), words.asBytes().end());
}

}  // namespace

TEST_CASE("frames: every message kind survives a round trip") {
  const std::vector<DeviceInfo> devs = {{0, 1u << 30, 4096, 8192}, {7, 2u << 30, 0, 0}};
  std::vector<Body> bodies = {
      Hello{Role::node, 3, 4, Bytes(32, 9)},
      Challenge{Bytes(32, 1), Bytes(32, 2)},
      Authenticate{Bytes(32, 3)},
      Welcome{4},
      ErrorReply{"wrong token"},
      Join{2, 4, "127.0.0.1:9000", devs, 1234},
      Heartbeat{77, devs, -5'000'000'000'123, 30'000'000'000, 41'000},
      StatusRequest{},
      ClusterStatus{4, {NodeStatus{1, true, "h:1", 5, 12, 99, 2, devs, -12'500'000'000, 55'000}, NodeStatus{2, false, "h:2", 6, 3000, 1, 1, {}}}},
  };
  for (const Body& b : bodies) {
    CAPTURE(kind_name(b));
    const Envelope e{kProtocolVersion, 42, 1500, b};
    const Envelope d = decode_frame(encode_frame(e));
    CHECK(d.version == kProtocolVersion);
    CHECK(d.request_id == 42);
    CHECK(d.deadline_ms == 1500);
    REQUIRE(d.body.index() == b.index());
  }
  const Envelope j = decode_frame(encode_frame({kProtocolVersion, 1, 0, Join{2, 4, "127.0.0.1:9000", devs, 1234}}));
  const Join& join = std::get<Join>(j.body);
  CHECK(join.node_rank == 2);
  CHECK(join.listen == "127.0.0.1:9000");
  CHECK(join.devices == devs);
  const Envelope s = decode_frame(encode_frame({kProtocolVersion, 1, 0, bodies.back()}));
  const auto& st = std::get<ClusterStatus>(s.body);
  REQUIRE(st.members.size() == 2);
  CHECK(st.members[0].heartbeats == 99);
  CHECK(st.members[0].clock_offset_ns == -12'500'000'000);
  CHECK(st.members[0].clock_rtt_ns == 55'000);
  CHECK(st.members[1].clock_rtt_ns == -1);  // not measured yet
  CHECK(st.members[1].alive == false);
  const Heartbeat hb = std::get<Heartbeat>(decode_frame(encode_frame({kProtocolVersion, 1, 0, bodies[6]})).body);
  CHECK(hb.clock_ns == -5'000'000'000'123);
  CHECK(hb.offset_ns == 30'000'000'000);
  CHECK(hb.rtt_ns == 41'000);
  CHECK(std::get<Hello>(decode_frame(encode_frame({kProtocolVersion, 1, 0, bodies[0]})).body).role == Role::node);
}

TEST_CASE("a unit build's plan: the source groups to the target, as plan_reshard of the same units, and bad messages named") {
  // The coordinator (senders) and every node of a build derive it with plan_build: here it
  // is checked against plan_reshard of the collections parsed independently.
  const std::vector<ModelStage> stages = model_stages(load_job("ppo-tiny"));
  auto stage = [&](const std::string& name) -> const ModelStage& {
    for (const ModelStage& st : stages)
      if (st.name() == name) return st;
    FAIL("no model-stage " << name);
    throw 0;
  };
  const ModelStage& train = stage("actor/train");
  const ModelStage& gen = stage("actor/generate");
  // Training state in two replicas of tp=2 (devices 0,1 and 2,3) to one tp=4 generation unit.
  const Collection from = Collection::from_spec(train.model, train.name(), parse_collection_spec("tp=2,pp=1,dp=2,devices=0-3"), true);
  const Collection to = Collection::from_spec(gen.model, gen.name(), parse_collection_spec("tp=4,pp=1,dp=1,devices=4-7"), false);
  UnitBuild b{20, {}, UnitDesc{20, "actor/generate", "tp=4,pp=1,dp=1,devices=4-7"}, 0};
  b.sources.push_back({UnitDesc{1, "actor/train", "tp=2,pp=1,dp=1,devices=0:1"}, 0, {}});
  b.sources.push_back({UnitDesc{2, "actor/train", "tp=2,pp=1,dp=1,devices=2:3"}, 0, {}});
  const std::vector<Transfer> got = detail::plan_build(stages, b).transfers();
  const std::vector<Transfer> want = plan_reshard(std::vector<Collection>{from}, to).transfers();
  REQUIRE(got.size() == want.size());
  REQUIRE(!got.empty());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i].src == want[i].src);
    CHECK(got[i].dst == want[i].dst);
    CHECK(got[i].tensor == want[i].tensor);
    CHECK(got[i].slot == want[i].slot);
    CHECK(got[i].bytes == want[i].bytes);
  }

  auto error_of = [&](const UnitBuild& m) {
    try {
      detail::plan_build(stages, m);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  UnitBuild missing = b;
  missing.unit = {};  // a node that only sends has nothing else to go by
  CHECK(error_of(missing) == "unit-build: the target's description is missing");
  UnitBuild other = b;
  other.unit.id = 21;
  CHECK(error_of(other) == "unit-build: the target's description is missing");
  UnitBuild skipped = b;
  skipped.sources[1].group = 2;
  CHECK(error_of(skipped) == "unit-build: source groups must come in order");
  UnitBuild mixed = b;
  mixed.sources[1].unit.model_stage = "critic/train";
  CHECK(error_of(mixed) == "unit-build: a source group mixes model-stages");
  UnitBuild unknown = b;
  unknown.sources[0].unit.model_stage = "judge/train";
  CHECK(error_of(unknown) == "'judge/train' is not a model-stage of the job");
  UnitBuild two = b;
  two.unit.spec = "tp=2,pp=1,dp=2,devices=4-7";
  CHECK(error_of(two) == "unit 20: 'tp=2,pp=1,dp=2,devices=4-7' is not one unit");
}

TEST_CASE("frames: the job messages survive a round trip") {
  const PeerInfo::Buffer buf{3, 5, 17, Slot::exp_avg, 0x7f0000001000, 4096};
  const UnitDesc unit{9, "actor/train", "tp=2,pp=1,dp=1,devices=4,5"};
  const std::vector<Body> bodies = {
      JobRequest{"{\"algorithm\": \"ppo\"}", "{}", "", "", 512, 8192, true, 60, 2, -1, false, 4, 0.5, "load", true, true, true},
      JobOpen{"{}", 2, -1, 1, Bytes(128, 7), "250ms", true},
      UnitAlloc{unit, true, 3},
      UnitAllocated{9, {buf, buf}},
      UnitBuild{12, {SourceUnit{unit, 1, {buf}}}, UnitDesc{12, "critic/train", "tp=1,pp=1,dp=1,devices=2"}, 300},
      UnitFree{9},
      UnitFreed{9},
      StepRun{3, 1536.5, {{9, "actor/train", 1}, {12, "critic/train", 0}}, 2, 7},
      StepDone{{{"actor/generate", 1.25}, {"actor/train", 0.5}}, 700, 1400, 1u << 30},
      Quantize{},
      Quantized{},
      UnitAllocated{10, {PeerInfo::Buffer{0x40000000u, 5, 17, Slot::scale, 0x7f0000002000, 64}}},  // an FP8 staging scale buffer
  };
  for (const Body& b : bodies) {
    CAPTURE(kind_name(b));
    REQUIRE(decode_frame(encode_frame({kProtocolVersion, 7, 0, b})).body.index() == b.index());
  }
  const auto scale = std::get<UnitAllocated>(decode_frame(encode_frame({kProtocolVersion, 1, 0, bodies.back()})).body);
  REQUIRE(scale.buffers.size() == 1);
  CHECK(scale.buffers[0].slot == Slot::scale);
  CHECK(scale.buffers[0].side == 0x40000000u);
  const auto r = std::get<JobRequest>(decode_frame(encode_frame({kProtocolVersion, 1, 0, bodies[0]})).body);
  CHECK(r.job == "{\"algorithm\": \"ppo\"}");
  CHECK(r.response_len_after == 8192);
  CHECK(r.kill_node == 2);
  CHECK(r.steps == 4);
  CHECK(r.step_seconds == 0.5);
  CHECK(r.inject_at == "load");
  CHECK(r.node_steps);
  CHECK(r.overlap);
  CHECK(r.two_sided);
  const auto run = std::get<StepRun>(decode_frame(encode_frame({kProtocolVersion, 1, 0, bodies[7]})).body);
  CHECK(run.step == 3);
  CHECK(run.response_len == 1536.5);
  REQUIRE(run.units.size() == 2);
  CHECK(run.units[0].id == 9);
  CHECK(run.units[0].model_stage == "actor/train");
  CHECK(run.units[0].replica == 1);
  CHECK(run.stream == 2);  // an async job's training stream
  CHECK(run.weight_version == 7);
  StepRun sideways = run;
  sideways.stream = 3;  // no such stream: refused when decoded
  CHECK_THROWS_WITH_AS(decode_frame(encode_frame({kProtocolVersion, 1, 0, sideways})), doctest::Contains("stream 3"), Error);
  const auto done = std::get<StepDone>(decode_frame(encode_frame({kProtocolVersion, 1, 0, bodies[8]})).body);
  REQUIRE(done.stage_seconds.size() == 2);
  CHECK(done.stage_seconds[1].first == "actor/train");
  CHECK(done.stage_seconds[1].second == 0.5);
  CHECK(done.response_len_p95 == 1400);
  CHECK(done.peak_bytes == 1u << 30);
  const auto u = std::get<UnitBuild>(decode_frame(encode_frame({kProtocolVersion, 1, 0, bodies[4]})).body);
  CHECK(u.target == 12);
  CHECK(u.unit.id == 12);
  CHECK(u.unit.model_stage == "critic/train");
  CHECK(u.unit.spec == "tp=1,pp=1,dp=1,devices=2");
  CHECK(u.run == 300);
  REQUIRE(u.sources.size() == 1);
  CHECK(u.sources[0].unit.spec == unit.spec);
  CHECK(u.sources[0].unit.model_stage == "actor/train");
  CHECK(u.sources[0].group == 1);
  REQUIRE(u.sources[0].buffers.size() == 1);
  CHECK(u.sources[0].buffers[0].slot == Slot::exp_avg);
  CHECK(u.sources[0].buffers[0].address == 0x7f0000001000);
  CHECK(std::get<UnitAllocated>(decode_frame(encode_frame({kProtocolVersion, 1, 0, bodies[3]})).body).buffers.size() == 2);
  const auto o = std::get<JobOpen>(decode_frame(encode_frame({kProtocolVersion, 1, 0, bodies[1]})).body);
  CHECK(o.nccl_id == Bytes(128, 7));
  CHECK(o.freeze_node == 1);
  CHECK(o.inject_at == "250ms");
  CHECK(o.two_sided);
  RunDone done_run;
  done_run.sent_bytes = 12345;
  CHECK(std::get<RunDone>(decode_frame(encode_frame({kProtocolVersion, 1, 0, done_run})).body).sent_bytes == 12345);
  CHECK(std::get<UnitAlloc>(decode_frame(encode_frame({kProtocolVersion, 1, 0, bodies[2]})).body).replica == 3);
  CHECK(std::get<UnitAlloc>(decode_frame(encode_frame({kProtocolVersion, 1, 0, UnitAlloc{unit, false}})).body).replica == -1);
  // A node's regions: a device's whole arena, and a framework buffer of its own (adopted).
  using Blob = std::vector<std::byte>;
  PeerInfo me{1, Blob(16, std::byte{2}), {{4, Blob(8, std::byte{1})}, {4, Blob(8, std::byte{3}), 0x7f00deadb000, 65536}}, {}};
  const auto ready = std::get<Ready>(decode_frame(encode_frame({kProtocolVersion, 1, 0, Ready{me}})).body);
  REQUIRE(ready.info.regions.size() == 2);
  CHECK(ready.info.regions[0].size == 0);
  CHECK(ready.info.regions[1].base == 0x7f00deadb000);
  CHECK(ready.info.regions[1].size == 65536);
  CHECK(ready.info.regions[1].key == Blob(8, std::byte{3}));
  me.machine = "cuda-ipc 0b5e/node1";
  CHECK(std::get<Ready>(decode_frame(encode_frame({kProtocolVersion, 1, 0, Ready{me}})).body).info.machine == me.machine);
  // How a transition moves: every flag travels (the daemons' GPU transports).
  TransitionSpec spec;
  spec.model = "tiny-llama";
  spec.two_sided = spec.rounds = true;
  spec.cuda = spec.nccl = true;
  const auto sent = std::get<Prepare>(decode_frame(encode_frame({kProtocolVersion, 1, 0, Prepare{spec, 8}})).body).spec;
  CHECK((sent.two_sided && sent.rounds && sent.cuda && !sent.ipc && sent.nccl));
  spec.two_sided = spec.rounds = spec.nccl = false;
  spec.ipc = true;
  const auto ipc = std::get<TransitionSpec>(decode_frame(encode_frame({kProtocolVersion, 1, 0, spec})).body);
  CHECK((!ipc.two_sided && !ipc.rounds && ipc.cuda && ipc.ipc && !ipc.nccl));
  const Body long_id = JobOpen{"{}", 2, -1, -1, Bytes(129, 1), ""};
  CHECK(has(error_of([&] { decode_frame(encode_frame({kProtocolVersion, 1, 0, long_id})); }), "NCCL unique id of 129 bytes"));
}

TEST_CASE("frames: bad input is one clear error, never a crash") {
  const Bytes good = encode_frame({kProtocolVersion, 1, 0, Heartbeat{1, {{0, 1, 2, 3}}}});
  const Bytes body(good.begin() + 4, good.end());

  SUBCASE("frame caps and sizes") {
    const std::uint8_t huge[4] = {0, 0, 0, 0x40};
    CHECK(has(error_of([&] { frame_length(std::span<const std::uint8_t, 4>(huge, 4)); }), "exceeds the limit"));
    const std::uint8_t odd[4] = {13, 0, 0, 0};
    CHECK(has(error_of([&] { frame_length(std::span<const std::uint8_t, 4>(odd, 4)); }), "whole number of words"));
    const std::uint8_t zero[4] = {0, 0, 0, 0};
    CHECK(has(error_of([&] { frame_length(std::span<const std::uint8_t, 4>(zero, 4)); }), "not a Cap'n Proto message"));
    CHECK(has(error_of([&] { decode_body(body, 8); }), "exceeds the limit"));
  }
  SUBCASE("truncated") {
    for (std::size_t n = 8; n < body.size(); n += 8) {
      CAPTURE(n);
      CHECK(has(decode_error(Bytes(body.begin(), body.begin() + static_cast<std::ptrdiff_t>(n))), "malformed control message"));
    }
  }
  SUBCASE("garbage: random words") {
    std::mt19937_64 rng(5);
    for (int i = 0; i < 2000; ++i) {
      Bytes junk(8 * (1 + rng() % 16));
      for (auto& b : junk) b = static_cast<std::uint8_t>(rng());
      const std::string e = decode_error(junk);
      // Random words may happen to read as a valid envelope; anything else is an Error.
      (void)e;
    }
    // Flipped bytes of a good frame.
    for (std::size_t i = 0; i < body.size(); ++i) {
      Bytes b = body;
      b[i] ^= 0xff;
      (void)decode_error(b);
    }
  }
  SUBCASE("unknown protocol version") {
    capnp::MallocMessageBuilder m;
    auto e = m.initRoot<wire::Envelope>();
    e.setVersion(2);
    e.initBody().setStatusRequest();
    CHECK(has(decode_error(flat(m)), "protocol version 2 is not supported (this build speaks 1)"));
  }
  SUBCASE("unknown message kind (a newer peer's union member)") {
    capnp::MallocMessageBuilder m;
    auto e = m.initRoot<wire::Envelope>();
    e.setVersion(kProtocolVersion);
    e.initBody().setStatusRequest();
    Bytes f = flat(m);
    // After the segment table (8 bytes) and the root pointer (8), the data section holds
    // version (1), request id and deadline (0) and the union's discriminant: the only
    // other non-zero 16-bit value. Make it a kind this build does not know.
    const auto kind = static_cast<std::uint8_t>(wire::Envelope::Body::STATUS_REQUEST);
    int patched = 0;
    for (std::size_t i = 16; i < 32; i += 2)
      if (f[i] == kind && f[i + 1] == 0) f[i] = 200, ++patched;
    REQUIRE(patched == 1);
    CHECK(has(decode_error(f), "unknown message kind 200"));
  }
  SUBCASE("oversized fields") {
    const Bytes nonce = encode_frame({kProtocolVersion, 1, 0, Hello{Role::client, 0, 0, Bytes(65, 1)}});
    CHECK(has(decode_error(Bytes(nonce.begin() + 4, nonce.end())), "hello nonce of 65 bytes is too long"));
    const Bytes many = encode_frame({kProtocolVersion, 1, 0, Heartbeat{1, std::vector<DeviceInfo>(5000)}});
    CHECK(has(decode_error(Bytes(many.begin() + 4, many.end())), "5000 devices is too long"));
  }
  SUBCASE("a large list within the limits decodes") {
    capnp::MallocMessageBuilder m;
    auto e = m.initRoot<wire::Envelope>();
    e.setVersion(kProtocolVersion);
    auto hb = e.initBody().initHeartbeat();
    hb.initDevices(3000);
    const Bytes f = flat(m);
    CHECK(decode_error(f).empty());  // 3000 devices is fine and within limits
  }
}

TEST_CASE("HMAC-SHA256 matches RFC 4231 and the proofs bind both nonces") {
  const std::string data = "what do ya want for nothing?";
  const Bytes mac = hmac_sha256("Jefe", std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(data.data()), data.size()));
  const Bytes expect = {0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24, 0x26, 0x08, 0x95, 0x75, 0xc7,
                        0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27, 0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
  CHECK(mac == expect);
  const Bytes c = random_nonce(), s = random_nonce();
  CHECK(c != s);
  CHECK(c.size() == 32);
  const std::string token = "0123456789abcdef0123";
  CHECK(same_proof(server_proof(token, c, s), server_proof(token, c, s)));
  CHECK_FALSE(same_proof(server_proof(token, c, s), server_proof(token + "x", c, s)));
  CHECK_FALSE(same_proof(server_proof(token, c, s), server_proof(token, s, c)));
  CHECK_FALSE(same_proof(server_proof(token, c, s), client_proof(token, c, s)));  // labels differ: no replay
  CHECK_FALSE(same_proof({}, {}));
}

TEST_CASE("frame tags: per direction and connection, bound to the sequence number and every byte") {
  const std::string token = "0123456789abcdef0123";
  const Bytes c = random_nonce(), s = random_nonce();
  const SessionKeys k = session_keys(token, c, s);
  CHECK(k.client_to_server != k.server_to_client);
  CHECK(k.client_to_server == session_keys(token, c, s).client_to_server);
  CHECK(k.client_to_server != session_keys(token, c, random_nonce()).client_to_server);  // a new connection, new keys
  CHECK(k.client_to_server != session_keys(token + "x", c, s).client_to_server);
  const Bytes body(64, 7);
  const Bytes tag = frame_tag(k.client_to_server, 3, body);
  CHECK(tag.size() == kFrameTagBytes);
  CHECK(tag == frame_tag(k.client_to_server, 3, body));
  CHECK(tag != frame_tag(k.client_to_server, 4, body));  // replayed or reordered
  CHECK(tag != frame_tag(k.server_to_client, 3, body));  // reflected back to its sender
  for (std::size_t i = 0; i < body.size(); ++i) {        // any byte altered
    Bytes other = body;
    other[i] ^= 1;
    CHECK(tag != frame_tag(k.client_to_server, 3, other));
  }
}

TEST_CASE("a sender cancelled while in line leaves it: the senders behind it still send, whole frames in order") {
  // A graph that aborts cancels its calls; one waiting for its turn to write must neither
  // write over the sender that has the turn nor strand those behind it (a job hung so).
  namespace a = boost::asio;
  a::io_context io;
  tcp::acceptor acc(io, tcp::endpoint(a::ip::make_address("127.0.0.1"), 0));
  tcp::socket client(io);
  client.connect(acc.local_endpoint());
  tcp::socket reader = acc.accept();
  Channel ch(std::move(client));
  ch.set_peer("peer");
  // A's frame outgrows the socket buffers, so A holds the turn until the reader reads.
  const Envelope big{kProtocolVersion, 1, 0, JobOpen{std::string(16u << 20, 'x'), 1, -1, -1, {}, {}}};
  const Envelope b{kProtocolVersion, 2, 0, Heartbeat{2, {}}}, c{kProtocolVersion, 3, 0, Heartbeat{3, {}}};
  std::string a_error = "pending", b_error = "pending", c_error = "pending";
  auto sender = [&](const Envelope& e, std::string& out) -> a::awaitable<void> {
    try {
      co_await ch.send(e);
      out.clear();
    } catch (const std::exception& x) {
      out = x.what();
    }
  };
  a::cancellation_signal cancel_b;
  a::co_spawn(io, sender(big, a_error), a::detached);
  a::co_spawn(io, sender(b, b_error), a::bind_cancellation_slot(cancel_b.slot(), a::detached));
  a::co_spawn(io, sender(c, c_error), a::detached);
  for (int i = 0; i < 50; ++i) io.poll();
  CHECK(a_error == "pending");  // A writes; B and C wait in line
  CHECK(b_error == "pending");
  cancel_b.emit(a::cancellation_type::terminal);
  for (int i = 0; i < 50; ++i) io.poll();
  CHECK(b_error.find("cancelled") != std::string::npos);
  CHECK(c_error == "pending");  // still behind A
  // The reader takes every byte: A's frame whole, then C's, and nothing of B's.
  std::vector<std::uint64_t> ids;
  Bytes got;
  std::thread drain([&] {
    std::vector<std::uint8_t> buf(1 << 16);
    boost::system::error_code ec;
    for (;;) {
      const std::size_t n = reader.read_some(a::buffer(buf), ec);
      if (ec) break;
      got.insert(got.end(), buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n));
    }
  });
  for (int i = 0; i < 2000 && !c_error.empty(); ++i) io.run_for(std::chrono::milliseconds(5));
  CHECK(a_error.empty());
  CHECK(c_error.empty());
  ch.close();
  drain.join();
  for (std::size_t at = 0; at + 4 <= got.size();) {
    const std::uint32_t n = std::uint32_t(got[at]) | std::uint32_t(got[at + 1]) << 8 | std::uint32_t(got[at + 2]) << 16 |
                            std::uint32_t(got[at + 3]) << 24;
    REQUIRE(at + 4 + n <= got.size());
    // A's frame is told by its size; the small ones by their request id.
    ids.push_back(n > (16u << 20) ? 1 : decode_body(std::span<const std::uint8_t>(got.data() + at + 4, n)).request_id);
    at += 4 + n;
  }
  CHECK(ids == std::vector<std::uint64_t>{1, 3});
}

TEST_CASE("a protected channel takes well-tagged frames in order and drops the connection on any other") {
  namespace a = boost::asio;
  const Bytes key = random_nonce(), back = random_nonce();
  const Envelope beat{kProtocolVersion, 9, 0, Heartbeat{5, {}}};
  const Bytes plain = encode_frame(beat);
  // The frame a sender would put on the wire as the `seq`-th under `k`.
  auto sealed = [&](std::uint64_t seq, const Bytes& k) {
    Bytes f = plain;
    const Bytes tag = frame_tag(k, seq, std::span<const std::uint8_t>(plain).subspan(4));
    f.insert(f.end(), tag.begin(), tag.end());
    const std::uint32_t n = static_cast<std::uint32_t>(f.size() - 4);
    for (int i = 0; i < 4; ++i) f[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(n >> (8 * i));
    return f;
  };
  // Writes `frames` raw into a fresh connection, then reads them with a protected Channel;
  // returns how many it took and the error that ended it ("" if none).
  auto deliver = [&](const std::vector<Bytes>& frames) {
    Loopback l;  // references, not structured bindings: the lambdas below use them (clang 14)
    auto& io = l.io;
    auto& writer = l.writer;
    auto& ch = l.ch;
    ch.protect(back, key);
    for (const Bytes& f : frames) a::write(writer, a::buffer(f));
    writer.shutdown(tcp::socket::shutdown_send);
    return testing::run_on(io, [&]() -> a::awaitable<std::pair<int, std::string>> {
      int n = 0;
      for (std::size_t i = 0; i < frames.size(); ++i) {
        std::string error;
        try {
          const Envelope e = co_await ch.receive(Millis(2000), Millis(2000));
          CHECK(std::get<Heartbeat>(e.body).sequence == 5);
          ++n;
          continue;
        } catch (const std::exception& x) {
          error = x.what();
        }
        co_return std::make_pair(n, error);
      }
      co_return std::make_pair(n, std::string());
    }());
  };
  auto [ok, none] = deliver({sealed(0, key), sealed(1, key), sealed(2, key)});
  CHECK(ok == 3);
  CHECK(none.empty());
  Bytes flipped = sealed(1, key);
  flipped[10] ^= 0x20;
  for (const auto& what_frames : std::vector<std::pair<const char*, std::vector<Bytes>>>{
           {"altered", {sealed(0, key), flipped}},
           {"replayed", {sealed(0, key), sealed(0, key)}},
           {"reordered", {sealed(1, key), sealed(0, key)}},
           {"one dropped", {sealed(0, key), sealed(2, key)}},
           {"under another key", {sealed(0, back)}},
           {"untagged", {plain}}}) {
    const char* what = what_frames.first;  // not a structured binding: CAPTURE takes it in a lambda
    const auto& frames = what_frames.second;
    CAPTURE(what);
    const auto [taken, error] = deliver(frames);
    CHECK(taken == (std::string(what) == "under another key" || std::string(what) == "untagged" ||
                            std::string(what) == "reordered"
                        ? 0
                        : 1));
    CHECK((has(error, "failed its integrity check") || has(error, "no room for its integrity tag")));
  }
}

TEST_CASE("a receiver whose own loop stalled past the idle limit takes the message that arrived meanwhile") {
  // The coordinator's loop stalls (a busy machine, a debugger): the peer's heartbeat is
  // in the socket by the time the idle watchdog runs, so the silence was the receiver's
  // own, and the peer must not be declared lost. Asio's reactor performs ready reads before
  // it runs expired timers, so Channel::read_within needs no check of its own; this guards
  // that ordering (seen while looking at a heartbeat loss on a machine loaded past its cores).
  namespace a = boost::asio;
  Loopback l;  // references, not structured bindings: the lambdas below use them (clang 14)
  auto& io = l.io;
  auto& writer = l.writer;
  auto& ch = l.ch;
  const Bytes frame = encode_frame(Envelope{kProtocolVersion, 9, 0, Heartbeat{7, {}}});
  const auto sequence = testing::run_on(io, [&]() -> a::awaitable<std::uint64_t> {
    a::post(io, [&] {
      // The loop stalls past the 50 ms limit; the heartbeat lands just before it turns again,
      // so both the watchdog and the read are due on that turn, the watchdog first.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      a::write(writer, a::buffer(frame));
    });
    const Envelope e = co_await ch.receive(Millis(50), Millis(50));
    co_return std::get<Heartbeat>(e.body).sequence;
  }());
  CHECK(sequence == 7);
  // Real silence still ends the wait.
  const std::string silent = error_of([&] {
    testing::run_on(io, [&]() -> a::awaitable<int> {
      co_await ch.receive(Millis(50), Millis(50));
      co_return 0;
    }());
  });
  CHECK_MESSAGE(has(silent, "no message within 50 ms"), silent);
}

TEST_CASE("load_token: file or environment, with clear errors") {
  const std::string dir = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
  const std::string f = dir + "/nereus-test-token-" + std::to_string(::getpid());
  {
    std::FILE* out = std::fopen(f.c_str(), "w");
    std::fputs("a-very-secret-token-value\n", out);
    std::fclose(out);
  }
  ::chmod(f.c_str(), 0644);
  CHECK(has(error_of([&] { load_token(f); }), "readable by others"));
  ::chmod(f.c_str(), 0600);
  CHECK(load_token(f) == "a-very-secret-token-value");
  std::remove(f.c_str());
  CHECK(has(error_of([&] { load_token(f); }), "does not exist"));
  ::setenv("NEREUS_TOKEN", "short", 1);
  CHECK(has(error_of([&] { load_token(""); }), "shorter than 16"));
  ::setenv("NEREUS_TOKEN", "long-enough-token-from-env", 1);
  CHECK(load_token("") == "long-enough-token-from-env");
  ::unsetenv("NEREUS_TOKEN");
  CHECK(has(error_of([&] { load_token(""); }), "--token-file"));
}

TEST_CASE("resolve_launch: by hand and under mpirun, srun, torchrun") {
  using Env = std::map<std::string, std::string>;
  auto with = [](Env env) {
    return [env = std::move(env)](const char* k) -> const char* {
      auto it = env.find(k);
      return it == env.end() ? nullptr : it->second.c_str();
    };
  };
  LaunchArgs a;
  a.coordinator_mode = true;
  a.nodes = 3;
  a.listen = "127.0.0.1:7000";
  Launch l = resolve_launch(a, with({}));
  CHECK(l.coordinator);
  CHECK(l.node_rank == 0);
  CHECK(l.coordinator_at.port == 7000);

  LaunchArgs n;
  n.coordinator = "10.0.0.1:7000";
  n.node_rank = 2;
  n.nodes = 3;
  l = resolve_launch(n, with({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "3"}}));  // arguments win
  CHECK(l.node_rank == 2);
  CHECK(l.source == "arguments");
  CHECK(l.listen.str() == "127.0.0.1:0");
  CHECK_FALSE(l.coordinator);
  n.node_rank = 0;  // by hand as under a launcher: rank 0 is the coordinator, on its address
  l = resolve_launch(n, with({}));
  CHECK(l.coordinator);
  CHECK(l.listen.str() == "10.0.0.1:7000");

  LaunchArgs c;
  c.coordinator = "127.0.0.1:7100";
  l = resolve_launch(c, with({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}}));
  CHECK(l.source == "mpirun");
  CHECK(l.coordinator);
  CHECK(l.nodes == 4);
  CHECK(l.listen.port == 7100);
  l = resolve_launch(c, with({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}}));
  CHECK(l.source == "srun");
  CHECK_FALSE(l.coordinator);
  CHECK(l.node_rank == 3);
  l = resolve_launch({}, with({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}}));
  CHECK(l.source == "torchrun");
  CHECK(l.coordinator_at.str() == "127.0.0.1:29500");

  CHECK(has(error_of([&] { resolve_launch({}, with({})); }), "--coordinator-mode"));
  CHECK(has(error_of([&] { resolve_launch({}, with({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}})); }),
            "pass --coordinator"));
  CHECK(has(error_of([&] { resolve_launch(c, with({{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "2"}})); }), "not an integer"));
  CHECK(has(error_of([&] { resolve_launch(c, with({{"RANK", "5"}, {"WORLD_SIZE", "2"}})); }), "outside 0..1"));
  LaunchArgs wrong = c;
  wrong.nodes = 8;
  CHECK(has(error_of([&] { resolve_launch(wrong, with({{"RANK", "0"}, {"WORLD_SIZE", "2"}})); }), "--nodes 8 but torchrun started 2"));
  LaunchArgs bad_port = n;
  bad_port.coordinator = "host:99999";
  CHECK(has(error_of([&] { resolve_launch(bad_port, with({})); }), "not in 0..65535"));
  LaunchArgs no_port = n;
  no_port.coordinator = "host";
  CHECK(has(error_of([&] { resolve_launch(no_port, with({})); }), "HOST:PORT"));
  LaunchArgs no_listen;
  no_listen.coordinator_mode = true;
  no_listen.nodes = 2;
  CHECK(has(error_of([&] { resolve_launch(no_listen, with({})); }), "needs --listen"));
}

TEST_CASE("clock sync: the NTP rule, the shortest round trip of the window wins") {
  ClockSync sync;
  CHECK_FALSE(sync.estimate().has_value());
  // The coordinator's clock is 30 s ahead. Symmetric legs of 50 us: exact.
  const std::int64_t ahead = 30'000'000'000;
  sync.add(1'000'000, 1'050'000 + ahead, 1'100'000);
  REQUIRE(sync.estimate().has_value());
  CHECK(sync.estimate()->offset_ns == ahead);
  CHECK(sync.estimate()->rtt_ns == 100'000);
  // A queued answer (outbound 50 us, back 2 ms): the error is under rtt/2, and a tighter
  // sample already known is kept.
  sync.add(2'000'000, 2'050'000 + ahead, 4'050'000);
  CHECK(sync.estimate()->offset_ns == ahead);
  // Later, a tighter sample with asymmetric legs (10 us out, 30 us back): its error,
  // 10 us, is within its rtt/2 = 20 us, and it replaces the older one.
  sync.add(5'000'000, 5'010'000 + ahead, 5'040'000);
  CHECK(sync.estimate()->rtt_ns == 40'000);
  CHECK(std::llabs(sync.estimate()->offset_ns - ahead) <= sync.estimate()->rtt_ns / 2);
  // An answer that lands before it was sent is not a sample.
  sync.add(9'000'000, 0, 8'000'000);
  CHECK(sync.estimate()->rtt_ns == 40'000);
  // Once the tight sample leaves the window, the best of the newer ones counts.
  for (int i = 0; i < static_cast<int>(ClockSync::kWindow); ++i) {
    const std::int64_t t1 = 10'000'000 + i * 1'000'000;
    sync.add(t1, t1 + 100'000 - ahead, t1 + 200'000 + i * 1000);  // now the coordinator is behind
  }
  CHECK(sync.estimate()->offset_ns == -ahead);
  CHECK(sync.estimate()->rtt_ns == 200'000);
  // A node's clock on the coordinator's: 2.5 s after a run started 1 s after the origin.
  CHECK(seconds_since(5'000'000'000, 6'000'000'000 - ahead, ahead) == doctest::Approx(1.0));
}

TEST_CASE("membership: join, heartbeats, loss by silence or by end of stream, rejoin") {
  using namespace std::chrono;
  Membership m(3, milliseconds(1500));
  const auto t0 = steady_clock::now();
  const std::uint64_t s0 = m.join({0, 3, "a:1", {}, 10}, t0);
  const std::uint64_t s1 = m.join({1, 3, "a:2", {}, 11}, t0);
  CHECK(m.alive() == 2);
  CHECK(has(error_of([&] { m.join({1, 3, "a:9", {}, 99}, t0); }), "already joined (pid 11)"));
  CHECK(has(error_of([&] { m.join({5, 3, "a:9", {}, 99}, t0); }), "outside 0..2"));
  CHECK(has(error_of([&] { m.join({2, 4, "a:9", {}, 99}, t0); }), "expects 4 nodes, the coordinator 3"));
  CHECK(m.heartbeat(0, s0, {}, t0 + milliseconds(1000)));
  CHECK(m.sweep(t0 + milliseconds(1600)) == std::vector<int>{1});  // silent since t0
  CHECK(m.alive() == 1);
  CHECK(has(m.last_loss(1), "no heartbeat for 1500 ms"));
  CHECK_FALSE(m.heartbeat(1, s1, {}, t0 + milliseconds(1700)));  // a lost session stays lost
  const std::uint64_t s1b = m.join({1, 3, "a:2", {}, 12}, t0 + milliseconds(1800));
  CHECK(s1b != s1);
  CHECK_FALSE(m.lost(1, s1, "old connection closed"));  // the old session cannot unseat the new one
  const ClusterStatus st = m.status(t0 + milliseconds(1900));
  REQUIRE(st.members.size() == 2);
  CHECK(st.members[1].joins == 2);
  CHECK(st.members[1].pid == 12);
  CHECK(st.members[1].alive);
  CHECK(m.lost(1, s1b, "connection closed"));
  CHECK(m.alive() == 1);
  // Clock estimates: kept from the heartbeats that carry one, reset by a rejoin.
  CHECK(m.heartbeat(0, s0, {}, t0 + milliseconds(2000), 0, 0));
  const std::uint64_t s2 = m.join({2, 3, "a:3", {}, 13}, t0 + milliseconds(2000));
  CHECK(m.heartbeat(2, s2, {}, t0 + milliseconds(2001), 7'000, 90'000));
  CHECK(m.heartbeat(2, s2, {}, t0 + milliseconds(2002)));  // no estimate in this one: the last stays
  const ClusterStatus c = m.status(t0 + milliseconds(2003));
  CHECK(c.members.back().clock_offset_ns == 7'000);
  CHECK(c.members.back().clock_rtt_ns == 90'000);
  CHECK(m.lost(2, s2, "gone"));
  m.join({2, 3, "a:3", {}, 14}, t0 + milliseconds(2004));
  CHECK(m.status(t0 + milliseconds(2005)).members.back().clock_rtt_ns == -1);
}

TEST_CASE("a node's transition: a second prepare is refused and leaves the one it holds intact; a failed one keeps nothing") {
  namespace a = boost::asio;
  a::io_context io;
  tcp::acceptor acc(io, tcp::endpoint(a::ip::make_address("127.0.0.1"), 0));
  tcp::socket coordinator_end(io);
  coordinator_end.connect(acc.local_endpoint());
  Channel node_side(acc.accept()), coordinator(std::move(coordinator_end));
  Metrics metrics;
  NodeTransition part(io, 0, 64u << 20, metrics);
  TransitionSpec spec;
  spec.model = "tiny-llama";
  spec.from = "tp=2,pp=1,dp=1";
  spec.to = "tp=2,pp=1,dp=2";
  // Sends one request to the node's part and returns its answer.
  auto ask = [&](std::uint64_t id, Body body) {
    return testing::run_on(io, [](NodeTransition& p, Channel& in, Channel& out, Envelope e) -> a::awaitable<Body> {
      REQUIRE(co_await p.handle(in, e));
      co_return (co_await out.receive(Millis(5000))).body;
    }(part, node_side, coordinator, Envelope{kProtocolVersion, id, 0, std::move(body)}));
  };
  CHECK(std::holds_alternative<Ready>(ask(1, Prepare{spec, 4})));
  const Body again = ask(2, Prepare{spec, 4});
  REQUIRE(std::holds_alternative<Failed>(again));
  CHECK(has(std::get<Failed>(again).error, "already in a transition"));
  const Body held = ask(3, Verify{true});  // the first one's sources are still there
  REQUIRE(std::holds_alternative<Verified>(held));
  CHECK(std::get<Verified>(held).sources_ok);
  CHECK(std::holds_alternative<Finished>(ask(4, Finish{})));
  // A prepare that fails (a device cap too small for its units) leaves nothing behind.
  spec.capacity = "4KiB";
  CHECK(std::holds_alternative<Failed>(ask(5, Prepare{spec, 4})));
  const Body none = ask(6, Verify{true});
  REQUIRE(std::holds_alternative<Failed>(none));
  CHECK(has(std::get<Failed>(none).error, "no transition on node 0"));
}
