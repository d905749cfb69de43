#pragma once
// An allocator for large tables written once, front to back, while planning (the reshard
// planner's pieces: 7 MB for Kimi-K2's 256 → 128 GPU sync). Each first touch of a fresh
// 4 KiB page is a page fault, and on a paravirtualised VM a fault costs microseconds: in
// a cold plan of that case they were more than a third of plan_ms. Blocks of 2 MiB or
// more are therefore 2 MiB-aligned and advised as transparent huge pages (one fault per
// 2 MiB where the kernel's THP mode is `madvise` or `always`); smaller ones come from
// malloc as usual.
#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>

namespace nereus {

template <class T>
struct HugePageAllocator {
  using value_type = T;
  static constexpr std::size_t kHuge = std::size_t{2} << 20;

  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    void* p = nullptr;
    if (bytes >= kHuge) {
      const std::size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
      p = std::aligned_alloc(kHuge, rounded);
      if (p) (void)madvise(p, rounded, MADV_HUGEPAGE);  // advice only: without THP it is plain memory
    } else {
      p = std::malloc(bytes ? bytes : 1);
    }
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { std::free(p); }

  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept { return true; }
};

}  // namespace nereus
