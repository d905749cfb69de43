#pragma once
// Authentication of control-plane connections: a shared secret, never sent, proved by
// challenge-response HMAC-SHA256 over fresh nonces from both sides (src/cluster/control.capnp
// has the exchange). Both sides prove it, so a node never joins an impostor coordinator.
#include <string>
#include <string_view>

#include "nereus/cluster/messages.hpp"

namespace nereus::cluster {

/// The shared secret: from `token_file` when given, else the environment variable
/// NEREUS_TOKEN. Throws nereus::Error naming what is wrong (missing, unreadable, empty,
/// a file others can read).
std::string load_token(const std::string& token_file);

/// HMAC-SHA256(key, message).
Bytes hmac_sha256(std::string_view key, std::span<const std::uint8_t> message);

/// `n` bytes from the system's cryptographic random generator.
Bytes random_nonce(std::size_t n = 32);

/// The proofs of the exchange: the server's over (client nonce, server nonce), the
/// client's over (server nonce, client nonce), each with its own label so that one cannot
/// be replayed as the other.
Bytes server_proof(std::string_view token, const Bytes& client_nonce, const Bytes& server_nonce);
Bytes client_proof(std::string_view token, const Bytes& server_nonce, const Bytes& client_nonce);

/// Constant-time comparison.
bool same_proof(const Bytes& a, const Bytes& b);

/// After the handshake every frame carries a tag: HMAC-SHA256 under a key for its
/// direction, derived from the token and both nonces (so each connection has its own),
/// over the frame's sequence number in that direction and its body. An altered, injected,
/// replayed, reordered or dropped frame fails the receiver's check, which ends the
/// connection. The frames stay readable (integrity, not secrecy).
struct SessionKeys {
  Bytes client_to_server, server_to_client;
};
SessionKeys session_keys(std::string_view token, const Bytes& client_nonce, const Bytes& server_nonce);
inline constexpr std::size_t kFrameTagBytes = 32;  // a whole number of Cap'n Proto words
/// The tag of the `sequence`-th frame (from 0) sent under `key`.
Bytes frame_tag(const Bytes& key, std::uint64_t sequence, std::span<const std::uint8_t> body);

}  // namespace nereus::cluster
