#pragma once
// Shared by the transition driver and a node's part (src/cluster only).
#include "nereus/runtime/participant.hpp"
#include "nereus/cluster/messages.hpp"

namespace nereus::cluster::detail {

/// The reshard a transition request carries (the request's other settings, repeat,
/// verify, dump and timeout, are the driver's).
ReshardSpec config_of(const TransitionSpec& s);

}  // namespace nereus::cluster::detail
