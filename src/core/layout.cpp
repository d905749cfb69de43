#include "nereus/core/layout.hpp"

#include <charconv>
#include <set>

#include "nereus/base/error.hpp"

namespace nereus {

std::string_view to_string(Packing p) { return p == Packing::hf ? "hf" : p == Packing::fused ? "fused" : "megatron"; }

Range Layout::stage_layers(int s, std::int64_t L) const {
  if (partition.empty()) return part(L, pp, s);
  std::int64_t lo = 0;
  for (int i = 0; i < s; ++i) lo += partition[i];
  return {lo, lo + partition[s]};
}

int Layout::stage_of(std::int64_t layer, std::int64_t L) const {
  if (partition.empty()) {
    // Largest s with floor(s·L/pp) <= layer.
    int s = static_cast<int>(((layer + 1) * pp - 1) / L);
    while (s > 0 && part(L, pp, s).lo > layer) --s;
    while (s + 1 < pp && part(L, pp, s + 1).lo <= layer) ++s;
    return s;
  }
  std::int64_t hi = 0;
  for (int s = 0; s < pp; ++s) {
    hi += partition[s];
    if (layer < hi) return s;
  }
  return pp - 1;
}

bool valid_tp(const ModelConfig& m, int tp) {
  return tp >= 1 && m.heads % tp == 0 && (m.kv_heads % tp == 0 || tp % m.kv_heads == 0);
}

std::string broken_expert_rule(const ModelConfig& m, const Layout& l) {
  if (l.ep < 1) return "ep must be at least 1";
  if (l.etp < 0) return "etp must be at least 1";
  if (!m.moe())
    return l.ep == 1 ? "" : "ep=" + std::to_string(l.ep) + " needs a mixture-of-experts model (this model is dense, so ep must be 1)";
  const int k = l.expert_tp();
  if (l.tp * l.ep > 4096)  // positions of a stage are 12-bit codes in the planner's tables
    return "tp·ep = " + std::to_string(l.tp * l.ep) + " exceeds 4096 GPUs per pipeline stage";
  if (l.tp * l.ep % k != 0) return "etp=" + std::to_string(k) + " does not divide tp·ep = " + std::to_string(l.tp * l.ep);
  if (l.expert_groups() > m.experts)
    return "tp·ep/etp = " + std::to_string(l.expert_groups()) + " expert groups exceed num_experts=" + std::to_string(m.experts);
  if (k > m.expert_intermediate)
    return "etp=" + std::to_string(k) + " exceeds moe_intermediate_size=" + std::to_string(m.expert_intermediate);
  return "";
}

std::string broken_fsdp_rule(const ModelConfig& m, const Layout& l) {
  if (l.fsdp < 1) return "fsdp must be at least 1";
  if (l.fsdp == 1) return "";
  if (m.moe())
    return "fsdp=" + std::to_string(l.fsdp) + " on a mixture-of-experts model" + (l.ep > 1 ? " with ep=" + std::to_string(l.ep) : "") +
           ": FSDP units are for dense models for now (sharding.md, FSDP)";
  if (l.fp8)
    return "fsdp=" + std::to_string(l.fsdp) +
           " with dtype=fp8: FP8 units are for generation and inference, FSDP shards training state; a unit has one or the other";
  if (static_cast<std::int64_t>(l.tp) * l.fsdp > 4096)  // positions of a stage are 12-bit codes in the planner's tables
    return "tp·fsdp = " + std::to_string(static_cast<std::int64_t>(l.tp) * l.fsdp) + " exceeds 4096 GPUs per pipeline stage";
  return "";
}

void validate_layout(const ModelConfig& m, const Layout& l) {
  const std::string spec = to_string(l);
  if (l.tp < 1) throw Error("layout " + spec + ": tp must be at least 1");
  if (l.pp < 1) throw Error("layout " + spec + ": pp must be at least 1");
  if (m.heads % l.tp != 0)
    throw Error("layout " + spec + ": tp=" + std::to_string(l.tp) +
                " does not divide num_attention_heads=" + std::to_string(m.heads));
  if (m.kv_heads % l.tp != 0 && l.tp % m.kv_heads != 0)
    throw Error("layout " + spec + ": tp=" + std::to_string(l.tp) +
                " neither divides nor is a multiple of num_key_value_heads=" +
                std::to_string(m.kv_heads));
  if (l.pp > m.layers)
    throw Error("layout " + spec + ": pp=" + std::to_string(l.pp) + " exceeds num_hidden_layers=" +
                std::to_string(m.layers));
  if (const std::string why = broken_expert_rule(m, l); !why.empty()) throw Error("layout " + spec + ": " + why);
  if (const std::string why = broken_fsdp_rule(m, l); !why.empty()) throw Error("layout " + spec + ": " + why);
  if (l.packing == Packing::megatron) {
    // Megatron-Core interleaves each query group's q, k and v rows in linear_qkv: a rank
    // must hold whole groups (sharding.md, "Megatron packing").
    if (l.tp > m.kv_heads)
      throw Error("layout " + spec + ": packing=megatron with tp=" + std::to_string(l.tp) + " > num_key_value_heads=" +
                  std::to_string(m.kv_heads) + " (Megatron-Core requires the query groups to be a multiple of tp)");
    if (m.mla()) throw Error("layout " + spec + ": packing=megatron on an MLA model (Megatron's MLA buffers are not laid out here)");
    if (l.fsdp > 1) throw Error("layout " + spec + ": packing=megatron with fsdp: Megatron-Core's buffers are TP/PP/EP shards");
    if (l.fp8) throw Error("layout " + spec + ": packing=megatron with dtype=fp8: Megatron buffers are a trainer's, in its dtype");
  }
  if (!l.partition.empty()) {
    if (static_cast<int>(l.partition.size()) != l.pp)
      throw Error("layout " + spec + ": partition has " + std::to_string(l.partition.size()) +
                  " stages but pp=" + std::to_string(l.pp));
    std::int64_t sum = 0;
    for (int n : l.partition) {
      if (n < 1) throw Error("layout " + spec + ": partition stage with " + std::to_string(n) + " layers");
      sum += n;
    }
    if (sum != m.layers)
      throw Error("layout " + spec + ": partition sums to " + std::to_string(sum) +
                  " layers but the model has " + std::to_string(m.layers));
  }
}

namespace {

int parse_int(std::string_view key, std::string_view v) {
  int n = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || p != v.data() + v.size() || v.empty())
    throw Error("layout spec: " + std::string(key) + "=" + std::string(v) + " is not an integer");
  return n;
}

int parse_positive(std::string_view key, std::string_view v) {
  const int n = parse_int(key, v);
  if (n < 1) throw Error("layout spec: " + std::string(key) + "=" + std::string(v) + " must be at least 1");
  return n;
}

std::vector<DeviceId> parse_devices(std::string_view v) {
  if (v.empty()) throw Error("layout spec: devices= is empty");
  std::vector<DeviceId> out;
  std::size_t start = 0;
  while (start <= v.size()) {
    const std::size_t end = std::min(v.find(':', start), v.size());
    const std::string_view item = v.substr(start, end - start);
    auto id = [&](std::string_view text) {
      int n = 0;
      auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
      if (ec != std::errc() || p != text.data() + text.size() || text.empty())
        throw Error("layout spec: devices=" + std::string(v) + ": '" + std::string(text) + "' is not a device id");
      return n;
    };
    if (const auto dash = item.find('-'); dash != std::string_view::npos && dash > 0) {
      const int a = id(item.substr(0, dash));
      const int b = id(item.substr(dash + 1));
      if (b < a) throw Error("layout spec: devices range '" + std::string(item) + "' is descending");
      if (b - a > (1 << 20)) throw Error("layout spec: devices range '" + std::string(item) + "' is too long");
      for (int d = a; d <= b; ++d) out.push_back(d);
    } else {
      const int d = id(item);
      if (d < 0) throw Error("layout spec: device id " + std::to_string(d) + " in devices=" + std::string(v) + " is negative");
      out.push_back(d);
    }
    start = end + 1;
  }
  return out;
}

}  // namespace

