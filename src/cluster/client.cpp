// A tool's request to a daemon (client.hpp).
#include "nereus/cluster/client.hpp"

#include "nereus/cluster/auth.hpp"
#include "nereus/base/error.hpp"

namespace nereus::cluster {

template <class Reply>
Reply ask_daemon(const Endpoint& at, const std::string& token, Body request, Millis limit) {
  asio::io_context io;
  Reply out;
  std::exception_ptr err;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    Channel ch(co_await connect_to(at.host, at.port, Millis(5000)));
    ch.set_peer(at.str());
    const Hello hello{Role::client, -1, 0, {}};
    co_await authenticate_as_client(ch, token, hello, Millis(5000));
    const Envelope r = co_await ch.call(std::move(request), limit);
    if (auto* e = std::get_if<ErrorReply>(&r.body)) throw Error(at.str() + ": " + e->message);
    auto* reply = std::get_if<Reply>(&r.body);
    if (!reply) throw Error(at.str() + " answered with " + kind_name(r.body));
    out = *reply;
    ch.close();
  }, [&](std::exception_ptr e) { err = e; });
  io.run();
  if (err) std::rethrow_exception(err);
  return out;
}

template ClusterStatus ask_daemon<ClusterStatus>(const Endpoint&, const std::string&, Body, Millis);
template TransitionResult ask_daemon<TransitionResult>(const Endpoint&, const std::string&, Body, Millis);

}  // namespace nereus::cluster
