#pragma once
// The bench's control channel between the parent and its worker processes: CBOR
// messages (nlohmann-json, with binary fields for UCX addresses and rkeys), each framed
// by a 4-byte little-endian length, over a Unix socket pair read with Asio.
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>

#include "nereus/base/error.hpp"
#include "nereus/base/asio.hpp"

namespace nereus::bench {

using json = nlohmann::json;
using Socket = asio::local::stream_protocol::socket;

inline constexpr std::uint32_t kMaxMessage = 256u << 20;

inline asio::awaitable<void> send(Socket& s, const json& msg) {
  const std::vector<std::uint8_t> body = json::to_cbor(msg);
  const auto n = static_cast<std::uint32_t>(body.size());
  const std::uint8_t head[4] = {static_cast<std::uint8_t>(n), static_cast<std::uint8_t>(n >> 8),
                                static_cast<std::uint8_t>(n >> 16), static_cast<std::uint8_t>(n >> 24)};
  std::array<asio::const_buffer, 2> bufs{asio::buffer(head), asio::buffer(body)};
  co_await asio::async_write(s, bufs, asio::use_awaitable);
}

/// Reads one message; an empty object on end of stream.
inline asio::awaitable<json> receive(Socket& s) {
  std::uint8_t head[4];
  auto [ec, n] = co_await asio::async_read(s, asio::buffer(head), asio::as_tuple(asio::use_awaitable));
  if (ec) co_return json::object();
  const std::uint32_t len = head[0] | (head[1] << 8) | (head[2] << 16) | (static_cast<std::uint32_t>(head[3]) << 24);
  if (len > kMaxMessage) throw Error("control message of " + std::to_string(len) + " bytes exceeds the limit");
  std::vector<std::uint8_t> body(len);
  auto [ec2, m] = co_await asio::async_read(s, asio::buffer(body), asio::as_tuple(asio::use_awaitable));
  if (ec2) co_return json::object();
  try {
    co_return json::from_cbor(body);
  } catch (const json::exception& e) {
    throw Error(std::string("malformed control message: ") + e.what());
  }
}

inline std::vector<std::byte> bytes_of(const json& j) {
  const auto& b = j.get_binary();
  std::vector<std::byte> out(b.size());
  std::memcpy(out.data(), b.data(), b.size());
  return out;
}

inline json binary(const std::vector<std::byte>& v) {
  return json::binary(std::vector<std::uint8_t>(reinterpret_cast<const std::uint8_t*>(v.data()),
                                                reinterpret_cast<const std::uint8_t*>(v.data()) + v.size()));
}

}  // namespace nereus::bench
