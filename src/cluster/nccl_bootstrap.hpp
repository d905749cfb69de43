#pragma once
// NCCL's part of the data-plane bootstrap (src/cluster only): jobOpen may carry an NCCL
// unique id for the job's nodes, as NCCL's ncclCommInitRank expects. None is made yet:
// ncclGetUniqueId starts a bootstrap thread and a listening socket in NCCL that stay
// until every rank of a communicator connects, so an id nobody uses (the daemons have no
// NCCL transport yet) would keep both for the coordinator's life, one per job. The NCCL
// transport (transport/nccl.hpp) makes its own id in the process holding rank 0.
#include "nereus/cluster/messages.hpp"

namespace nereus::cluster::detail {

/// Checks an id a node received: empty, or NCCL's size when this build has NCCL.
void check_nccl_id(const Bytes& id);

}  // namespace nereus::cluster::detail
