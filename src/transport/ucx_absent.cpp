// Built when meson found no UCX: the ucx backend reports that it is absent.
#include "nereus/base/error.hpp"
#include "nereus/transport/ucx.hpp"

namespace nereus {

struct UcxTransport::Impl {};

UcxTransport::UcxTransport(asio::io_context&, UcxOptions) {
  throw Error("this build has no UCX transport: install libucx-dev and reconfigure with -Ducx=enabled");
}
UcxTransport::~UcxTransport() = default;
Capabilities UcxTransport::capabilities() const { return {}; }
Registration UcxTransport::register_memory(const MemoryRegion& r) { return {r, {}, 0}; }
void UcxTransport::deregister_memory(const Registration&) {}
std::vector<std::byte> UcxTransport::address() const { return {}; }
Status UcxTransport::connect(PeerId, std::span<const std::byte>) { return {StatusCode::not_supported, "no UCX"}; }
Status UcxTransport::add_remote_region(PeerId, DeviceId, std::span<const std::byte>, std::uint64_t, std::uint64_t) {
  return {StatusCode::not_supported, "no UCX"};
}
asio::awaitable<Status> UcxTransport::post(DescriptorList) { co_return Status{StatusCode::not_supported, "no UCX"}; }
asio::awaitable<void> UcxTransport::shutdown() { co_return; }
const std::byte* UcxTransport::mapped(PeerId, DeviceId, std::uint64_t) const { return nullptr; }
std::byte* UcxTransport::allocate_arena(DeviceId, std::size_t) { throw Error("this build has no UCX transport"); }
void UcxTransport::release_arena(std::byte*, std::size_t) {}
void UcxTransport::quarantine() {}
std::size_t UcxTransport::abandon_sends() { return 0; }

}  // namespace nereus
