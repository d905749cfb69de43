#pragma once
// A node's part of an exchange the coordinator drives over one channel: a transition
// (NodeTransition) or a job (NodeJob). The skeleton is written once here: each message
// is answered by the part, a bad request (nereus::Error) is answered as failed, and
// the reply goes back on the channel unless the part replies later by itself.
#include <variant>

#include "nereus/cluster/channel.hpp"
#include "nereus/cluster/messages.hpp"

namespace nereus::cluster {

class NodePart {
 public:
  virtual ~NodePart() = default;
  /// Handles one message of the exchange; false when the message is not part of it.
  asio::awaitable<bool> handle(Channel& ch, const Envelope& m);
  /// Releases everything (the coordinator finished).
  virtual asio::awaitable<void> close() = 0;
  /// The coordinator went away mid-exchange: a peer may be dead, so the part's transports
  /// are quarantined (transport/ucx.hpp, "Lifetimes"), then everything is released.
  asio::awaitable<void> abandon() {
    quarantine();
    co_await close();
  }

 protected:
  struct NotMine {};  ///< the message belongs to another exchange
  struct Later {};    ///< the part replies itself once the work is done
  using Answer = std::variant<NotMine, Later, Body>;
  /// Work in flight may involve a dead or frozen peer: never destroy the transports.
  virtual void quarantine() = 0;
  /// Whether a Finish on the channel ends this part (closes it and is answered).
  virtual bool takes_finish() const = 0;
  /// The part's answer to `m` (Finish excepted); throws nereus::Error for a request it refuses.
  virtual asio::awaitable<Answer> answer(Channel& ch, const Envelope& m) = 0;
};

}  // namespace nereus::cluster
