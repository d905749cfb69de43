#pragma once
// Work split over a few threads of the caller's (internal to src/runtime): fills, checks
// and the quantize pass of gigabytes.
#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace nereus::detail {

/// Runs work(k) for k = 0 here and 1..threads-1 on threads of their own, then rethrows
/// the first exception once every thread has ended (a device without memory, a failed
/// upload): an exception must neither leave a thread joinable nor escape one.
template <class F>
void on_threads(unsigned threads, F work) {
  std::mutex m;
  std::exception_ptr first;
  auto guarded = [&](unsigned k) {
    try {
      work(k);
    } catch (...) {
      const std::lock_guard lock(m);
      if (!first) first = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  try {
    for (unsigned k = 1; k < std::max(1u, threads); ++k) pool.emplace_back(guarded, k);
  } catch (...) {  // no thread to be had: the ones started still run to their end
    for (auto& t : pool) t.join();
    throw;
  }
  guarded(0);
  for (auto& t : pool) t.join();
  if (first) std::rethrow_exception(first);
}


}  // namespace nereus::detail
