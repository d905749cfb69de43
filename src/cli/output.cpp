#include "output.hpp"

#include <fmt/format.h>

#include "nereus/core/packing.hpp"

namespace nereus::cli {

std::string human_bytes(std::uint64_t b) {
  const double v = static_cast<double>(b);
  if (v >= 1e12) return fmt::format("{:.2f} TB", v / 1e12);
  if (v >= 1e9) return fmt::format("{:.2f} GB", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f} MB", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.2f} kB", v / 1e3);
  return fmt::format("{} B", b);
}

namespace {
nlohmann::json strides_json(const Box& box, const LocalView& v) {
  auto a = nlohmann::json::array();
  for (int d = 0; d < box.rank; ++d) a.push_back(v.strides[d]);
  return a;
}
}  // namespace

nlohmann::json transfer_json(const ModelSpec& m, const Transfer& t) {
  auto box = nlohmann::json::array();
  for (int d = 0; d < t.box.rank; ++d) box.push_back({t.box.dims[d].lo, t.box.dims[d].hi});
  return {
      {"src", t.src},
      {"dst", t.dst},
      {"tensor", m.tensor(t.tensor).name},
      {"slot", std::string(to_string(t.slot))},
      {"box", box},
      {"bytes", t.bytes},
      {"local", t.local()},
      {"keep", t.keep},
      {"source", t.source},
      {"src_buffer", buffer_name(m, t.src_view.buffer, t.src_view.packing)},
      {"src_offset", t.src_view.view.offset},
      {"src_strides", strides_json(t.box, t.src_view.view)},
      {"dst_buffer", buffer_name(m, t.dst_view.buffer, t.dst_view.packing)},
      {"dst_offset", t.dst_view.view.offset},
      {"dst_strides", strides_json(t.box, t.dst_view.view)},
  };
}

}  // namespace nereus::cli
