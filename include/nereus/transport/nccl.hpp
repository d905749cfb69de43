#pragma once
// The `nccl` backend: two-sided messages between CUDA devices of any processes, as NCCL
// point-to-point sends and receives. NCCL matches a pair of ranks' sends and receives in
// the order they were issued, across every link between them, and only a group
// (ncclGroupStart/End) lets one rank send and receive at once without deadlock; so the
// transport is `grouped`: the executor posts a transition's messages in rounds, each one
// group that both ends derive from the plan in the same order (BoundTransition::rounds).
// A message's strided runs are packed into, or unpacked from, staging on its GPU by the
// strided-copy kernel in the same stream as the NCCL operation (`strided_messages`): no
// host copy, no extra wait.
//
// Ranks: one per (process, GPU) pair among the transition group's devices, sorted; every
// process computes the same table. The process holding rank 0 makes the NCCL unique id
// (ncclGetUniqueId, when its address() is first asked) and hands it to the others as its
// address; creating the communicators starts (non-blocking) in connect() once the id is
// known, since every rank must join, even a process with no NCCL message of its own; the
// first post polls until they formed; they are kept for the transport's life; a failure, a lost peer or a cancelled post aborts them
// (ncclCommAbort), and the transport then refuses further posts.
//
// NCCL is loaded at run time (dlopen of `library`, or NEREUS_NCCL_LIBRARY), not linked: a
// build carries only nccl.h, and a machine supplies its own libnccl (PyTorch's, say).
// Built when meson finds cudart and nccl.h; otherwise make_nccl_transport() throws.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nereus/transport/transport.hpp"

namespace nereus {

struct NcclTransportOptions {
  PeerId self = 0;
  std::vector<DeviceId> devices;             ///< every device of the transition group
  std::function<PeerId(DeviceId)> owner_of;  ///< which process holds a device
  std::function<int(DeviceId)> gpu_of;       ///< a device's CUDA ordinal on its machine
  std::string library = "libnccl.so.2";      ///< dlopen()ed; NEREUS_NCCL_LIBRARY overrides
  std::chrono::microseconds poll{20};        ///< how often a post checks its events
  std::chrono::seconds init_timeout{120};    ///< communicators must form within this
};

/// One rank of the NCCL group.
struct NcclRank {
  PeerId process = 0;
  int gpu = 0;
  friend bool operator==(const NcclRank&, const NcclRank&) = default;
  friend auto operator<=>(const NcclRank&, const NcclRank&) = default;
};

/// The ranks of a transition group: its distinct (process, GPU) pairs, sorted; rank i is
/// the i-th. Pure, so every process derives the same table.
std::vector<NcclRank> nccl_ranks(const NcclTransportOptions& options);

/// Whether this library was built with the NCCL transport.
bool nccl_built();

/// Loads NCCL and checks that this process's devices' GPUs exist; throws Error naming
/// what is missing (the library, a GPU).
std::unique_ptr<Transport> make_nccl_transport(asio::io_context& io, NcclTransportOptions options);

}  // namespace nereus
