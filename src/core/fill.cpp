#include "nereus/core/fill.hpp"

#include <string>

namespace nereus {

std::uint64_t fill_seed(std::string_view tensor, std::string_view slot) {
  std::string key(tensor);
  key += '/';
  key += slot;
  return fnv1a64(key);
}

}  // namespace nereus
