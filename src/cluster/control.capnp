@0xc3de1456865f9b60;
# The control plane between nereusd daemons, the coordinator and clients (architecture.md,
# layer `cluster`). Every frame on the wire is a 4-byte little-endian length followed by
# one Envelope as a flat Cap'n Proto message (segment table included). Messages are
# read into plain C++ structs (include/nereus/cluster/messages.hpp) under a frame cap and
# Cap'n Proto's traversal and nesting limits, and nothing else touches the reader.
#
# Versioning: `version` is the protocol version (1). A receiver rejects any other version
# with an error naming both. New message kinds are added as new union members with new
# ordinals; a receiver that does not know one answers with an error, never guesses.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("nereus::cluster::wire");

struct Envelope {
  version @0 :UInt16;
  requestId @1 :UInt64;     # echoed in the reply
  deadlineMs @2 :UInt32;    # how long the sender waits for the reply; 0: no deadline
  body :union {
    hello @3 :Hello;
    challenge @4 :Challenge;
    authenticate @5 :Authenticate;
    welcome @6 :Welcome;
    error @7 :ErrorReply;
    join @8 :Join;
    heartbeat @9 :Heartbeat;
    statusRequest @10 :Void;
    status @11 :ClusterStatus;
    # A transition across the daemons (nereus bench transition --daemons): the client asks
    # the coordinator, which drives every node through prepare -> ready -> peers ->
    # connected -> run -> done (x repeat) -> verify -> dump -> finish, and answers with the
    # bench's JSON report.
    transitionRequest @12 :TransitionSpec;
    transitionResult @13 :Text;
    prepare @14 :Prepare;
    ready @15 :PeerInfo;
    peers @16 :List(PeerInfo);
    connected @17 :Void;
    run @18 :UInt32;          # iteration
    done @19 :RunDone;
    failed @20 :Text;
    abort @21 :Void;
    aborted @22 :Bool;        # true: a transfer would not stop
    verify @23 :Bool;         # sources only
    verified @24 :Verified;
    dump @25 :Text;           # directory
    dumped @26 :List(Text);   # manifest entries, each a JSON object
    finish @27 :Void;
    finished @28 :Void;
    # A job's units across the daemons (nereus cluster job): the client asks the
    # coordinator, which runs the controller, compiles the job's global transition graph
    # and drives the nodes: jobOpen -> ready -> peers -> connected, then for each node of
    # the graph unitAlloc + unitBuild (a build) or unitFree (a destroy), then verify and
    # finish. Answered by transitionResult (the JSON report).
    jobRequest @29 :JobRequest;
    jobOpen @30 :JobOpen;
    unitAlloc @31 :UnitAlloc;
    unitAllocated @32 :UnitAllocated;
    unitBuild @33 :UnitBuild;   # answered by done, once this node's bytes of the unit landed
    unitFree @34 :UInt32;       # unit id
    unitFreed @35 :UInt32;
    # A step of a job whose stages the nodes' frameworks run (`cluster job --node-steps`):
    # the coordinator sends stepRun to every node of the job; each answers stepDone once
    # its framework has run the step on the units it holds (a daemon without a framework
    # answers at once). The controller calibrates from the reports, then decides.
    stepRun @36 :StepRun;
    stepDone @37 :StepDone;
    # Before each run of a bf16 -> FP8 transition: every node quantizes what its devices
    # send into their staging (the peers' gets read it), then answers; run follows.
    quantize @38 :Void;
    quantized @39 :Void;
  }
}

struct JobRequest {
  job @0 :Text;               # the job file's JSON (its models: presets, or paths every node can read)
  cluster @1 :Text;           # the cluster file's JSON: the hardware the cost model assumes
  plan @2 :Text;              # the initial global plan (JSON); empty: the controller's
  target @3 :Text;            # the target plan; empty: the controller decides
  responseLen @4 :Float64;    # mean response length (tokens) of the first plan's steps
  responseLenAfter @5 :Float64;  # ... when the controller decides; 0: unchanged
  verify @6 :Bool;
  timeoutSeconds @7 :Float64;
  killNode @8 :Int32;         # fault injection: this node dies 3 ms into its first build; -1: none
  freezeNode @9 :Int32;       # fault injection: this node stops (SIGSTOP) 3 ms into its first build; -1: none
  perfetto @10 :Bool;         # the report carries the job's timeline, every node's on the coordinator's clock
  steps @11 :UInt32;          # controller steps (decide, maybe transition); 0 is read as 1
  stepSeconds @12 :Float64;   # the wait between steps, standing in for the stages' work
  injectAt @13 :Text;         # when the injected fault strikes: "build" (or empty), "load", "MSms" after the job opens
  nodeSteps @14 :Bool;        # each step waits for every node's framework to run it (stepRun / stepDone)
  overlap @15 :Bool;          # with nodeSteps: a transition admitted after step k runs beside step k + 1
  twoSided @16 :Bool;         # builds move links between nodes as UCX tagged messages, senders taking part
}

