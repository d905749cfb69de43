// Cluster files.
#include "fuzz_target.hpp"
#include "nereus/core/cluster.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::tolerate_errors([&] { nereus::parse_cluster(fuzz::text_of(data, size), "fuzz"); });
  return 0;
}
