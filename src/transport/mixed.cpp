#include "nereus/transport/mixed.hpp"

#include <algorithm>
#include <cstring>

#include "nereus/base/error.hpp"

namespace nereus {

namespace {

void put_u32(std::vector<std::byte>& out, std::uint32_t v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + 4);
}

bool moves(const Capabilities& c, MemoryKind kind) { return std::find(c.memory.begin(), c.memory.end(), kind) != c.memory.end(); }

}  // namespace

std::vector<std::byte> frame(const std::vector<std::vector<std::byte>>& parts) {
  std::vector<std::byte> out;
  put_u32(out, static_cast<std::uint32_t>(parts.size()));
  for (const auto& p : parts) {
    put_u32(out, static_cast<std::uint32_t>(p.size()));
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

std::vector<std::vector<std::byte>> unframe(std::span<const std::byte> in) {
  auto u32 = [&](std::size_t at, std::uint32_t& v) {
    if (at + 4 > in.size()) return false;
    std::memcpy(&v, in.data() + at, 4);
    return true;
  };
  std::uint32_t n = 0;
  if (!u32(0, n) || n > in.size()) return {};
  std::vector<std::vector<std::byte>> out;
  std::size_t at = 4;
  for (std::uint32_t i = 0; i < n; ++i) {
    std::uint32_t len = 0;
    if (!u32(at, len) || at + 4 + len > in.size()) return {};
    out.emplace_back(in.begin() + static_cast<std::ptrdiff_t>(at + 4), in.begin() + static_cast<std::ptrdiff_t>(at + 4 + len));
    at += 4 + len;
  }
  if (at != in.size()) return {};
  return out;
}

MixedTransport::MixedTransport(std::vector<Transport*> inner) : inner_(std::move(inner)) {
  if (inner_.empty()) throw Error("a mixed transport needs at least one transport");
}

Capabilities MixedTransport::capabilities() const {
  Capabilities out;
  for (const Transport* t : inner_) {
    const Capabilities c = t->capabilities();
    out.remote_get |= c.remote_get;
    out.remote_put |= c.remote_put;
    out.two_sided |= c.two_sided;
    out.grouped |= c.grouped;
    for (MemoryKind k : c.memory)
      if (!moves(out, k)) out.memory.push_back(k);
  }
  return out;
}

Capabilities MixedTransport::capabilities_for(PeerId peer) const {
  auto it = route_.find(peer);
  return it == route_.end() ? Capabilities{} : inner_[it->second]->capabilities_for(peer);
}

std::string_view MixedTransport::route_name(PeerId peer) const {
  auto it = route_.find(peer);
  return it == route_.end() ? std::string_view{} : inner_[it->second]->name();
}

Registration MixedTransport::register_memory(const MemoryRegion& region) {
  std::vector<Registration> regs(inner_.size());
  std::vector<std::vector<std::byte>> keys(inner_.size());
  bool any = false;
  for (std::size_t i = 0; i < inner_.size(); ++i) {
    if (!moves(inner_[i]->capabilities(), region.kind)) continue;
    regs[i] = inner_[i]->register_memory(region);
    keys[i] = regs[i].remote_key;
    any = true;
  }
  if (!any)
    throw Error("none of the mixed transports moves " + std::string(to_string(region.kind)) + " memory (device " +
                std::to_string(region.device) + ")");
  const std::uint64_t handle = next_handle_++;
  registrations_[handle] = std::move(regs);
  return {region, frame(keys), handle};
}

void MixedTransport::deregister_memory(const Registration& registration) {
  auto it = registrations_.find(registration.handle);
  if (it == registrations_.end()) return;
  for (std::size_t i = 0; i < inner_.size(); ++i)
    if (it->second[i].region.base) inner_[i]->deregister_memory(it->second[i]);
  registrations_.erase(it);
}

std::vector<std::byte> MixedTransport::address() const {
  std::vector<std::vector<std::byte>> parts;
  for (const Transport* t : inner_) parts.push_back(t->address());
  return frame(parts);
}

Status MixedTransport::connect(PeerId peer, std::span<const std::byte> address) {
  const auto parts = unframe(address);
  if (parts.size() != inner_.size())
    return {StatusCode::invalid, "peer " + std::to_string(peer) + "'s address is not one of " + std::to_string(inner_.size()) +
                                     " framed transport addresses (do both ends mix the same transports?)"};
  std::vector<bool> ok(inner_.size(), false);
  std::string why;
  for (std::size_t i = 0; i < inner_.size(); ++i) {
    const Status st = inner_[i]->connect(peer, parts[i]);
    ok[i] = st.is_ok();
    if (!ok[i]) why += (why.empty() ? "" : "; ") + std::string(inner_[i]->name()) + ": " + st.message();
  }
  const auto first = std::find(ok.begin(), ok.end(), true);
  if (first == ok.end()) return {StatusCode::invalid, "no transport reaches peer " + std::to_string(peer) + " (" + why + ")"};
  route_[peer] = static_cast<std::size_t>(first - ok.begin());
  connected_[peer] = std::move(ok);
  return Status::ok();
}

Status MixedTransport::add_remote_region(PeerId peer, DeviceId remote_device, std::span<const std::byte> key, std::uint64_t base,
                                         std::uint64_t size) {
  auto c = connected_.find(peer);
  if (c == connected_.end()) return {StatusCode::invalid, "peer " + std::to_string(peer) + " is not connected"};
  const auto keys = unframe(key);
  if (keys.size() != inner_.size())
    return {StatusCode::invalid, "a region key of peer " + std::to_string(peer) + " is not one of " + std::to_string(inner_.size()) +
                                     " framed keys"};
  // Only the peer's route must take it; others that reach the peer may use it later, and
  // a key an inner transport did not make (empty) is skipped.
  for (std::size_t i = 0; i < inner_.size(); ++i) {
    if (!c->second[i] || keys[i].empty()) continue;
    const Status st = inner_[i]->add_remote_region(peer, remote_device, keys[i], base, size);
    if (!st && i == route_.at(peer)) return st;
  }
  return Status::ok();
}

asio::awaitable<Status> MixedTransport::post(DescriptorList list) {
  auto it = route_.find(list.peer);
  if (it == route_.end()) co_return Status{StatusCode::invalid, "no transport reaches peer " + std::to_string(list.peer)};
  co_return co_await inner_[it->second]->post(std::move(list));
}

asio::awaitable<Status> MixedTransport::post_group(std::vector<DescriptorList> lists) {
  if (lists.empty()) co_return Status::ok();
  std::size_t route = inner_.size();
  for (const DescriptorList& l : lists) {
    auto it = route_.find(l.peer);
    if (it == route_.end()) co_return Status{StatusCode::invalid, "no transport reaches peer " + std::to_string(l.peer)};
    if (route != inner_.size() && it->second != route)
      co_return Status{StatusCode::invalid, "one group spans two transports (" + std::string(inner_[route]->name()) + ", " +
                                                std::string(inner_[it->second]->name()) + ")"};
    route = it->second;
  }
  co_return co_await inner_[route]->post_group(std::move(lists));
}

}  // namespace nereus
