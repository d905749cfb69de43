#include "nereus/base/device.hpp"

#ifdef NEREUS_HAVE_CUDA
#include "cuda_device.hpp"
#endif

#include <fstream>
#include <string>

#include <sys/mman.h>

#include <charconv>
#include <cmath>
#include <cstring>
#include <utility>

#include "nereus/base/error.hpp"

namespace nereus {

namespace {
constexpr std::size_t kAlign = 256;
std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (owner_) owner_->release(data_, size_);
    owner_ = std::exchange(o.owner_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (owner_) owner_->release(data_, size_);
}

Device::Device(DeviceId id, std::byte* arena, std::size_t capacity)
    : id_(id), arena_(arena), capacity_(capacity) {
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

Device::~Device() = default;

void Device::upload(std::byte* dst, const std::byte* host, std::size_t n) { std::memcpy(dst, host, n); }
void Device::download(std::byte* host, const std::byte* src, std::size_t n) const { std::memcpy(host, src, n); }

DeviceBuffer Device::allocate(std::size_t n, std::string_view what) {
  const std::size_t want = round_up(std::max<std::size_t>(n, 1));
  std::lock_guard lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    const std::size_t off = it->first;
    const std::size_t rest = it->second - want;
    free_.erase(it);
    if (rest) free_.emplace(off + want, rest);
    used_ += want;
    peak_ = std::max(peak_, used_);
    DeviceBuffer b;
    b.owner_ = this;
    b.data_ = arena_ + off;
    b.size_ = n;
    return b;
  }
  std::size_t largest = 0;
  for (const auto& [o, s] : free_) largest = std::max(largest, s);
  throw Error("device " + std::to_string(id_) + ": cannot allocate " + std::to_string(n) + " bytes for " +
              std::string(what) + " (capacity " + std::to_string(capacity_) + ", in use " + std::to_string(used_) +
              ", largest free block " + std::to_string(largest) + ")");
}

void Device::release(std::byte* p, std::size_t n) {
  const std::size_t size = round_up(std::max<std::size_t>(n, 1));
#ifdef NEREUS_POISON_FREED
  // Debug and sanitizer builds: a view kept past its unit reads this pattern, not whatever
  // the arena holds next (0xDBDB as bf16 is a large negative number, as f32 too).
  if (kind() == MemoryKind::host) std::memset(p, 0xDB, n);
#endif
  std::size_t off = static_cast<std::size_t>(p - arena_);
  std::size_t len = size;
  std::lock_guard lock(mu_);
  used_ -= size;
  auto next = free_.lower_bound(off);
  if (next != free_.end() && off + len == next->first) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(off, len);
}

std::size_t Device::used() const {
  std::lock_guard lock(mu_);
  return used_;
}

std::size_t Device::peak() const {
  std::lock_guard lock(mu_);
  return peak_;
}

namespace {

std::byte* reserve(DeviceId id, std::size_t capacity) {
  if (capacity == 0) return nullptr;
  void* p = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw Error("device " + std::to_string(id) + ": cannot reserve " + std::to_string(capacity) + " bytes of host memory");
  return static_cast<std::byte*>(p);
}

class HostEvent final : public DeviceEvent {
 public:
  bool ready() const override { return true; }
};

class HostQueue final : public DeviceQueue {
 public:
  std::unique_ptr<DeviceEvent> record() override { return std::make_unique<HostEvent>(); }
  void copy(std::byte* dst, const std::byte* src, std::size_t n) override { std::memcpy(dst, src, n); }
  bool idle() const override { return true; }
  void synchronize() override {}
};

/// A host-memory device: its arena is reserved address space, committed on first touch,
/// or what an ArenaSource gave.
class HostDevice final : public Device {
 public:
  HostDevice(DeviceId id, std::size_t capacity, ArenaSource* source)
      : Device(id, source && capacity ? source->allocate_arena(id, capacity) : reserve(id, capacity), capacity), source_(source) {}
  ~HostDevice() override {
    if (!arena()) return;
    if (source_) source_->release_arena(arena(), capacity());
    else ::munmap(arena(), capacity());
  }
  MemoryKind kind() const override { return MemoryKind::host; }
  std::unique_ptr<DeviceQueue> make_queue() override { return std::make_unique<HostQueue>(); }

 private:
  ArenaSource* source_;
};

}  // namespace

MemoryKind DeviceBuffer::kind() const { return owner_ ? owner_->kind() : borrowed_kind_; }

std::string_view to_string(MemoryKind k) { return k == MemoryKind::host ? "host" : "cuda"; }

std::uint64_t host_memory_available() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  std::uint64_t kib = 0;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

namespace {

void copy_kind(MemoryKind kind, std::byte* dst, const std::byte* src, std::size_t n) {
  if (kind == MemoryKind::host) {
    if (n) std::memcpy(dst, src, n);
    return;
  }
#ifdef NEREUS_HAVE_CUDA
  detail::cuda_copy(dst, src, n);
#else
  (void)dst, (void)src, (void)n;
  throw Error("no " + std::string(to_string(kind)) + " backend is built into this library");
#endif
}

}  // namespace

void copy_from_host(MemoryKind kind, std::byte* dst, const std::byte* host, std::size_t n) { copy_kind(kind, dst, host, n); }
void copy_to_host(MemoryKind kind, std::byte* host, const std::byte* src, std::size_t n) { copy_kind(kind, host, src, n); }

std::unique_ptr<Device> make_device(const DeviceSpec& spec) {
  switch (spec.kind) {
    case MemoryKind::host:
      return std::make_unique<HostDevice>(spec.id, spec.capacity, spec.arena_source);
    case MemoryKind::cuda:
#ifdef NEREUS_HAVE_CUDA
      return detail::make_cuda_device(spec);
#else
      break;
#endif
  }
  throw Error("device " + std::to_string(spec.id) + ": no " + std::string(to_string(spec.kind)) +
              " backend is built into this library");
}

}  // namespace nereus
