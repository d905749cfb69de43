// Frames of the control plane: Envelope <-> flat Cap'n Proto message, read under limits.
#include "nereus/cluster/messages.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstring>

#include "control.capnp.h"
#include "nereus/base/error.hpp"

namespace nereus::cluster {

namespace {

namespace w = wire;

// Field limits: far above what a well-formed peer sends, so that a hostile one cannot make
// the daemon keep much.
constexpr std::size_t kMaxNonce = 64;
constexpr std::size_t kMaxText = 4096;
constexpr std::size_t kMaxDevices = 4096;
constexpr std::size_t kMaxRegions = 1 << 20;   // devices and adopted buffers of one process
constexpr std::size_t kMaxMembers = 16384;
constexpr std::size_t kMaxBlob = 1 << 20;      // UCX addresses and remote keys
constexpr std::size_t kMaxReport = 16 << 20;   // a transition's JSON report
constexpr std::size_t kMaxBuffers = 1 << 22;   // source buffers of one process
constexpr std::size_t kMaxPeers = 4096;
constexpr std::size_t kMaxFile = 1 << 20;      // a job, cluster or plan file's JSON
constexpr std::size_t kMaxSources = 1 << 16;   // units one build reads
constexpr std::size_t kMaxNcclId = 128;        // NCCL_UNIQUE_ID_BYTES

template <class... F>
struct Overload : F... {
  using F::operator()...;
};
template <class... F>
Overload(F...) -> Overload<F...>;  // clang 14 does not deduce aggregates by itself

capnp::Data::Reader data_of(const Bytes& b) { return {b.data(), b.size()}; }

void put_devices(capnp::List<w::Device>::Builder out, const std::vector<DeviceInfo>& in) {
  for (unsigned i = 0; i < in.size(); ++i) {
    out[i].setId(in[i].id);
    out[i].setCapacity(in[i].capacity);
    out[i].setUsed(in[i].used);
    out[i].setPeak(in[i].peak);
  }
}

Bytes bytes_of(capnp::Data::Reader d, const char* what) {
  if (d.size() > kMaxNonce) throw Error(std::string(what) + " of " + std::to_string(d.size()) + " bytes is too long");
  return Bytes(d.begin(), d.end());
}

std::vector<std::byte> blob_of(capnp::Data::Reader d, const char* what) {
  if (d.size() > kMaxBlob) throw Error(std::string(what) + " of " + std::to_string(d.size()) + " bytes is too long");
  std::vector<std::byte> out(d.size());
  if (d.size()) std::memcpy(out.data(), d.begin(), d.size());
  return out;
}

capnp::Data::Reader data_of(const std::vector<std::byte>& b) { return {reinterpret_cast<const capnp::byte*>(b.data()), b.size()}; }

template <class L>
void check_size(L list, std::size_t cap, const char* what) {
  if (list.size() > cap) throw Error("a list of " + std::to_string(list.size()) + " " + what + " is too long");
}

std::string text_of(capnp::Text::Reader t, const char* what, std::size_t cap = kMaxText) {
  if (t.size() > cap) throw Error(std::string(what) + " of " + std::to_string(t.size()) + " bytes is too long");
  return std::string(t.cStr(), t.size());
}

std::vector<DeviceInfo> devices_of(capnp::List<w::Device>::Reader l) {
  if (l.size() > kMaxDevices) throw Error("a list of " + std::to_string(l.size()) + " devices is too long");
  std::vector<DeviceInfo> out;
  out.reserve(l.size());
  for (auto d : l) out.push_back({d.getId(), d.getCapacity(), d.getUsed(), d.getPeak()});
  return out;
}

std::vector<PeerInfo::Buffer> buffers_of(capnp::List<w::SourceBuffer>::Reader buffers) {
  check_size(buffers, kMaxBuffers, "buffers");
  std::vector<PeerInfo::Buffer> out;
  out.reserve(buffers.size());
  for (auto b : buffers) {
    if (b.getSlot() > static_cast<std::uint8_t>(Slot::scale)) throw Error("buffer slot " + std::to_string(b.getSlot()) + " is unknown");
    if (b.getMemoryKind() > static_cast<std::uint8_t>(MemoryKind::cuda))
      throw Error("buffer memory kind " + std::to_string(b.getMemoryKind()) + " is unknown");
    out.push_back({b.getSide(), static_cast<DeviceId>(b.getDevice()), b.getBuffer(), static_cast<Slot>(b.getSlot()),
                   b.getAddress(), b.getBytes(), static_cast<MemoryKind>(b.getMemoryKind())});
  }
  return out;
}

void put_buffers(capnp::List<w::SourceBuffer>::Builder bufs, const std::vector<PeerInfo::Buffer>& in) {
  for (unsigned i = 0; i < in.size(); ++i) {
    const auto& b = in[i];
    bufs[i].setSide(b.side);
    bufs[i].setDevice(static_cast<std::uint32_t>(b.device));
    bufs[i].setBuffer(b.buffer);
    bufs[i].setSlot(static_cast<std::uint8_t>(b.slot));
    bufs[i].setAddress(b.address);
    bufs[i].setBytes(b.bytes);
    bufs[i].setMemoryKind(static_cast<std::uint8_t>(b.kind));
  }
}

UnitDesc unit_of(w::UnitDesc::Reader u) {
  return {u.getId(), text_of(u.getModelStage(), "model-stage"), text_of(u.getSpec(), "unit spec", kMaxFile)};
}

void put_unit(w::UnitDesc::Builder o, const UnitDesc& u) {
  o.setId(u.id);
  o.setModelStage(u.model_stage);
  o.setSpec(u.spec);
}

PeerInfo peer_of(w::PeerInfo::Reader p) {
  PeerInfo out;
  if (p.getRank() < 0) throw Error("peer rank " + std::to_string(p.getRank()) + " is negative");
  out.rank = static_cast<PeerId>(p.getRank());
  out.address = blob_of(p.getAddress(), "UCX address");
  // Each get of a list counts against the traversal limit: get it once.
  const auto regions = p.getRegions();
  check_size(regions, kMaxRegions, "regions");
  for (auto r : regions)
    out.regions.push_back({static_cast<DeviceId>(r.getDevice()), blob_of(r.getKey(), "remote key"), r.getBase(), r.getSize()});
  out.buffers = buffers_of(p.getBuffers());
  out.machine = text_of(p.getMachine(), "machine");
  return out;
}

void put_peer(w::PeerInfo::Builder o, const PeerInfo& p) {
  o.setRank(static_cast<std::int32_t>(p.rank));
  o.setAddress(data_of(p.address));
  auto regions = o.initRegions(static_cast<unsigned>(p.regions.size()));
  for (unsigned i = 0; i < p.regions.size(); ++i) {
    regions[i].setDevice(static_cast<std::uint32_t>(p.regions[i].device));
    regions[i].setKey(data_of(p.regions[i].key));
    regions[i].setBase(p.regions[i].base);
    regions[i].setSize(p.regions[i].size);
  }
  put_buffers(o.initBuffers(static_cast<unsigned>(p.buffers.size())), p.buffers);
  o.setMachine(p.machine);
}

TransitionSpec spec_of(w::TransitionSpec::Reader t) {
  TransitionSpec s;
  s.model = text_of(t.getModel(), "model");
  s.from = text_of(t.getFrom(), "from");
  s.to = text_of(t.getTo(), "to");
  s.train = t.getTrain();
  s.sync = t.getSync();
  s.repeat = t.getRepeat();
  s.verify = t.getVerify();
  s.dump_dir = text_of(t.getDumpDir(), "dump directory");
  s.capacity = text_of(t.getCapacity(), "capacity");
  s.copy_threads = t.getCopyThreads();
  s.per_link = t.getPerLink();
  s.chunk_bytes = t.getChunkBytes();
  s.gpus_per_node = t.getGpusPerNode();
  s.timeout_seconds = t.getTimeoutSeconds();
  s.kill_node = t.getKillNode();
  s.timings = t.getTimings();
  s.two_sided = t.getTwoSided();
  s.rounds = t.getRounds();
  s.cuda = t.getCuda();
  s.ipc = t.getIpc();
  s.nccl = t.getNccl();
  return s;
}

void put_spec(w::TransitionSpec::Builder o, const TransitionSpec& s) {
  o.setModel(s.model);
  o.setFrom(s.from);
  o.setTo(s.to);
  o.setTrain(s.train);
  o.setSync(s.sync);
  o.setRepeat(s.repeat);
  o.setVerify(s.verify);
  o.setDumpDir(s.dump_dir);
  o.setCapacity(s.capacity);
  o.setCopyThreads(s.copy_threads);
  o.setPerLink(s.per_link);
  o.setChunkBytes(s.chunk_bytes);
  o.setGpusPerNode(s.gpus_per_node);
  o.setTimeoutSeconds(s.timeout_seconds);
  o.setKillNode(s.kill_node);
  o.setTimings(s.timings);
  o.setTwoSided(s.two_sided);
  o.setRounds(s.rounds);
  o.setCuda(s.cuda);
  o.setIpc(s.ipc);
  o.setNccl(s.nccl);
}

Body body_of(w::Envelope::Body::Reader e) {
  switch (e.which()) {
    case w::Envelope::Body::HELLO: {
      auto h = e.getHello();
      Hello out;
      switch (h.getRole()) {
        case w::Role::NODE: out.role = Role::node; break;
        case w::Role::CLIENT: out.role = Role::client; break;
        default: throw Error("hello: unknown role " + std::to_string(static_cast<int>(h.getRole())));
      }
      out.node_rank = h.getNodeRank();
      out.nodes = h.getNodes();
      out.nonce = bytes_of(h.getNonce(), "hello nonce");
      return out;
    }
    case w::Envelope::Body::CHALLENGE: {
      auto c = e.getChallenge();
      return Challenge{bytes_of(c.getNonce(), "challenge nonce"), bytes_of(c.getProof(), "challenge proof")};
    }
    case w::Envelope::Body::AUTHENTICATE: return Authenticate{bytes_of(e.getAuthenticate().getProof(), "proof")};
    case w::Envelope::Body::WELCOME: return Welcome{e.getWelcome().getNodes()};
    case w::Envelope::Body::ERROR: return ErrorReply{text_of(e.getError().getMessage(), "error message")};
    case w::Envelope::Body::JOIN: {
      auto j = e.getJoin();
      return Join{j.getNodeRank(), j.getNodes(), text_of(j.getListen(), "listen address"), devices_of(j.getDevices()), j.getPid()};
    }
    case w::Envelope::Body::HEARTBEAT: {
      auto h = e.getHeartbeat();
      return Heartbeat{h.getSequence(), devices_of(h.getDevices()), h.getClockNs(), h.getOffsetNs(), h.getRttNs()};
    }
    case w::Envelope::Body::STATUS_REQUEST: return StatusRequest{};
    case w::Envelope::Body::STATUS: {
      auto s = e.getStatus();
      ClusterStatus out{s.getNodes(), {}};
      const auto members = s.getMembers();
      check_size(members, kMaxMembers, "members");
      for (auto m : members)
        out.members.push_back({m.getRank(), m.getAlive(), text_of(m.getListen(), "listen address"), m.getPid(),
                               m.getMsSinceHeartbeat(), m.getHeartbeats(), m.getJoins(), devices_of(m.getDevices()),
                               m.getClockOffsetNs(), m.getClockRttNs()});
      return out;
    }
    case w::Envelope::Body::TRANSITION_REQUEST: return spec_of(e.getTransitionRequest());
    case w::Envelope::Body::TRANSITION_RESULT: return TransitionResult{text_of(e.getTransitionResult(), "report", kMaxReport)};
    case w::Envelope::Body::PREPARE: {
      auto p = e.getPrepare();
      return Prepare{spec_of(p.getSpec()), p.getDevicesPerNode()};
    }
    case w::Envelope::Body::READY: return Ready{peer_of(e.getReady())};
    case w::Envelope::Body::PEERS: {
      const auto peers = e.getPeers();
      check_size(peers, kMaxPeers, "peers");
      Peers out;
      for (auto p : peers) out.all.push_back(peer_of(p));
      return out;
    }
    case w::Envelope::Body::CONNECTED: return Connected{};
    case w::Envelope::Body::QUANTIZE: return Quantize{};
    case w::Envelope::Body::QUANTIZED: return Quantized{};
    case w::Envelope::Body::RUN: return Run{e.getRun()};
    case w::Envelope::Body::DONE: {
      auto d = e.getDone();
      RunDone out{d.getSeconds(), d.getLinkBytes(), d.getLocalBytes(), d.getTransfers(), d.getCommits(), {}, d.getStartedNs(), d.getSentBytes()};
      const auto timings = d.getTimings();
      check_size(timings, kMaxBuffers, "timings");
      out.timings.reserve(timings.size());
      for (auto t : timings) out.timings.push_back({t.getSrc(), t.getDst(), t.getBytes(), t.getStart(), t.getEnd()});
      return out;
    }
    case w::Envelope::Body::FAILED: return Failed{text_of(e.getFailed(), "failure")};
    case w::Envelope::Body::ABORT: return Abort{};
    case w::Envelope::Body::ABORTED: return Aborted{e.getAborted()};
    case w::Envelope::Body::VERIFY: return Verify{e.getVerify()};
    case w::Envelope::Body::VERIFIED: {
      auto v = e.getVerified();
      return Verified{v.getSourcesOk(), v.getTargetsOk(), v.getBytes(), text_of(v.getError(), "verification error")};
    }
    case w::Envelope::Body::DUMP: return Dump{text_of(e.getDump(), "dump directory")};
    case w::Envelope::Body::DUMPED: {
      const auto files = e.getDumped();
      check_size(files, kMaxBuffers, "dumped files");
      Dumped out;
      for (auto f : files) out.files.push_back(text_of(f, "manifest entry"));
      return out;
    }
    case w::Envelope::Body::FINISH: return Finish{};
    case w::Envelope::Body::FINISHED: return Finished{};
    case w::Envelope::Body::JOB_REQUEST: {
      auto j = e.getJobRequest();
      return JobRequest{text_of(j.getJob(), "job", kMaxFile),   text_of(j.getCluster(), "cluster", kMaxFile),
                        text_of(j.getPlan(), "plan", kMaxFile), text_of(j.getTarget(), "target plan", kMaxFile),
                        j.getResponseLen(),                     j.getResponseLenAfter(),
                        j.getVerify(),                          j.getTimeoutSeconds(),
                        j.getKillNode(),                        j.getFreezeNode(),
                        j.getPerfetto(),
                        j.getSteps(),
                        j.getStepSeconds(),
                        text_of(j.getInjectAt(), "fault moment"),
                        j.getNodeSteps(), j.getOverlap(), j.getTwoSided()};
    }
    case w::Envelope::Body::JOB_OPEN: {
      auto j = e.getJobOpen();
      if (j.getNcclId().size() > kMaxNcclId) throw Error("an NCCL unique id of " + std::to_string(j.getNcclId().size()) + " bytes is too long");
      return JobOpen{text_of(j.getJob(), "job", kMaxFile), j.getDevicesPerNode(), j.getKillNode(), j.getFreezeNode(),
                     Bytes(j.getNcclId().begin(), j.getNcclId().end()), text_of(j.getInjectAt(), "fault moment"), j.getTwoSided()};
    }
    case w::Envelope::Body::UNIT_ALLOC: {
      auto a = e.getUnitAlloc();
      return UnitAlloc{unit_of(a.getUnit()), a.getFill(), a.getReplica()};
    }
    case w::Envelope::Body::UNIT_ALLOCATED: {
      auto a = e.getUnitAllocated();
      return UnitAllocated{a.getId(), buffers_of(a.getBuffers())};
    }
    case w::Envelope::Body::UNIT_BUILD: {
      auto b = e.getUnitBuild();
      UnitBuild out{b.getTarget(), {}, unit_of(b.getUnit()), b.getRun()};
      const auto sources = b.getSources();
      check_size(sources, kMaxSources, "source units");
      for (auto u : sources) out.sources.push_back({unit_of(u.getUnit()), u.getGroup(), buffers_of(u.getBuffers())});
      return out;
    }
    case w::Envelope::Body::UNIT_FREE: return UnitFree{e.getUnitFree()};
    case w::Envelope::Body::UNIT_FREED: return UnitFreed{e.getUnitFreed()};
    case w::Envelope::Body::STEP_RUN: {
      auto r = e.getStepRun();
      StepRun out{r.getStep(), r.getResponseLen(), {}, r.getStream(), r.getWeightVersion()};
      if (out.stream > 2) throw Error("a step of stream " + std::to_string(out.stream) + " (0, 1 or 2)");
      const auto units = r.getUnits();
      check_size(units, kMaxSources, "step units");
      for (auto u : units) out.units.push_back({u.getId(), text_of(u.getModelStage(), "model-stage"), u.getReplica()});
      return out;
    }
    case w::Envelope::Body::STEP_DONE: {
      auto d = e.getStepDone();
      StepDone out{{}, d.getResponseLenMean(), d.getResponseLenP95(), d.getPeakBytes()};
      const auto stages = d.getStageSeconds();
      check_size(stages, kMaxBuffers, "stage times");
      for (auto t : stages) out.stage_seconds.emplace_back(text_of(t.getModelStage(), "model-stage"), t.getSeconds());
      return out;
    }
  }
  throw Error("unknown message kind " + std::to_string(static_cast<int>(e.which())) + " (this build speaks protocol " +
              std::to_string(kProtocolVersion) + ")");
}

}  // namespace

const char* kind_name(const Body& b) {
  static constexpr const char* names[] = {
      "hello",  "challenge", "authenticate", "welcome", "error",   "join",    "heartbeat", "status-request", "status",
      "transition-request", "transition-result", "prepare", "ready", "peers", "connected", "run", "done", "failed",
      "abort",  "aborted",   "verify",       "verified", "dump",   "dumped", "finish",    "finished", "job-request",
      "job-open", "unit-alloc", "unit-allocated", "unit-build", "unit-free", "unit-freed",
      "step-run", "step-done", "quantize", "quantized"};
  static_assert(std::size(names) == std::variant_size_v<Body>);
  return names[b.index()];
}

Bytes encode_frame(const Envelope& e) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<w::Envelope>();
  root.setVersion(e.version);
  root.setRequestId(e.request_id);
  root.setDeadlineMs(e.deadline_ms);
  auto body = root.initBody();
  std::visit(Overload{
                 [&](const Hello& h) {
                   auto o = body.initHello();
                   o.setRole(h.role == Role::node ? w::Role::NODE : w::Role::CLIENT);
                   o.setNodeRank(h.node_rank);
                   o.setNodes(h.nodes);
                   o.setNonce(data_of(h.nonce));
                 },
                 [&](const Challenge& c) {
                   auto o = body.initChallenge();
                   o.setNonce(data_of(c.nonce));
                   o.setProof(data_of(c.proof));
                 },
                 [&](const Authenticate& a) { body.initAuthenticate().setProof(data_of(a.proof)); },
                 [&](const Welcome& v) { body.initWelcome().setNodes(v.nodes); },
                 [&](const ErrorReply& r) { body.initError().setMessage(r.message); },
                 [&](const Join& j) {
                   auto o = body.initJoin();
                   o.setNodeRank(j.node_rank);
                   o.setNodes(j.nodes);
                   o.setListen(j.listen);
                   o.setPid(j.pid);
                   put_devices(o.initDevices(static_cast<unsigned>(j.devices.size())), j.devices);
                 },
                 [&](const Heartbeat& h) {
                   auto o = body.initHeartbeat();
                   o.setSequence(h.sequence);
                   put_devices(o.initDevices(static_cast<unsigned>(h.devices.size())), h.devices);
                   o.setClockNs(h.clock_ns);
                   o.setOffsetNs(h.offset_ns);
                   o.setRttNs(h.rtt_ns);
                 },
                 [&](const StatusRequest&) { body.setStatusRequest(); },
                 [&](const ClusterStatus& s) {
                   auto o = body.initStatus();
                   o.setNodes(s.nodes);
                   auto l = o.initMembers(static_cast<unsigned>(s.members.size()));
                   for (unsigned i = 0; i < s.members.size(); ++i) {
                     const NodeStatus& m = s.members[i];
                     l[i].setRank(m.rank);
                     l[i].setAlive(m.alive);
                     l[i].setListen(m.listen);
                     l[i].setPid(m.pid);
                     l[i].setMsSinceHeartbeat(m.ms_since_heartbeat);
                     l[i].setHeartbeats(m.heartbeats);
                     l[i].setJoins(m.joins);
                     l[i].setClockOffsetNs(m.clock_offset_ns);
                     l[i].setClockRttNs(m.clock_rtt_ns);
                     put_devices(l[i].initDevices(static_cast<unsigned>(m.devices.size())), m.devices);
                   }
                 },
                 [&](const TransitionSpec& t) { put_spec(body.initTransitionRequest(), t); },
                 [&](const TransitionResult& r) { body.setTransitionResult(r.json); },
                 [&](const Prepare& p) {
                   auto o = body.initPrepare();
                   put_spec(o.initSpec(), p.spec);
                   o.setDevicesPerNode(p.devices_per_node);
                 },
                 [&](const Ready& r) { put_peer(body.initReady(), r.info); },
                 [&](const Peers& p) {
                   auto l = body.initPeers(static_cast<unsigned>(p.all.size()));
                   for (unsigned i = 0; i < p.all.size(); ++i) put_peer(l[i], p.all[i]);
                 },
                 [&](const Connected&) { body.setConnected(); },
                 [&](const Quantize&) { body.setQuantize(); },
                 [&](const Quantized&) { body.setQuantized(); },
                 [&](const Run& r) { body.setRun(r.iteration); },
                 [&](const RunDone& d) {
                   auto o = body.initDone();
                   o.setSeconds(d.seconds);
                   o.setLinkBytes(d.link_bytes);
                   o.setLocalBytes(d.local_bytes);
                   o.setTransfers(d.transfers);
                   o.setCommits(d.commits);
                   o.setStartedNs(d.started_ns);
                   o.setSentBytes(d.sent_bytes);
                   auto l = o.initTimings(static_cast<unsigned>(d.timings.size()));
                   for (unsigned i = 0; i < d.timings.size(); ++i) {
                     const Timing& t = d.timings[i];
                     l[i].setSrc(t.src);
                     l[i].setDst(t.dst);
                     l[i].setBytes(t.bytes);
                     l[i].setStart(t.start);
                     l[i].setEnd(t.end);
                   }
                 },
                 [&](const Failed& f) { body.setFailed(f.error); },
                 [&](const Abort&) { body.setAbort(); },
                 [&](const Aborted& a) { body.setAborted(a.stuck); },
                 [&](const Verify& v) { body.setVerify(v.sources_only); },
                 [&](const Verified& v) {
                   auto o = body.initVerified();
                   o.setSourcesOk(v.sources_ok);
                   o.setTargetsOk(v.targets_ok);
                   o.setBytes(v.bytes);
                   o.setError(v.error);
                 },
                 [&](const Dump& d) { body.setDump(d.dir); },
                 [&](const Dumped& d) {
                   auto l = body.initDumped(static_cast<unsigned>(d.files.size()));
                   for (unsigned i = 0; i < d.files.size(); ++i) l.set(i, d.files[i]);
                 },
                 [&](const Finish&) { body.setFinish(); },
                 [&](const Finished&) { body.setFinished(); },
                 [&](const JobRequest& j) {
                   auto o = body.initJobRequest();
                   o.setJob(j.job);
                   o.setCluster(j.cluster);
                   o.setPlan(j.plan);
                   o.setTarget(j.target);
                   o.setResponseLen(j.response_len);
                   o.setResponseLenAfter(j.response_len_after);
                   o.setVerify(j.verify);
                   o.setTimeoutSeconds(j.timeout_seconds);
                   o.setKillNode(j.kill_node);
                   o.setFreezeNode(j.freeze_node);
                   o.setPerfetto(j.perfetto);
                   o.setSteps(j.steps);
                   o.setStepSeconds(j.step_seconds);
                   o.setInjectAt(j.inject_at);
                   o.setNodeSteps(j.node_steps);
                   o.setOverlap(j.overlap);
                   o.setTwoSided(j.two_sided);
                 },
                 [&](const JobOpen& j) {
                   auto o = body.initJobOpen();
                   o.setJob(j.job);
                   o.setDevicesPerNode(j.devices_per_node);
                   o.setKillNode(j.kill_node);
                   o.setFreezeNode(j.freeze_node);
                   o.setNcclId(data_of(j.nccl_id));
                   o.setInjectAt(j.inject_at);
                   o.setTwoSided(j.two_sided);
                 },
                 [&](const UnitAlloc& a) {
                   auto o = body.initUnitAlloc();
                   put_unit(o.initUnit(), a.unit);
                   o.setFill(a.fill);
                   o.setReplica(a.replica);
                 },
                 [&](const UnitAllocated& a) {
                   auto o = body.initUnitAllocated();
                   o.setId(a.id);
                   put_buffers(o.initBuffers(static_cast<unsigned>(a.buffers.size())), a.buffers);
                 },
                 [&](const UnitBuild& b) {
                   auto o = body.initUnitBuild();
                   o.setTarget(b.target);
                   put_unit(o.initUnit(), b.unit);
                   o.setRun(b.run);
                   auto l = o.initSources(static_cast<unsigned>(b.sources.size()));
                   for (unsigned i = 0; i < b.sources.size(); ++i) {
                     put_unit(l[i].initUnit(), b.sources[i].unit);
                     l[i].setGroup(b.sources[i].group);
                     put_buffers(l[i].initBuffers(static_cast<unsigned>(b.sources[i].buffers.size())), b.sources[i].buffers);
                   }
                 },
                 [&](const UnitFree& f) { body.setUnitFree(f.id); },
                 [&](const UnitFreed& f) { body.setUnitFreed(f.id); },
                 [&](const StepRun& r) {
                   auto o = body.initStepRun();
                   o.setStep(r.step);
                   o.setResponseLen(r.response_len);
                   o.setStream(r.stream);
                   o.setWeightVersion(r.weight_version);
                   auto l = o.initUnits(static_cast<unsigned>(r.units.size()));
                   for (unsigned i = 0; i < r.units.size(); ++i) {
                     l[i].setId(r.units[i].id);
                     l[i].setModelStage(r.units[i].model_stage);
                     l[i].setReplica(r.units[i].replica);
                   }
                 },
                 [&](const StepDone& d) {
                   auto o = body.initStepDone();
                   auto l = o.initStageSeconds(static_cast<unsigned>(d.stage_seconds.size()));
                   for (unsigned i = 0; i < d.stage_seconds.size(); ++i) {
                     l[i].setModelStage(d.stage_seconds[i].first);
                     l[i].setSeconds(d.stage_seconds[i].second);
                   }
                   o.setResponseLenMean(d.response_len_mean);
                   o.setResponseLenP95(d.response_len_p95);
                   o.setPeakBytes(d.peak_bytes);
                 },
             },
             e.body);
  const kj::Array<capnp::word> flat = capnp::messageToFlatArray(message);
  const auto bytes = flat.asBytes();
  const auto n = static_cast<std::uint32_t>(bytes.size());
  Bytes out(4 + bytes.size());
  for (int i = 0; i < 4; ++i) out[i] = static_cast<std::uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 4, bytes.begin(), bytes.size());
  return out;
}

