#include "nereus/core/safetensors.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <unordered_map>

#include "json_fields.hpp"
#include "nereus/core/presets.hpp"

namespace nereus {

using detail::json;

namespace {

constexpr std::uint64_t kMaxHeader = 100ull << 20;  // the format's own limit

std::optional<std::uint64_t> dtype_width(const std::string& d) {
  static const std::map<std::string, std::uint64_t> widths = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
      {"I8", 1},  {"U8", 1},  {"U16", 2}, {"U32", 4},  {"U64", 8}, {"BOOL", 1},
      {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = widths.find(d);
  if (it == widths.end()) return std::nullopt;
  return it->second;
}

std::string expected_dtype(DType t) { return safetensors_dtype(t); }

float bf16_to_f32(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

std::uint16_t f32_to_bf16(float f) {
  const auto u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  const int exp = (h >> 10) & 0x1f;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {  // zero or subnormal: mant · 2^-24
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | (static_cast<std::uint32_t>(exp + 112) << 23) | (mant << 13));
}

std::uint16_t f32_to_f16(float f) {
  const auto u = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00;               // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00;              // overflows to infinity after rounding
  if (a < 0x38800000u) {                                   // subnormal or zero in f16
    const float v = std::bit_cast<float>(a) * 0x1p24f;     // in units of 2^-24; exact in f32
    return sign | static_cast<std::uint16_t>(std::nearbyint(v));  // default rounding: to nearest even
  }
  const std::uint32_t r = a + 0xfffu + ((a >> 13) & 1u);  // round the 13 dropped bits to nearest even
  return sign | static_cast<std::uint16_t>((r - (112u << 23)) >> 13);
}

float load_element(DType t, const std::byte* p) {
  if (t == DType::f32) return std::bit_cast<float>(std::array<std::byte, 4>{p[0], p[1], p[2], p[3]});
  const auto h = static_cast<std::uint16_t>(static_cast<unsigned>(p[0]) | (static_cast<unsigned>(p[1]) << 8));
  return t == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

void store_element(DType t, float v, std::byte* p) {
  if (t == DType::f32) {
    const auto b = std::bit_cast<std::array<std::byte, 4>>(v);
    std::memcpy(p, b.data(), 4);
    return;
  }
  const std::uint16_t h = t == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
  p[0] = static_cast<std::byte>(h & 0xff);
  p[1] = static_cast<std::byte>(h >> 8);
}

}  // namespace

std::string safetensors_dtype(DType t) {
  switch (t) {
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::f32: return "F32";
    case DType::e4m3: return "F8_E4M3";
  }
  return "?";
}

std::optional<DType> parse_safetensors_dtype(const std::string& name) {
  if (name == "BF16") return DType::bf16;
  if (name == "F16") return DType::f16;
  if (name == "F32") return DType::f32;
  return std::nullopt;
}

void convert_elements(DType from, const std::byte* in, DType to, std::byte* out, std::size_t n) {
  if (from == to) {
    std::memcpy(out, in, n * width(from));
    return;
  }
  for (std::size_t i = 0; i < n; ++i) store_element(to, load_element(from, in + i * width(from)), out + i * width(to));
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsOut>& tensors) {
  json header = json::object();
  std::uint64_t offset = 0;
  std::vector<std::uint64_t> sizes;
  for (const auto& t : tensors) {
    std::uint64_t n = width(t.dtype);
    for (std::int64_t d : t.shape) n *= static_cast<std::uint64_t>(d);
    header[t.name] = {{"dtype", safetensors_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    sizes.push_back(n);
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the format pads the header to 8 bytes
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) throw Error("cannot create '" + tmp + "'");
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((text.size() >> (8 * i)) & 0xff);
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<std::byte> buf;
  try {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      buf.assign(sizes[i], std::byte{0});
      tensors[i].write(buf.data(), buf.size());
      out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    }
    out.close();
    if (!out) throw Error("cannot write '" + tmp + "' (disk full?)");
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
}

std::vector<CheckpointTensor> read_safetensors_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open '" + path + "'");
  std::error_code ec;
  const std::uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec) throw Error("cannot stat '" + path + "'");
  if (file_size < 8) throw Error(path + ": too short for a safetensors header (" + std::to_string(file_size) + " bytes)");
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > kMaxHeader || n > file_size - 8)
    throw Error(path + ": header length " + std::to_string(n) + " overruns the file (" +
                std::to_string(file_size) + " bytes)");
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  if (!in) throw Error(path + ": cannot read the header");
  const std::uint64_t data_size = file_size - 8 - n;
  const json j = detail::parse_json(header, path + " header");
  if (!j.is_object()) throw Error(path + ": header is not a JSON object");
  std::vector<CheckpointTensor> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string where = path + ": tensor '" + it.key() + "'";
    const json& e = it.value();
    CheckpointTensor t{it.key(), detail::string_field(e, "dtype", where), std::vector<std::int64_t>{}, path, 0};
    const auto width = dtype_width(*t.dtype);
    if (!width) throw Error(where + ": unknown dtype '" + *t.dtype + "'");
    const json& shape = detail::field(e, "shape", where);
    if (!shape.is_array()) throw Error(where + ": 'shape' is not an array");
    std::uint64_t elements = 1;
    for (const json& d : shape) {
      const std::int64_t v = detail::integer(d, "shape", where, true);
      t.shape->push_back(v);
      if (v != 0 && elements > (1ull << 62) / static_cast<std::uint64_t>(v))
        throw Error(where + ": shape is too large");
      elements *= static_cast<std::uint64_t>(v);
    }
    const json& off = detail::field(e, "data_offsets", where);
    if (!off.is_array() || off.size() != 2) throw Error(where + ": 'data_offsets' is not [begin, end]");
    const auto b = static_cast<std::uint64_t>(detail::integer(off[0], "data_offsets", where, true));
    const auto en = static_cast<std::uint64_t>(detail::integer(off[1], "data_offsets", where, true));
    if (en < b) throw Error(where + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(en) + "] end before begin");
    if (en > data_size)
      throw Error(where + ": data_offsets end " + std::to_string(en) + " overruns the file's " +
                  std::to_string(data_size) + " data bytes");
    if (en - b != elements * *width)
      throw Error(where + ": data_offsets span " + std::to_string(en - b) + " bytes but shape and dtype need " +
                  std::to_string(elements * *width));
    t.offset = 8 + n + b;
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<CheckpointTensor> read_checkpoint_tensors(const std::string& path) {
  if (path.size() < 5 || path.substr(path.size() - 5) != ".json") return read_safetensors_header(path);
  const json j = detail::parse_json(read_text_file(path), path);
  const json& map = detail::field(j, "weight_map", path);
  if (!map.is_object()) throw Error(path + ": 'weight_map' is not an object");
  const auto dir = std::filesystem::path(path).parent_path();
  std::map<std::string, std::unordered_map<std::string, CheckpointTensor>> shards;
  std::vector<CheckpointTensor> out;
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (!it.value().is_string()) throw Error(path + ": weight_map entry '" + it.key() + "' is not a file name");
    const std::string file = (dir / it.value().get<std::string>()).string();
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec)) {
      out.push_back({it.key(), std::nullopt, std::nullopt, file});
      continue;
    }
    auto [sit, fresh] = shards.try_emplace(file);
    if (fresh)
      for (auto& t : read_safetensors_header(file)) sit->second.emplace(t.name, t);
    auto t = sit->second.find(it.key());
    if (t == sit->second.end())
      throw Error(path + ": weight_map puts '" + it.key() + "' in " + file + ", whose header lacks it");
    out.push_back(t->second);
  }
  return out;
}

void check_checkpoint(const ModelSpec& m, const std::vector<CheckpointTensor>& tensors) {
  std::unordered_map<std::string, const CheckpointTensor*> by_name;
  for (const auto& t : tensors) by_name.emplace(t.name, &t);
  for (const auto& info : m.tensors()) {
    auto it = by_name.find(info.name);
    if (it == by_name.end()) throw Error("checkpoint lacks tensor '" + info.name + "' of model " + m.name());
    const CheckpointTensor& c = *it->second;
    if (c.shape) {
      std::vector<std::int64_t> want(info.shape.begin(), info.shape.begin() + info.rank);
      if (*c.shape != want) {
        auto str = [](const std::vector<std::int64_t>& v) {
          std::string s = "[";
          for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
          return s + "]";
        };
        throw Error("checkpoint tensor '" + info.name + "' has shape " + str(*c.shape) + " but the config implies " + str(want));
      }
    }
    if (c.dtype && *c.dtype != expected_dtype(info.dtype))
      throw Error("checkpoint tensor '" + info.name + "' has dtype " + *c.dtype + " but the config says " +
                  expected_dtype(info.dtype));
  }
  for (const auto& t : tensors)
    if (!m.find(t.name)) throw Error("checkpoint has tensor '" + t.name + "' that model " + m.name() + " does not");
}

}  // namespace nereus
