#pragma once
// In-process copies between device arenas, split into chunks run by a small pool of copy
// threads; strided segments are copied row by row.
#include <memory>

#include "nereus/transport/transport.hpp"

namespace nereus {

struct LocalTransportOptions {
  unsigned threads = 2;               ///< copy threads
  std::size_t chunk_bytes = 1 << 20;  ///< work unit handed to one copy thread
};

/// The `local` backend: copies inside one process.
class LocalTransport final : public Transport {
 public:
  explicit LocalTransport(LocalTransportOptions options = {});
  ~LocalTransport() override;

  std::string_view name() const override { return "local"; }
  Capabilities capabilities() const override;
  Registration register_memory(const MemoryRegion& region) override;
  asio::awaitable<Status> post(DescriptorList list) override;

 private:
  struct Pool;
  std::unique_ptr<Pool> pool_;
  LocalTransportOptions options_;
};

}  // namespace nereus