struct StepRun {
  step @0 :Int64;
  responseLen @1 :Float64;    # the mean response length the coordinator expects (tokens)
  units @2 :List(StepUnit);   # every current unit of the job: a node's framework runs its own
  stream @3 :UInt8;           # 0: the whole step (sync); 1: generation, 2: training (async jobs)
  weightVersion @4 :Int64;    # the weight version the step's generation units hold
}

struct StepUnit {
  id @0 :UInt32;
  modelStage @1 :Text;
  replica @2 :UInt32;         # its index among the model-stage's units (its DP rank)
}

struct StageSeconds {
  modelStage @0 :Text;
  seconds @1 :Float64;
}

struct StepDone {
  stageSeconds @0 :List(StageSeconds);   # what this node's framework measured
  responseLenMean @1 :Float64;           # 0: not measured
  responseLenP95 @2 :Float64;
  peakBytes @3 :UInt64;                  # busiest device's peak; 0: not measured
}

struct JobOpen {
  job @0 :Text;
  devicesPerNode @1 :Int32;
  killNode @2 :Int32;
  freezeNode @3 :Int32;
  ncclId @4 :Data;            # an NCCL unique id for the job's nodes (128 bytes); empty: none (no NCCL transport yet)
  injectAt @5 :Text;          # as JobRequest.injectAt
  twoSided @6 :Bool;          # as JobRequest.twoSided (GPU daemons use messages across machines regardless)
}

# One unit (EMU) of the job: `spec` is its layout and GPU list, "tp=2,pp=1,dp=1,devices=4,5".
struct UnitDesc {
  id @0 :UInt32;              # job-wide, given by the coordinator
  modelStage @1 :Text;
  spec @2 :Text;
}

struct UnitAlloc {
  unit @0 :UnitDesc;
  fill @1 :Bool;              # write the verification fill (the job's first units)
  replica @2 :Int32 = -1;     # the job loads it: its index among the model-stage's units,
                              # which a framework's adopted memory names; -1: a graph builds it
}

struct UnitAllocated {
  id @0 :UInt32;
  buffers @1 :List(SourceBuffer);   # where its buffers on this node live
}

# A unit a build reads: its buffers on every node (a node pulls what is remote).
struct SourceUnit {
  unit @0 :UnitDesc;
  group @1 :UInt32;           # source collection of the build (one per model-stage read)
  buffers @2 :List(SourceBuffer);
}

struct UnitBuild {
  target @0 :UInt32;          # an allocated unit
  sources @1 :List(SourceUnit);
  unit @2 :UnitDesc;          # the target unit: a node that only sends to it holds none of it
  run @3 :UInt32;             # the build's number: its messages' tags carry it (mod 2^16)
}

struct TransitionSpec {
  model @0 :Text;
  from @1 :Text;
  to @2 :Text;
  train @3 :Bool;
  sync @4 :Bool;
  repeat @5 :Int32;
  verify @6 :Bool;
  dumpDir @7 :Text;
  capacity @8 :Text;
  copyThreads @9 :UInt32;
  perLink @10 :UInt32;
  chunkBytes @11 :UInt64;
  gpusPerNode @12 :Int32;
  timeoutSeconds @13 :Float64;
  killNode @14 :Int32;      # fault injection: this node's daemon dies 3 ms into the first run; -1: none
  timings @15 :Bool;        # the report carries the last run's transfers on the coordinator's clock
  # How the nodes move it (ReshardSpec): host memory by UCX gets unless these say otherwise.
  twoSided @16 :Bool;       # links between nodes as UCX tagged messages
  rounds @17 :Bool;         # two-sided links in rounds
  cuda @18 :Bool;           # units in GPU memory
  ipc @19 :Bool;            # CUDA IPC between nodes on one machine
  nccl @20 :Bool;           # NCCL between nodes (with ipc: between machines)
}