std::uint32_t frame_length(std::span<const std::uint8_t, 4> h, std::uint32_t cap) {
  const std::uint32_t n = h[0] | (h[1] << 8) | (h[2] << 16) | (static_cast<std::uint32_t>(h[3]) << 24);
  if (n > cap) throw Error("frame of " + std::to_string(n) + " bytes exceeds the limit of " + std::to_string(cap));
  if (n == 0 || n % sizeof(capnp::word) != 0)
    throw Error("frame of " + std::to_string(n) + " bytes is not a Cap'n Proto message (not a whole number of words)");
  return n;
}

Envelope decode_body(std::span<const std::uint8_t> body, std::uint32_t cap) {
  if (body.size() > cap) throw Error("frame of " + std::to_string(body.size()) + " bytes exceeds the limit of " + std::to_string(cap));
  if (body.empty() || body.size() % sizeof(capnp::word) != 0)
    throw Error("frame of " + std::to_string(body.size()) + " bytes is not a Cap'n Proto message (not a whole number of words)");
  // Copy into word-aligned storage: the reader requires it, and the network buffer is not.
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(body.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), body.data(), body.size());
  capnp::ReaderOptions limits;
  // A message cannot make us read much more than it is (each part is read once, but
  // empty structs in a list count a word each).
  limits.traversalLimitInWords = 4 * words.size() + 1024;
  limits.nestingLimit = 8;                                // the schema nests 4 deep
  try {
    capnp::FlatArrayMessageReader reader(words.asPtr(), limits);
    const auto e = reader.getRoot<w::Envelope>();
    Envelope out;
    out.version = e.getVersion();
    if (out.version != kProtocolVersion)
      throw Error("protocol version " + std::to_string(out.version) + " is not supported (this build speaks " +
                  std::to_string(kProtocolVersion) + ")");
    out.request_id = e.getRequestId();
    out.deadline_ms = e.getDeadlineMs();
    out.body = body_of(e.getBody());
    return out;
  } catch (const kj::Exception& ex) {
    throw Error(std::string("malformed control message: ") + ex.getDescription().cStr());
  }
}

}  // namespace nereus::cluster
