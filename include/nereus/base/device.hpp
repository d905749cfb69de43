#pragma once
// Devices: where state lives. A device owns one memory arena with a capacity and tracks
// current and peak use; queues and events order asynchronous work on it. Backends live
// behind make_device(): today host memory (the stand-in for a GPU's memory on any
// machine) and, when built with CUDA, GPU memory (one cudaMalloc arena per device, CUDA
// streams and events); nothing outside this layer names a backend's class.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "nereus/base/device_id.hpp"

namespace nereus {

/// Kind of memory a device allocates (transports declare which they can move).
enum class MemoryKind : std::uint8_t { host, cuda };

std::string_view to_string(MemoryKind k);

class Device;

/// One allocation in a device's arena; frees itself.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  /// Memory no device owns (a framework's own tensor): used like an allocation, never
  /// freed here; its owner keeps it alive while the buffer exists.
  static DeviceBuffer borrow(std::byte* data, std::size_t size, MemoryKind kind = MemoryKind::host) {
    DeviceBuffer b;
    b.data_ = data;
    b.size_ = size;
    b.borrowed_kind_ = kind;
    return b;
  }

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool empty() const { return data_ == nullptr; }
  /// Whether the memory is borrowed (no device arena holds it).
  bool borrowed() const { return owner_ == nullptr && data_ != nullptr; }
  /// The memory it lives in: its device's, or what the lender said.
  MemoryKind kind() const;

 private:
  friend class Device;
  Device* owner_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  MemoryKind borrowed_kind_ = MemoryKind::host;
};

/// A point in a queue's work (a CUDA event): ready once everything enqueued before it ran.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  virtual bool ready() const = 0;
};

/// An ordered asynchronous work queue of a device (a CUDA stream on CUDA devices); host
/// queues run work at once.
class DeviceQueue {
 public:
  virtual ~DeviceQueue() = default;
  /// Marks the current end of the queue's work.
  virtual std::unique_ptr<DeviceEvent> record() = 0;
  /// Enqueues a copy of n bytes inside this device's memory.
  virtual void copy(std::byte* dst, const std::byte* src, std::size_t n) = 0;
  /// True once everything enqueued so far has run.
  virtual bool idle() const = 0;
  /// Blocks until idle (control path only).
  virtual void synchronize() = 0;
};

/// A GPU or its stand-in: an arena of `capacity` bytes, an allocator over it, queues.
class Device {
 public:
  virtual ~Device();
  DeviceId id() const { return id_; }
  virtual MemoryKind kind() const = 0;
  /// The CUDA device its arena is on (DeviceSpec::gpu); 0 for host memory.
  virtual int gpu() const { return 0; }
  /// Allocates n bytes (aligned to 256); throws Error naming the device, the request and
  /// what is left when the arena cannot hold it.
  DeviceBuffer allocate(std::size_t n, std::string_view what);
  virtual std::unique_ptr<DeviceQueue> make_queue() = 0;
  /// An event recorded on a stream of someone else's (a framework's cudaStream_t on this
  /// device's GPU, 0 for its legacy default stream): ready once the work enqueued there
  /// before it has completed. Null on host memory, where work is done when its call
  /// returns. Never throws: where recording fails, it waits for the stream instead.
  virtual std::unique_ptr<DeviceEvent> record_external(std::uintptr_t) { return nullptr; }
  /// Copies n bytes of host memory into this device's memory (upload) or out of it
  /// (download), blocking: the control path of fills, checks and dumps, never a
  /// transition. Host devices memcpy; CUDA devices cudaMemcpy. Throws Error naming the
  /// device.
  virtual void upload(std::byte* dst, const std::byte* host, std::size_t n);
  virtual void download(std::byte* host, const std::byte* src, std::size_t n) const;

  std::size_t capacity() const { return capacity_; }
  std::size_t used() const;
  std::size_t peak() const;
  /// The whole arena: transports register it once.
  std::byte* arena() const { return arena_; }

 protected:
  Device(DeviceId id, std::byte* arena, std::size_t capacity);

 private:
  friend class DeviceBuffer;
  void release(std::byte* p, std::size_t n);

  DeviceId id_;
  std::byte* arena_;
  std::size_t capacity_;
  mutable std::mutex mu_;
  std::map<std::size_t, std::size_t> free_;  // offset → size, coalesced
  std::size_t used_ = 0;
  std::size_t peak_ = 0;
};

/// Where a host device's arena comes from when not from the process's own anonymous
/// memory: a transport whose peers on the node can map memory it allocated, so that their
/// gets become one memcpy (UCX's shared-memory allocation; see transport/ucx.hpp). The
/// source keeps what it gave until it is destroyed itself, so it must outlive the devices.
class ArenaSource {
 public:
  virtual ~ArenaSource() = default;
  /// `bytes` for device `id`'s arena; throws Error naming the device when it cannot.
  virtual std::byte* allocate_arena(DeviceId id, std::size_t bytes) = 0;
  /// The device is gone (the memory may be reused once no request can touch it).
  virtual void release_arena(std::byte* arena, std::size_t bytes) = 0;
};

/// What make_device() creates.
/// Blocking copies between host memory and memory of `kind` anywhere in this process (a
/// CUDA pointer of any GPU): the control path of fills, checks and checkpoints, for memory
/// no Device object is at hand for (a unit's buffers). Throws Error when `kind` is not
/// built in or the copy fails.
void copy_from_host(MemoryKind kind, std::byte* dst, const std::byte* host, std::size_t n);
void copy_to_host(MemoryKind kind, std::byte* host, const std::byte* src, std::size_t n);

struct DeviceSpec {
  MemoryKind kind = MemoryKind::host;
  DeviceId id = 0;
  std::size_t capacity = 0;  ///< bytes of the arena
  ArenaSource* arena_source = nullptr;  ///< host: where the arena comes from (null: anonymous memory)
  int gpu = 0;  ///< cuda: the CUDA device the arena is on (several logical devices may share one)
};

/// Creates a device of `spec.kind`. Host devices reserve their arena as address space,
/// committed on first touch; CUDA devices (when built with CUDA) allocate theirs with
/// cudaMalloc on `spec.gpu`. Throws Error naming the kind when its backend is not built
/// into this library, and naming the device when its GPU is absent or full.
std::unique_ptr<Device> make_device(const DeviceSpec& spec);

/// Host memory the kernel can still give without swapping (MemAvailable of /proc/meminfo),
/// in bytes; 0 when unknown.
std::uint64_t host_memory_available();

}  // namespace nereus
