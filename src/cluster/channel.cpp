#include "nereus/cluster/channel.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <memory>

#include "nereus/cluster/auth.hpp"
#include "nereus/base/error.hpp"
#include "nereus/base/log.hpp"

namespace nereus::cluster {

void Channel::protect(Bytes send_key, Bytes receive_key) {
  send_key_ = std::move(send_key);
  receive_key_ = std::move(receive_key);
  sent_ = received_ = 0;
}

asio::awaitable<void> Channel::send(const Envelope& e) {
  if (closed_) throw Error("sending " + std::string(kind_name(e.body)) + " to " + peer_ + ": the channel is closed");
  Bytes frame = encode_frame(e);
  if (writing_) {  // wait in line; the sender before us hands the turn over
    auto turn = std::make_shared<Turn>(socket_.get_executor());
    waiting_.push_back(turn);
    log(LogLevel::trace, "channel", "{} to {}: waits in line ({} waiting)", kind_name(e.body), peer_, waiting_.size());
    co_await turn->timer.async_wait(asio::as_tuple(asio::use_awaitable));
    log(LogLevel::trace, "channel", "{} to {}: {}", kind_name(e.body), peer_, turn->given ? "given the turn" : "cancelled in line");
    if (!turn->given) {
      // Cancelled in line (a graph aborted, a job stopping): leave the line and write
      // nothing. Writing anyway would interleave with the sender that has the turn, and
      // leaving our place in the line would strand everyone behind it (a job that hung).
      std::erase(waiting_, turn);
      throw Error("sending " + std::string(kind_name(e.body)) + " to " + peer_ + " was cancelled");
    }
  }
  writing_ = true;
  if (is_protected()) {  // tagged in the order frames go out: our turn is that order
    const Bytes tag = frame_tag(send_key_, sent_++, std::span<const std::uint8_t>(frame).subspan(4));
    frame.insert(frame.end(), tag.begin(), tag.end());
    const std::uint32_t n = static_cast<std::uint32_t>(frame.size() - 4);
    for (int i = 0; i < 4; ++i) frame[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(n >> (8 * i));
  }
  log(LogLevel::trace, "channel", "{} to {}: writes {} bytes", kind_name(e.body), peer_, frame.size());
  auto [ec, n] = co_await asio::async_write(socket_, asio::buffer(frame), asio::as_tuple(asio::use_awaitable));
  log(LogLevel::trace, "channel", "{} to {}: written ({})", kind_name(e.body), peer_, ec ? ec.message() : "ok");
  if (waiting_.empty()) {
    writing_ = false;
  } else {
    waiting_.front()->given = true;
    waiting_.front()->timer.cancel();
    waiting_.pop_front();
  }
  if (ec) throw Error("sending " + std::string(kind_name(e.body)) + " to " + peer_ + " failed: " + ec.message());
}

// A watchdog closes the socket when the read overruns; the shared flag keeps a handler that
// was already queued from closing it after the read returned.
asio::awaitable<void> Channel::read_within(asio::mutable_buffer b, Millis limit, const char* what) {
  auto done = std::make_shared<bool>(false);
  auto expired = std::make_shared<bool>(false);
  asio::steady_timer watchdog(socket_.get_executor(), limit);
  watchdog.async_wait([this, done, expired](boost::system::error_code ec) {
    if (ec || *done) return;
    *expired = true;
    boost::system::error_code ignored;
    socket_.close(ignored);
  });
  auto [ec, n] = co_await asio::async_read(socket_, b, asio::as_tuple(asio::use_awaitable));
  *done = true;
  watchdog.cancel();
  if (*expired) throw Error(peer_ + ": no " + what + " within " + std::to_string(limit.count()) + " ms");
  if (ec == asio::error::eof) throw Error(peer_ + ": connection closed");
  if (ec) throw Error(peer_ + ": " + ec.message());
}

asio::awaitable<Envelope> Channel::receive(Millis idle, Millis frame) {
  std::uint8_t head[4];
  co_await read_within(asio::buffer(head, 1), idle, "message");
  co_await read_within(asio::buffer(head + 1, 3), frame, "complete frame");
  const std::uint32_t tag = is_protected() ? kFrameTagBytes : 0;
  const std::uint32_t n = frame_length(std::span<const std::uint8_t, 4>(head, 4), frame_cap_ + tag);
  if (n <= tag) throw Error(peer_ + ": frame of " + std::to_string(n) + " bytes has no room for its integrity tag");
  Bytes body(n);
  co_await read_within(asio::buffer(body), frame, "complete frame");
  if (tag) {
    const std::span<const std::uint8_t> message(body.data(), n - tag);
    const Bytes want = frame_tag(receive_key_, received_, message);
    const Bytes got(body.end() - tag, body.end());
    if (!same_proof(want, got))
      throw Error(peer_ + ": frame " + std::to_string(received_) +
                  " failed its integrity check (altered, injected, replayed or out of order on the way)");
    ++received_;
    body.resize(n - tag);
  }
  co_return decode_body(body, frame_cap_);
}

// Note (here and in the daemon): no braced temporaries inside a co_await expression; GCC 12
// destroys some of them twice. Build named locals first.
asio::awaitable<Envelope> Channel::call(Body body, Millis limit) {
  Envelope req;
  req.request_id = next_request_++;
  req.deadline_ms = static_cast<std::uint32_t>(limit.count());
  req.body = std::move(body);
  co_await send(req);
  for (;;) {
    Envelope rep = co_await receive(limit);
    if (rep.request_id == req.request_id) co_return rep;  // anything else is stale; skip it
  }
}

asio::awaitable<void> Channel::reply(std::uint64_t request_id, const Body& body) {
  const Envelope e{kProtocolVersion, request_id, 0, body};
  co_await send(e);
}

void Channel::close() {
  closed_ = true;
  boost::system::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);  // a write in flight completes, aborted
  // Senders in line leave it (not given the turn: they throw), so no send outlives the
  // channel: a job that hung waited on a send to a lost node that never returned.
  for (const auto& turn : waiting_) turn->timer.cancel();
}

asio::awaitable<tcp::socket> connect_to(const std::string& host, unsigned short port, Millis limit) {
  auto ex = co_await asio::this_coro::executor;
  const auto until = std::chrono::steady_clock::now() + limit;
  tcp::resolver resolver(ex);
  auto [rec, endpoints] = co_await resolver.async_resolve(host, std::to_string(port), asio::as_tuple(asio::use_awaitable));
  if (rec) throw Error("cannot resolve " + host + ": " + rec.message());
  std::string last;
  for (Millis backoff(50);; backoff = std::min(backoff * 2, Millis(1000))) {
    tcp::socket s(ex);
    auto [ec, ep] = co_await asio::async_connect(s, endpoints, asio::as_tuple(asio::use_awaitable));
    if (!ec) {
      s.set_option(tcp::no_delay(true));
      co_return s;
    }
    last = ec.message();
    if (std::chrono::steady_clock::now() + backoff > until) break;
    asio::steady_timer t(ex, backoff);
    co_await t.async_wait(asio::use_awaitable);
  }
  throw Error("cannot connect to " + host + ":" + std::to_string(port) + " within " + std::to_string(limit.count()) +
              " ms: " + last);
}

asio::awaitable<Welcome> authenticate_as_client(Channel& ch, const std::string& token, Hello hello, Millis limit) {
  hello.nonce = random_nonce();
  const Bytes mine = hello.nonce;
  Body greeting = std::move(hello);
  Envelope reply = co_await ch.call(std::move(greeting), limit);
  if (auto* e = std::get_if<ErrorReply>(&reply.body)) throw Error(ch.peer() + " refused the connection: " + e->message);
  auto* c = std::get_if<Challenge>(&reply.body);
  if (!c) throw Error(ch.peer() + " answered hello with " + kind_name(reply.body));
  // The client proves itself even when the server's proof is wrong (the proof reveals
  // nothing of the token), so that the server, too, logs the mismatch as a wrong token.
  const bool server_ok = same_proof(c->proof, server_proof(token, mine, c->nonce));
  const Bytes theirs = c->nonce;  // `reply` is reused below
  Body auth = Authenticate{client_proof(token, theirs, mine)};
  reply = co_await ch.call(std::move(auth), limit);
  if (!server_ok) throw Error(ch.peer() + " could not prove the shared secret (a different token, or not a nereusd)");
  if (auto* e = std::get_if<ErrorReply>(&reply.body)) throw Error(ch.peer() + " refused the connection: " + e->message);
  auto* w = std::get_if<Welcome>(&reply.body);
  if (!w) throw Error(ch.peer() + " answered authenticate with " + kind_name(reply.body));
  SessionKeys keys = session_keys(token, mine, theirs);
  ch.protect(std::move(keys.client_to_server), std::move(keys.server_to_client));
  co_return *w;
}

asio::awaitable<Hello> authenticate_as_server(Channel& ch, const std::string& token, std::int32_t nodes, Millis limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  auto left = [&] { return std::max(Millis(1), std::chrono::duration_cast<Millis>(until - std::chrono::steady_clock::now())); };
  Envelope first = co_await ch.receive(left(), left());
  auto* hello = std::get_if<Hello>(&first.body);
  if (!hello) throw Error(ch.peer() + ": expected hello, got " + kind_name(first.body));
  if (hello->nonce.size() < 16) throw Error(ch.peer() + ": hello nonce too short");
  Hello h = *hello;
  const Bytes nonce = random_nonce();
  const Envelope challenge{kProtocolVersion, first.request_id, 0, Challenge{nonce, server_proof(token, h.nonce, nonce)}};
  co_await ch.send(challenge);
  Envelope second = co_await ch.receive(left(), left());
  auto* a = std::get_if<Authenticate>(&second.body);
  if (!a) throw Error(ch.peer() + ": expected authenticate, got " + kind_name(second.body));
  if (!same_proof(a->proof, client_proof(token, nonce, h.nonce))) {
    const Envelope refusal{kProtocolVersion, second.request_id, 0, ErrorReply{"wrong token"}};
    co_await ch.send(refusal);
    throw Error(ch.peer() + ": wrong token");
  }
  const Envelope welcome{kProtocolVersion, second.request_id, 0, Welcome{nodes}};
  co_await ch.send(welcome);
  SessionKeys keys = session_keys(token, h.nonce, nonce);
  ch.protect(std::move(keys.server_to_client), std::move(keys.client_to_server));
  co_return h;
}

}  // namespace nereus::cluster
