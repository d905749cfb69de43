#pragma once
// A tool's request to a daemon (nereus cluster status / job, nereus bench transition
// --daemons): connect, authenticate, one request, its reply.
#include <string>

#include "nereus/cluster/channel.hpp"
#include "nereus/cluster/launch.hpp"

namespace nereus::cluster {

/// Sends `request` to the daemon at `at` and returns its reply within `limit` (connecting
/// and the handshake get 5 s each). Throws nereus::Error naming the daemon when it cannot
/// be reached, refuses the token, answers with an error, or answers with anything but a
/// `Reply`.
template <class Reply>
Reply ask_daemon(const Endpoint& at, const std::string& token, Body request, Millis limit);

/// The instantiations the tools use.
extern template ClusterStatus ask_daemon<ClusterStatus>(const Endpoint&, const std::string&, Body, Millis);
extern template TransitionResult ask_daemon<TransitionResult>(const Endpoint&, const std::string&, Body, Millis);

}  // namespace nereus::cluster