CollectionSpec parse_collection_spec(std::string_view spec) {
  CollectionSpec out;
  std::set<std::string> seen;
  bool have_devices = false;
  std::size_t start = 0;
  if (spec.empty()) throw Error("layout spec is empty (expected tp=T,pp=P,dp=D)");
  while (start <= spec.size()) {
    const std::size_t end = std::min(spec.find(',', start), spec.size());
    const std::string_view item = spec.substr(start, end - start);
    start = end + 1;
    const auto eq = item.find('=');
    if (eq == std::string_view::npos)
      throw Error("layout spec: '" + std::string(item) + "' is not key=value");
    const std::string key(item.substr(0, eq));
    const std::string_view value = item.substr(eq + 1);
    if (!seen.insert(key).second) throw Error("layout spec: key '" + key + "' given twice");
    if (key == "tp") out.layout.tp = parse_positive(key, value);
    else if (key == "pp") out.layout.pp = parse_positive(key, value);
    else if (key == "dp") out.dp = parse_positive(key, value);
    else if (key == "ep") out.layout.ep = parse_positive(key, value);
    else if (key == "etp") out.layout.etp = parse_positive(key, value);
    else if (key == "fsdp") out.layout.fsdp = parse_positive(key, value);
    else if (key == "devices") { out.devices = parse_devices(value); have_devices = true; }
    else if (key == "partition") {
      std::size_t s = 0;
      while (s <= value.size()) {
        const std::size_t e = std::min(value.find('/', s), value.size());
        out.layout.partition.push_back(parse_positive("partition", value.substr(s, e - s)));
        s = e + 1;
      }
    } else if (key == "packing") {
      if (value == "hf") out.layout.packing = Packing::hf;
      else if (value == "fused") out.layout.packing = Packing::fused;
      else if (value == "megatron") out.layout.packing = Packing::megatron;
      else throw Error("layout spec: packing=" + std::string(value) + " is not hf, fused or megatron");
    } else if (key == "dtype") {
      if (value != "fp8")
        throw Error("layout spec: dtype=" + std::string(value) +
                    " is not fp8 (the only dtype a layout may choose; without it a unit holds the config's)");
      out.layout.fp8 = true;
    } else {
      throw Error("layout spec: unknown key '" + key + "' (known: tp, pp, ep, etp, fsdp, dp, devices, partition, packing, dtype)");
    }
  }
  if (!out.layout.partition.empty() && static_cast<int>(out.layout.partition.size()) != out.layout.pp)
    throw Error("layout spec: partition= has " + std::to_string(out.layout.partition.size()) +
                " stages but pp=" + std::to_string(out.layout.pp));
  // Each degree is at most 2^31 - 1, so checking each product before the next keeps every
  // product in range (found by the layout fuzzer).
  constexpr std::int64_t kMaxDevices = 1 << 22;
  const std::string degrees = std::string("tp·pp") + (out.layout.ep == 1 ? "" : "·ep") + (out.layout.fsdp == 1 ? "" : "·fsdp") + "·dp";
  std::int64_t unit = static_cast<std::int64_t>(out.layout.tp) * out.layout.pp;
  if (unit <= kMaxDevices) unit *= out.layout.ep;
  if (unit <= kMaxDevices) unit *= out.layout.fsdp;
  const std::int64_t need = unit > kMaxDevices ? unit : unit * out.dp;
  if (need > kMaxDevices)
    throw Error("layout spec: " + degrees + " = " + std::to_string(unit) + "·" + std::to_string(out.dp) + " devices is too many");
  if (have_devices) {
    if (static_cast<std::int64_t>(out.devices.size()) != need)
      throw Error("layout spec: devices= lists " + std::to_string(out.devices.size()) +
                  " ids but " + degrees + " = " + std::to_string(need));
    std::set<DeviceId> uniq;
    for (DeviceId d : out.devices)
      if (!uniq.insert(d).second)
        throw Error("layout spec: device " + std::to_string(d) + " appears twice in devices=");
  } else {
    for (std::int64_t i = 0; i < need; ++i) out.devices.push_back(static_cast<DeviceId>(i));
  }
  return out;
}

