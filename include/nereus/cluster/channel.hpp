#pragma once
// One control-plane connection: frames over Asio TCP, read with deadlines and a frame
// cap, and the authentication handshake for either side. Once the handshake succeeds,
// every frame in either direction carries a tag (auth.hpp, session keys): a frame that was
// altered, injected, replayed, reordered or dropped on the way fails the receiver's check
// and ends the connection. One coroutine reads at a time; any number may send (frames are
// written whole, one after another, and numbered in that order).
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <deque>
#include <memory>
#include <string>

#include "nereus/cluster/messages.hpp"
#include "nereus/base/asio.hpp"

namespace nereus::cluster {

using tcp = asio::ip::tcp;
using Millis = std::chrono::milliseconds;

class Channel {
 public:
  explicit Channel(tcp::socket socket, std::uint32_t frame_cap = kDefaultFrameCap)
      : socket_(std::move(socket)), frame_cap_(frame_cap) {}

  /// The largest frame receive() accepts from now on (small until the peer authenticated).
  void set_frame_cap(std::uint32_t cap) { frame_cap_ = cap; }
  /// From now on frames sent are tagged under `send_key` and frames received must carry a
  /// good tag under `receive_key`, each direction numbered from 0 (the handshake does it).
  void protect(Bytes send_key, Bytes receive_key);
  bool is_protected() const { return !send_key_.empty(); }
  /// Writes one frame, after the frames already being written.
  asio::awaitable<void> send(const Envelope& e);
  /// Answers request `request_id` with `body`.
  asio::awaitable<void> reply(std::uint64_t request_id, const Body& body);
  /// Reads one frame: its first byte must arrive within `idle` and the rest within `frame`
  /// after that (a peer that trickles bytes is cut off). Throws nereus::Error on end of
  /// stream, a timeout or a malformed frame; the error names which.
  asio::awaitable<Envelope> receive(Millis idle, Millis frame = Millis(5000));
  /// A request and its reply (matched by request id), the reply within `limit`.
  asio::awaitable<Envelope> call(Body body, Millis limit);

  void close();
  std::string peer() const { return peer_; }
  void set_peer(std::string p) { peer_ = std::move(p); }

 private:
  asio::awaitable<void> read_within(asio::mutable_buffer b, Millis limit, const char* what);
  tcp::socket socket_;
  std::uint32_t frame_cap_;
  std::uint64_t next_request_ = 1;
  std::string peer_;
  bool writing_ = false;
  bool closed_ = false;  ///< close() was called: sends throw at once
  /// A sender in line: woken by the one before it handing over (`given`), or by its own
  /// cancellation, after which it leaves the line without writing.
  struct Turn {
    explicit Turn(const asio::any_io_executor& ex) : timer(ex, asio::steady_timer::time_point::max()) {}
    asio::steady_timer timer;
    bool given = false;
  };
  std::deque<std::shared_ptr<Turn>> waiting_;  // senders in line, woken in order
  Bytes send_key_, receive_key_;  // empty until protect()
  std::uint64_t sent_ = 0, received_ = 0;  // tagged frames so far, per direction
};

/// Connects to `host:port`, retrying until `limit` (the coordinator may still be
/// starting); throws nereus::Error naming the address.
asio::awaitable<tcp::socket> connect_to(const std::string& host, unsigned short port, Millis limit);

/// Client side of the handshake: Hello, check the server's proof, Authenticate, Welcome.
/// Throws nereus::Error ("... refused: ..." or "the server could not prove the token").
asio::awaitable<Welcome> authenticate_as_client(Channel& ch, const std::string& token, Hello hello, Millis limit);

/// Server side: reads Hello, challenges, checks the proof; returns the Hello on success.
/// On a wrong proof answers an error and throws nereus::Error. The whole exchange must
/// finish within `limit`.
asio::awaitable<Hello> authenticate_as_server(Channel& ch, const std::string& token, std::int32_t nodes, Millis limit);

}  // namespace nereus::cluster
