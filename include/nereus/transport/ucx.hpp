#pragma once
// The `ucx` backend (UCP): RMA get/put with rkeys between processes, over whatever UCX
// picks (shared memory, CMA, TCP on loopback). One UCP worker per transport, progressed
// from its io_context: busy progress while operations are in flight, an armed wait on
// the worker's event fd when idle, and a fallback timer tick.
#include <map>
#include <memory>
#include <string>

#include "nereus/transport/transport.hpp"

namespace nereus {

struct UcxOptions {
  /// UCX_NET_DEVICES unless the environment sets it: loopback keeps benches on this host.
  std::string net_devices = "lo";
  /// Detect failed peers (fails their in-flight operations instead of hanging).
  bool peer_error_handling = true;
};

class UcxTransport final : public Transport {
 public:
  /// Creates the UCP context and worker; `io` must be run by exactly one thread.
  UcxTransport(asio::io_context& io, UcxOptions options = {});
  ~UcxTransport() override;

  std::string_view name() const override { return "ucx"; }
  Capabilities capabilities() const override;
  Registration register_memory(const MemoryRegion& region) override;
  /// The memory stays mapped until the transport is destroyed (after its worker).
  void deregister_memory(const Registration& registration) override;
  std::vector<std::byte> address() const override;
  Status connect(PeerId peer, std::span<const std::byte> address) override;
  Status add_remote_region(PeerId peer, DeviceId remote_device, std::span<const std::byte> key) override;
  asio::awaitable<Status> post(DescriptorList list) override;

  /// Closes endpoints and stops the progress loop; call before the io_context stops.
  asio::awaitable<void> shutdown();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace nereus
