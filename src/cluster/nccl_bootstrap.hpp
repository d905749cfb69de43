#pragma once
// NCCL's part of the data-plane bootstrap (src/cluster only): the coordinator makes one
// unique id per job and hands it to every node with jobOpen, as NCCL's
// ncclCommInitRank expects. Built only when meson finds NCCL (-Dnccl); libnccl.so.2 is
// opened at run time, so a binary carried where NCCL is absent still runs.
#include "nereus/cluster/messages.hpp"

namespace nereus::cluster::detail {

/// A fresh NCCL unique id (ncclGetUniqueId; it needs no GPU); empty without NCCL (in the
/// build or on the machine). Throws nereus::Error when NCCL fails.
Bytes nccl_unique_id();
/// Checks an id a node received: empty, or NCCL's size when this build has NCCL.
void check_nccl_id(const Bytes& id);

}  // namespace nereus::cluster::detail