struct Prepare {
  spec @0 :TransitionSpec;
  devicesPerNode @1 :Int32;
}

struct Region {
  device @0 :UInt32;
  key @1 :Data;
  base @2 :UInt64;            # size 0: the device's whole region; else [base, base + size),
  size @3 :UInt64;            # memory registered on its own (a framework's adopted buffer)
}

struct SourceBuffer {
  side @0 :UInt32;
  device @1 :UInt32;
  buffer @2 :UInt32;
  slot @3 :UInt8;
  address @4 :UInt64;
  bytes @5 :UInt64;
  memoryKind @6 :UInt8;       # 0 host, 1 cuda
}

struct PeerInfo {
  rank @0 :Int32;
  address @1 :Data;
  regions @2 :List(Region);
  buffers @3 :List(SourceBuffer);
  machine @4 :Text;         # the machine as CUDA IPC sees it; empty with host memory
}

struct RunDone {
  seconds @0 :Float64;
  linkBytes @1 :UInt64;
  localBytes @2 :UInt64;
  transfers @3 :UInt64;
  commits @4 :UInt64;
  timings @5 :List(Timing);   # every transfer the node received in this run
  startedNs @6 :Int64;        # the node's clock (clock_sync.hpp) when the run started
  sentBytes @7 :UInt64;       # two-sided: the bytes this node sent (its receivers count them in linkBytes)
}

struct Timing {
  src @0 :UInt32;             # device
  dst @1 :UInt32;
  bytes @2 :UInt64;
  start @3 :Float64;          # seconds from the node's run start
  end @4 :Float64;
}

struct Verified {
  sourcesOk @0 :Bool;
  targetsOk @1 :Bool;
  bytes @2 :UInt64;
  error @3 :Text;
}

enum Role {
  node @0;     # a nereusd joining the coordinator
  client @1;   # a tool (nereus cluster status, nereus bench transition --daemons)
}

# Challenge-response HMAC-SHA256 over nonces from both sides (mutual; the token never
# travels): client Hello(nonce c) -> server Challenge(nonce s, HMAC(token, "nereus-server" | c | s))
# -> client checks it and answers Authenticate(HMAC(token, "nereus-client" | s | c)).
struct Hello {
  role @0 :Role;
  nodeRank @1 :Int32;       # node role only
  nodes @2 :Int32;          # node role only: the job's node count as this node sees it
  nonce @3 :Data;           # 32 random bytes
}

struct Challenge {
  nonce @0 :Data;
  proof @1 :Data;
}

struct Authenticate {
  proof @0 :Data;
}

struct Welcome {
  nodes @0 :Int32;
}

struct ErrorReply {
  message @0 :Text;
}

struct Device {
  id @0 :UInt32;            # global: node rank x devices per node + local index
  capacity @1 :UInt64;      # bytes
  used @2 :UInt64;
  peak @3 :UInt64;
}

struct Join {
  nodeRank @0 :Int32;
  nodes @1 :Int32;
  listen @2 :Text;          # HOST:PORT the daemon serves on
  devices @3 :List(Device);
  pid @4 :Int32;
}

struct Heartbeat {
  sequence @0 :UInt64;
  devices @1 :List(Device);
  # Clock sync (clock_sync.hpp). From a node: its clock at send and its latest estimate of
  # the coordinator's clock minus its own (rtt −1: none yet). In the answer: the
  # coordinator's clock when it answered.
  clockNs @2 :Int64;
  offsetNs @3 :Int64;
  rttNs @4 :Int64;
}

struct NodeStatus {
  rank @0 :Int32;
  alive @1 :Bool;
  listen @2 :Text;
  pid @3 :Int32;
  msSinceHeartbeat @4 :UInt64;
  heartbeats @5 :UInt64;
  joins @6 :UInt32;         # 1 + rejoins
  devices @7 :List(Device);
  clockOffsetNs @8 :Int64;  # the coordinator's clock minus the node's, from its heartbeats
  clockRttNs @9 :Int64;     # the round trip that estimate came from; −1: none yet
}

struct ClusterStatus {
  nodes @0 :Int32;          # expected
  members @1 :List(NodeStatus);
}
