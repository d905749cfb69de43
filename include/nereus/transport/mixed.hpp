#pragma once
// Several remote transports as one, so that one transition gives each link the best
// transport that reaches it: CUDA IPC inside a machine, NCCL or UCX across machines. The
// executor sees one remote transport and asks it per peer (capabilities_for): gets where
// the peer is reached by CUDA IPC, messages where by NCCL, and so on.
//
// A peer's route is the first transport, in the order given (best first), whose connect()
// to it succeeded; CUDA IPC refuses a peer on another machine, UCX and NCCL take any. Both
// ends of a link must pick the same route (a message needs a sender and a receiver on one
// transport): they do when every process builds its mixed transport from the same
// transports in the same order and connecting is symmetric, as machine identity is.
// Addresses and remote keys are each inner transport's, framed together in that order.
#include <map>
#include <string>
#include <vector>

#include "nereus/transport/transport.hpp"

namespace nereus {

class MixedTransport final : public Transport {
 public:
  /// `inner`: remote transports, best first; not owned, and they must outlive this.
  explicit MixedTransport(std::vector<Transport*> inner);

  std::string_view name() const override { return "mixed"; }
  /// What any inner transport can do (so binding two-sided links needs one with messages).
  Capabilities capabilities() const override;
  /// The peer's route's capabilities; nothing for a peer not connected.
  Capabilities capabilities_for(PeerId peer) const override;
  /// The name of the transport that reaches `peer` (empty when none does).
  std::string_view route_name(PeerId peer) const;

  /// Registers the region with every inner transport that moves its kind.
  Registration register_memory(const MemoryRegion& region) override;
  void deregister_memory(const Registration& registration) override;
  std::vector<std::byte> address() const override;
  /// Connects every inner transport (each may refuse); the first that accepted is the
  /// peer's route. An error only when none accepted, naming each one's reason.
  Status connect(PeerId peer, std::span<const std::byte> address) override;
  Status add_remote_region(PeerId peer, DeviceId remote_device, std::span<const std::byte> key, std::uint64_t base = 0,
                           std::uint64_t size = 0) override;
  /// Posts on the route of the list's peer.
  asio::awaitable<Status> post(DescriptorList list) override;
  /// Posts on the route of the lists' peers, which must be one grouped transport.
  asio::awaitable<Status> post_group(std::vector<DescriptorList> lists) override;

 private:
  std::vector<Transport*> inner_;
  std::map<PeerId, std::size_t> route_;        ///< peer → index of its transport
  std::map<PeerId, std::vector<bool>> connected_;  ///< which inner transports accepted the peer
  std::map<std::uint64_t, std::vector<Registration>> registrations_;  ///< handle → the inner ones (empty region: not registered)
  std::uint64_t next_handle_ = 1;
};

/// Frames byte strings into one (a count, then each one's length and bytes), and back;
/// unframe() returns nothing for bytes that are not such a frame.
std::vector<std::byte> frame(const std::vector<std::vector<std::byte>>& parts);
std::vector<std::vector<std::byte>> unframe(std::span<const std::byte> framed);

}  // namespace nereus
