// Drift traces (JSON Lines).
#include "fuzz_target.hpp"
#include "nereus/sim/trace.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::tolerate_errors([&] { nereus::parse_trace(fuzz::text_of(data, size), "fuzz"); });
  return 0;
}
