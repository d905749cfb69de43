#include "output.hpp"

#include <fmt/format.h>

#include "nereus/core/packing.hpp"

namespace nereus::cli {


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
      {"fp8", t.fp8 == Fp8Move::none ? "none" : t.fp8 == Fp8Move::quantize ? "quantize" : "copy"},
      {"source", t.source},
      {"src_buffer", buffer_name(m, t.src_view.buffer, t.src_view.packing, t.src_view.expert_groups)},
      {"src_offset", t.src_view.view.offset},
      {"src_strides", strides_json(t.box, t.src_view.view)},
      {"dst_buffer", buffer_name(m, t.dst_view.buffer, t.dst_view.packing, t.dst_view.expert_groups)},
      {"dst_offset", t.dst_view.view.offset},
      {"dst_strides", strides_json(t.box, t.dst_view.view)},
  };
}

}  // namespace nereus::cli
