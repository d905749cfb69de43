#pragma once
// The control plane's messages as plain C++ (src/cluster/control.capnp is the wire
// schema). Decoding reads a frame into these once, under the frame cap and Cap'n Proto's
// read limits; nothing else in the daemon sees Cap'n Proto readers.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "nereus/runtime/peer_info.hpp"

namespace nereus::cluster {

inline constexpr std::uint16_t kProtocolVersion = 1;
/// Largest frame a reader accepts by default (length prefix excluded).
/// Largest frame a daemon accepts after authentication (peer lists of large models are
/// megabytes); before it, kHandshakeFrameCap.
inline constexpr std::uint32_t kDefaultFrameCap = 64u << 20;
inline constexpr std::uint32_t kHandshakeFrameCap = 64u << 10;

using Bytes = std::vector<std::uint8_t>;

enum class Role { node, client };

struct Hello {
  Role role = Role::client;
  std::int32_t node_rank = -1;
  std::int32_t nodes = 0;
  Bytes nonce;
};
struct Challenge {
  Bytes nonce, proof;
};
struct Authenticate {
  Bytes proof;
};
struct Welcome {
  std::int32_t nodes = 0;
};
struct ErrorReply {
  std::string message;
};
struct DeviceInfo {
  std::uint32_t id = 0;
  std::uint64_t capacity = 0, used = 0, peak = 0;
  bool operator==(const DeviceInfo&) const = default;
};
struct Join {
  std::int32_t node_rank = -1, nodes = 0;
  std::string listen;
  std::vector<DeviceInfo> devices;
  std::int32_t pid = 0;
};
struct Heartbeat {
  std::uint64_t sequence = 0;
  std::vector<DeviceInfo> devices;
  std::int64_t clock_ns = 0;   ///< the sender's clock (node_clock_ns) when it sent this
  std::int64_t offset_ns = 0;  ///< from a node: its estimate of coordinator − node clock
  std::int64_t rtt_ns = -1;    ///< that estimate's round trip; −1: no estimate yet
};
struct StatusRequest {};
struct NodeStatus {
  std::int32_t rank = -1;
  bool alive = false;
  std::string listen;
  std::int32_t pid = 0;
  std::uint64_t ms_since_heartbeat = 0, heartbeats = 0;
  std::uint32_t joins = 0;
  std::vector<DeviceInfo> devices;
  std::int64_t clock_offset_ns = 0;  ///< coordinator clock − node clock (clock_sync.hpp)
  std::int64_t clock_rtt_ns = -1;    ///< the round trip of that estimate; −1: none yet
};
struct ClusterStatus {
  std::int32_t nodes = 0;
  std::vector<NodeStatus> members;
};

/// `nereus bench transition` settings that travel to the daemons.
struct TransitionSpec {
  std::string model, from, to;
  bool train = false, sync = false;
  std::int32_t repeat = 3;
  bool verify = false;
  std::string dump_dir, capacity;
  std::uint32_t copy_threads = 2, per_link = 2;
  std::uint64_t chunk_bytes = 64 << 20;
  std::int32_t gpus_per_node = 8;
  double timeout_seconds = 300;
  std::int32_t kill_node = -1;
  bool timings = false;  ///< the report carries the last run's transfers (--perfetto, --plot)
  /// How the nodes move it, as ReshardSpec's flags of the same names: by default host
  /// memory and UCX gets between nodes.
  bool two_sided = false, rounds = false, cuda = false, ipc = false, nccl = false;
};
struct TransitionResult {
  std::string json;  ///< the bench's report
};
struct Prepare {
  TransitionSpec spec;
  std::int32_t devices_per_node = 1;
};
struct Ready {
  PeerInfo info;
};
struct Peers {
  std::vector<PeerInfo> all;
};
struct Connected {};
struct Quantize {};
struct Quantized {};
struct Run {
  std::uint32_t iteration = 0;
};
struct Timing {
  std::uint32_t src = 0, dst = 0;
  std::uint64_t bytes = 0;
  double start = 0, end = 0;
};
struct RunDone {
  double seconds = 0;
  std::uint64_t link_bytes = 0, local_bytes = 0, transfers = 0, commits = 0;
  std::vector<Timing> timings;
  std::int64_t started_ns = 0;  ///< the node's clock (node_clock_ns) when the run started
  std::uint64_t sent_bytes = 0;  ///< two-sided: bytes this node sent (its receivers count them in link_bytes)
};
struct Failed {
  std::string error;
};
struct Abort {};
struct Aborted {
  bool stuck = false;
};
struct Verify {
  bool sources_only = false;
};
struct Verified {
  bool sources_ok = false, targets_ok = false;
  std::uint64_t bytes = 0;
  std::string error;
};
struct Dump {
  std::string dir;
};
struct Dumped {
  std::vector<std::string> files;  ///< manifest entries, each a JSON object
};
struct Finish {};
struct Finished {};

/// `nereus cluster job`: what the client asks the coordinator.
struct JobRequest {
  std::string job;      ///< job file JSON
  std::string cluster;  ///< cluster file JSON (hardware for the cost model)
  std::string plan;     ///< initial plan JSON; empty: the controller's
  std::string target;   ///< target plan JSON; empty: the controller decides
  double response_len = 0, response_len_after = 0;
  bool verify = true;
  double timeout_seconds = 300;
  std::int32_t kill_node = -1;
  std::int32_t freeze_node = -1;
  bool perfetto = false;  ///< the report carries `perfetto`: the job's timeline, nodes merged
  std::uint32_t steps = 1;    ///< controller steps; 0 is read as 1
  double step_seconds = 0;    ///< the wait between steps (daemon jobs run no stage work)
  std::string inject_at;      ///< when kill_node / freeze_node strikes (parse_fault_moment)
  bool node_steps = false;    ///< each step waits for every node's framework (StepRun / StepDone)
  bool overlap = false;       ///< with node_steps: a transition admitted after step k runs beside step k + 1
  /// Builds move links between nodes as UCX tagged messages, the sending nodes taking part
  /// (cluster job --transport ucx-tag), rather than as gets the receiving nodes run alone.
  bool two_sided = false;
};
struct JobOpen {
  std::string job;
  std::int32_t devices_per_node = 1;
  std::int32_t kill_node = -1;
  std::int32_t freeze_node = -1;
  Bytes nccl_id;  ///< the coordinator's NCCL unique id for the job; empty without NCCL
  std::string inject_at;  ///< as JobRequest::inject_at
  bool two_sided = false;  ///< as JobRequest::two_sided; GPU daemons use messages across machines regardless
};
/// One unit of a job on the wire: id, model-stage and "tp=..,pp=..,dp=1,devices=...".
struct UnitDesc {
  std::uint32_t id = 0;
  std::string model_stage, spec;
};
struct UnitAlloc {
  UnitDesc unit;
  bool fill = false;
  std::int32_t replica = -1;  ///< the job loads it as this replica (adoption); -1: a graph builds it
};
struct UnitAllocated {
  std::uint32_t id = 0;
  std::vector<PeerInfo::Buffer> buffers;
};
struct SourceUnit {
  UnitDesc unit;
  std::uint32_t group = 0;
  std::vector<PeerInfo::Buffer> buffers;
};
struct UnitBuild {
  std::uint32_t target = 0;
  std::vector<SourceUnit> sources;
  UnitDesc unit;          ///< the target: a node that only sends to it (two-sided) holds none of it
  std::uint32_t run = 0;  ///< the build's number, carried by its messages' tags (ExecutorOptions::first_run)
};
struct UnitFree {
  std::uint32_t id = 0;
};
struct UnitFreed {
  std::uint32_t id = 0;
};

/// A step the nodes' frameworks run (cluster job --node-steps).
struct StepRun {
  struct Unit {
    std::uint32_t id = 0;
    std::string model_stage;
    std::uint32_t replica = 0;  ///< index among the model-stage's units (its DP rank)
  };
  std::int64_t step = 0;
  double response_len = 0;  ///< the mean response length the coordinator expects
  std::vector<Unit> units;  ///< every current unit of the job; of a stream step: the stream's
  /// 0: the whole step; in an async job 1: its generation stream, 2: its training stream.
  std::uint8_t stream = 0;
  std::int64_t weight_version = 0;  ///< the version of the weights the generation units hold
};
/// What one node's framework measured in a step; zeros where it measured nothing.
struct StepDone {
  std::vector<std::pair<std::string, double>> stage_seconds;  ///< model-stage → seconds
  double response_len_mean = 0, response_len_p95 = 0;
  std::uint64_t peak_bytes = 0;
};

using Body = std::variant<Hello, Challenge, Authenticate, Welcome, ErrorReply, Join, Heartbeat, StatusRequest, ClusterStatus,
                          TransitionSpec, TransitionResult, Prepare, Ready, Peers, Connected, Run, RunDone, Failed, Abort,
                          Aborted, Verify, Verified, Dump, Dumped, Finish, Finished, JobRequest, JobOpen, UnitAlloc,
                          UnitAllocated, UnitBuild, UnitFree, UnitFreed, StepRun, StepDone, Quantize, Quantized>;

struct Envelope {
  std::uint16_t version = kProtocolVersion;
  std::uint64_t request_id = 0;
  std::uint32_t deadline_ms = 0;
  Body body;
};

/// The message kind's name, for logs and errors ("hello", "heartbeat", ...).
const char* kind_name(const Body& b);

/// One frame: 4-byte little-endian length, then the Envelope as a flat Cap'n Proto message.
Bytes encode_frame(const Envelope& e);

/// The length a frame header announces; throws nereus::Error when it exceeds `cap`.
std::uint32_t frame_length(std::span<const std::uint8_t, 4> header, std::uint32_t cap = kDefaultFrameCap);

/// Decodes a frame's body (without the length prefix). Throws nereus::Error with one clear
/// message on anything malformed: not a Cap'n Proto message, over the read limits, an
/// unknown protocol version or message kind, an out-of-range field.
Envelope decode_body(std::span<const std::uint8_t> body, std::uint32_t cap = kDefaultFrameCap);

}  // namespace nereus::cluster
