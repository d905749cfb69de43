// Model configs (Hugging Face config.json).
#include "fuzz_target.hpp"
#include "nereus/core/model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::tolerate_errors([&] { nereus::parse_model_config(fuzz::text_of(data, size), "fuzz"); });
  return 0;
}