std::string device_list_string(const std::vector<DeviceId>& d) {
  std::string s;
  for (std::size_t i = 0; i < d.size();) {
    std::size_t j = i;
    while (j + 1 < d.size() && d[j + 1] == d[j] + 1) ++j;
    if (!s.empty()) s += ":";
    s += std::to_string(d[i]);
    if (j > i + 1) s += "-" + std::to_string(d[j]);
    else if (j == i + 1) s += ":" + std::to_string(d[j]);
    i = j + 1;
  }
  return s;
}

std::string to_string(const Layout& l) {
  std::string s = "tp=" + std::to_string(l.tp) + ",pp=" + std::to_string(l.pp);
  if (l.ep != 1) s += ",ep=" + std::to_string(l.ep);
  if (l.etp > 0 && l.etp != l.tp) s += ",etp=" + std::to_string(l.etp);
  if (l.fsdp != 1) s += ",fsdp=" + std::to_string(l.fsdp);
  if (!l.partition.empty()) {
    s += ",partition=";
    for (std::size_t i = 0; i < l.partition.size(); ++i)
      s += (i ? "/" : "") + std::to_string(l.partition[i]);
  }
  if (l.packing != Packing::hf) s += ",packing=" + std::string(to_string(l.packing));
  if (l.fp8) s += ",dtype=fp8";
  return s;
}

std::string to_string(const CollectionSpec& c) {
  return to_string(c.layout) + ",dp=" + std::to_string(c.dp) + ",devices=" + device_list_string(c.devices);
}

}  // namespace nereus
