#include "nereus/cluster/auth.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "nereus/base/error.hpp"

namespace nereus::cluster {

std::string load_token(const std::string& token_file) {
  std::string token;
  if (!token_file.empty()) {
    struct stat st {};
    if (::stat(token_file.c_str(), &st) != 0) throw Error("token file '" + token_file + "' does not exist");
    if (st.st_mode & (S_IRWXG | S_IRWXO))
      throw Error("token file '" + token_file + "' is readable by others (chmod 600 it)");
    std::ifstream in(token_file, std::ios::binary);
    if (!in) throw Error("token file '" + token_file + "' cannot be read");
    std::stringstream ss;
    ss << in.rdbuf();
    token = ss.str();
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
    if (token.empty()) throw Error("token file '" + token_file + "' is empty");
  } else if (const char* env = std::getenv("NEREUS_TOKEN"); env && *env) {
    token = env;
  } else {
    throw Error("no shared secret: pass --token-file F or set NEREUS_TOKEN");
  }
  if (token.size() < 16) throw Error("the shared secret is shorter than 16 bytes");
  return token;
}

Bytes hmac_sha256(std::string_view key, std::span<const std::uint8_t> message) {
  Bytes out(EVP_MAX_MD_SIZE);
  unsigned len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), message.data(), message.size(), out.data(), &len))
    throw Error("HMAC-SHA256 failed");
  out.resize(len);
  return out;
}

Bytes random_nonce(std::size_t n) {
  Bytes out(n);
  if (RAND_bytes(out.data(), static_cast<int>(n)) != 1) throw Error("the system random generator failed");
  return out;
}

namespace {
Bytes proof(std::string_view token, std::string_view label, const Bytes& first, const Bytes& second) {
  Bytes msg(label.begin(), label.end());
  msg.push_back(0);
  msg.push_back(static_cast<std::uint8_t>(first.size()));
  msg.insert(msg.end(), first.begin(), first.end());
  msg.insert(msg.end(), second.begin(), second.end());
  return hmac_sha256(token, msg);
}
}  // namespace

Bytes server_proof(std::string_view token, const Bytes& client_nonce, const Bytes& server_nonce) {
  return proof(token, "nereus-server-v1", client_nonce, server_nonce);
}

Bytes client_proof(std::string_view token, const Bytes& server_nonce, const Bytes& client_nonce) {
  return proof(token, "nereus-client-v1", server_nonce, client_nonce);
}

SessionKeys session_keys(std::string_view token, const Bytes& client_nonce, const Bytes& server_nonce) {
  return {proof(token, "nereus-frames-client-to-server-v1", client_nonce, server_nonce),
          proof(token, "nereus-frames-server-to-client-v1", client_nonce, server_nonce)};
}

Bytes frame_tag(const Bytes& key, std::uint64_t sequence, std::span<const std::uint8_t> body) {
  // EVP_MAC streams the sequence number and the body without copying the body.
  static EVP_MAC* const hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  std::uint8_t seq[8];
  for (int i = 0; i < 8; ++i) seq[i] = static_cast<std::uint8_t>(sequence >> (8 * i));
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0), OSSL_PARAM_construct_end()};
  Bytes out(EVP_MAX_MD_SIZE);
  std::size_t len = 0;
  EVP_MAC_CTX* ctx = hmac ? EVP_MAC_CTX_new(hmac) : nullptr;
  const bool ok = ctx && EVP_MAC_init(ctx, key.data(), key.size(), params) && EVP_MAC_update(ctx, seq, sizeof seq) &&
                  EVP_MAC_update(ctx, body.data(), body.size()) && EVP_MAC_final(ctx, out.data(), &len, out.size());
  EVP_MAC_CTX_free(ctx);
  if (!ok) throw Error("HMAC-SHA256 failed");
  out.resize(len);
  return out;
}

bool same_proof(const Bytes& a, const Bytes& b) {
  return a.size() == b.size() && !a.empty() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace nereus::cluster
