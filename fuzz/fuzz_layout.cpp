// Layout specs ("tp=2,pp=2,dp=1,partition=3/2,packing=fused,devices=0-3") and capacities.
#include "fuzz_target.hpp"
#include "nereus/core/bytes.hpp"
#include "nereus/core/layout.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto text = fuzz::text_of(data, size);
  fuzz::tolerate_errors([&] { nereus::parse_collection_spec(text); });
  fuzz::tolerate_errors([&] { nereus::parse_capacity(text); });
  return 0;
}
