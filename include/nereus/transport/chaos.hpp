#pragma once
// A transport wrapper for tests and benches: delays each post by a random time and can
// fail a chosen post, so coordination is exercised under random timing and real faults.
#include <cstdint>
#include <random>

#include "nereus/transport/transport.hpp"

namespace nereus {

struct ChaosOptions {
  double max_delay_seconds = 0;  ///< each post waits uniform [0, max) before moving bytes
  std::int64_t fail_post = -1;   ///< the n-th post (0-based) fails with io_error; −1: never
  std::uint64_t seed = 1;
};

/// Forwards to `inner` after a random delay; fails one post when asked.
class ChaosTransport final : public Transport {
 public:
  ChaosTransport(Transport& inner, ChaosOptions options) : inner_(inner), options_(options), rng_(options.seed) {}

  std::string_view name() const override { return "chaos"; }
  Capabilities capabilities() const override { return inner_.capabilities(); }
  Registration register_memory(const MemoryRegion& region) override { return inner_.register_memory(region); }
  void deregister_memory(const Registration& r) override { inner_.deregister_memory(r); }
  asio::awaitable<Status> post(DescriptorList list) override;

  std::int64_t posts() const { return posts_; }
  /// Arms a failure of the n-th post from now on (−1 disarms).
  void fail_after(std::int64_t n) { options_.fail_post = n < 0 ? -1 : posts_ + n; }

 private:
  Transport& inner_;
  ChaosOptions options_;
  std::mt19937_64 rng_;
  std::int64_t posts_ = 0;
};

}  // namespace nereus
