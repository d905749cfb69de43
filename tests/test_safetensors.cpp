// Tensor lists from safetensors headers and index files, checked against configs.
#include <doctest/doctest.h>

#include <cmath>

#include "test_util.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "nereus/base/error.hpp"
#include "nereus/core/safetensors.hpp"

using namespace nereus;
using testing::error_of;
using testing::has;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() {
  const fs::path d = fs::temp_directory_path() / ("nereus-st-" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

/// Writes a safetensors file whose header lists `tensors` (data bytes are zeros, or
/// `data_bytes` of them when given).
void write_safetensors(const fs::path& p, const nlohmann::json& header, std::uint64_t data_bytes) {
  const std::string h = header.dump();
  std::ofstream out(p, std::ios::binary);
  const std::uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << h;
  const std::string zeros(static_cast<std::size_t>(data_bytes), '\0');
  out << zeros;
}

/// Header of a full checkpoint of `m` (dtype BF16), and its data size.
std::pair<nlohmann::json, std::uint64_t> header_of(const ModelSpec& m) {
  nlohmann::json h = nlohmann::json::object();
  std::uint64_t at = 0;
  for (const auto& t : m.tensors()) {
    auto shape = nlohmann::json::array({t.shape[0]});
    if (t.rank == 2) shape.push_back(t.shape[1]);
    const std::uint64_t bytes = static_cast<std::uint64_t>(t.elements()) * 2;
    h[t.name] = {{"dtype", "BF16"}, {"shape", shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  h["__metadata__"] = {{"format", "pt"}};
  return {h, at};
}


}  // namespace

TEST_CASE("a full checkpoint header matches its config; each mismatch is named") {
  const auto m = load_model("tiny-qwen2-tied");
  const fs::path dir = temp_dir();
  auto [h, size] = header_of(*m);
  write_safetensors(dir / "ok.safetensors", h, size);
  const auto list = read_checkpoint_tensors((dir / "ok.safetensors").string());
  CHECK(list.size() == m->tensors().size());
  CHECK_NOTHROW(check_checkpoint(*m, list));

  auto missing = list;
  missing.erase(missing.begin() + 3);
  CHECK(has(error_of([&] { check_checkpoint(*m, missing); }), "lacks tensor '" + list[3].name + "'"));

  auto shape = list;
  (*shape[1].shape)[0] += 1;
  CHECK(has(error_of([&] { check_checkpoint(*m, shape); }), "has shape"));

  auto dtype = list;
  dtype[2].dtype = "F32";
  CHECK(has(error_of([&] { check_checkpoint(*m, dtype); }), "dtype F32"));

  auto extra = list;
  extra.push_back({"lm_head.weight", "BF16", std::vector<std::int64_t>{517, 96}, "x"});
  CHECK(has(error_of([&] { check_checkpoint(*m, extra); }), "has tensor 'lm_head.weight'"));
  fs::remove_all(dir);
}

TEST_CASE("malformed safetensors headers are rejected with the reason") {
  const auto m = load_model("tiny-llama");
  const fs::path dir = temp_dir();
  auto [h, size] = header_of(*m);
  write_safetensors(dir / "short.safetensors", h, size - 10);  // data cut short
  CHECK(has(error_of([&] { read_safetensors_header((dir / "short.safetensors").string()); }), "overruns"));

  {
    std::ofstream out(dir / "tiny.safetensors", std::ios::binary);
    out << "abc";
  }
  CHECK(has(error_of([&] { read_safetensors_header((dir / "tiny.safetensors").string()); }), "too short"));

  {
    std::ofstream out(dir / "len.safetensors", std::ios::binary);
    const std::uint64_t n = 1u << 20;
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << "{}";
  }
  CHECK(has(error_of([&] { read_safetensors_header((dir / "len.safetensors").string()); }), "header length"));

  nlohmann::json bad = {{"x", {{"dtype", "BF16"}, {"shape", {4}}, {"data_offsets", {0, 6}}}}};
  write_safetensors(dir / "span.safetensors", bad, 8);
  CHECK(has(error_of([&] { read_safetensors_header((dir / "span.safetensors").string()); }), "need 8"));

  nlohmann::json rev = {{"x", {{"dtype", "BF16"}, {"shape", {1}}, {"data_offsets", {4, 2}}}}};
  write_safetensors(dir / "rev.safetensors", rev, 8);
  CHECK(has(error_of([&] { read_safetensors_header((dir / "rev.safetensors").string()); }), "end before begin"));

  nlohmann::json unk = {{"x", {{"dtype", "Q4"}, {"shape", {1}}, {"data_offsets", {0, 1}}}}};
  write_safetensors(dir / "unk.safetensors", unk, 8);
  CHECK(has(error_of([&] { read_safetensors_header((dir / "unk.safetensors").string()); }), "unknown dtype 'Q4'"));

  CHECK(has(error_of([&] { read_safetensors_header((dir / "absent.safetensors").string()); }), "cannot open"));
  fs::remove_all(dir);
}

TEST_CASE("an index reads its shards when present, names alone otherwise") {
  const auto m = load_model("tiny-llama");
  const fs::path dir = temp_dir();
  auto [h, size] = header_of(*m);
  // Two shards: the first half of the tensors in a.safetensors, the rest in b.
  nlohmann::json ha = nlohmann::json::object(), hb = nlohmann::json::object(), map = nlohmann::json::object();
  std::uint64_t at_a = 0, at_b = 0;
  std::size_t i = 0;
  for (const auto& t : m->tensors()) {
    auto e = h[t.name];
    const std::uint64_t bytes = e["data_offsets"][1].get<std::uint64_t>() - e["data_offsets"][0].get<std::uint64_t>();
    const bool first = i++ < m->tensors().size() / 2;
    std::uint64_t& at = first ? at_a : at_b;
    e["data_offsets"] = {at, at + bytes};
    at += bytes;
    (first ? ha : hb)[t.name] = e;
    map[t.name] = first ? "a.safetensors" : "b.safetensors";
  }
  write_safetensors(dir / "a.safetensors", ha, at_a);
  write_safetensors(dir / "b.safetensors", hb, at_b);
  {
    std::ofstream out(dir / "model.safetensors.index.json");
    out << nlohmann::json{{"metadata", {{"total_size", size}}}, {"weight_map", map}}.dump();
  }
  const auto list = read_checkpoint_tensors((dir / "model.safetensors.index.json").string());
  CHECK(list.size() == m->tensors().size());
  CHECK(list[0].shape.has_value());
  CHECK_NOTHROW(check_checkpoint(*m, list));

  fs::remove(dir / "b.safetensors");
  const auto names = read_checkpoint_tensors((dir / "model.safetensors.index.json").string());
  CHECK_NOTHROW(check_checkpoint(*m, names));
  CHECK_FALSE(names.back().shape.has_value());
  fs::remove_all(dir);
}

TEST_CASE("safetensors: element conversion rounds to nearest even and keeps specials") {
  auto to16 = [](DType t, float x) {
    std::uint16_t h = 0;
    convert_elements(DType::f32, reinterpret_cast<const std::byte*>(&x), t, reinterpret_cast<std::byte*>(&h), 1);
    return h;
  };
  auto from16 = [](DType t, std::uint16_t h) {
    float x = 0;
    convert_elements(t, reinterpret_cast<const std::byte*>(&h), DType::f32, reinterpret_cast<std::byte*>(&x), 1);
    return x;
  };
  CHECK(to16(DType::bf16, 1.0f) == 0x3f80);
  CHECK(to16(DType::f16, 1.0f) == 0x3c00);
  CHECK(to16(DType::f16, -2.0f) == 0xc000);
  CHECK(to16(DType::f16, 65504.0f) == 0x7bff);
  CHECK(to16(DType::f16, 65520.0f) == 0x7c00);          // rounds up to infinity
  CHECK(to16(DType::f16, 0x1p-24f) == 0x0001);          // smallest subnormal
  CHECK(to16(DType::f16, 0x1p-25f) == 0x0000);          // a tie rounds to even (zero)
  CHECK(to16(DType::f16, 1.0f + 0x1p-11f) == 0x3c00);   // tie between 1 and 1+2^-10: even
  CHECK(to16(DType::f16, 1.0f + 3 * 0x1p-11f) == 0x3c02);
  CHECK(to16(DType::bf16, 1.0f + 0x1p-8f) == 0x3f80);   // tie: even
  CHECK(to16(DType::bf16, 1.0f + 3 * 0x1p-8f) == 0x3f82);
  CHECK(std::isnan(from16(DType::bf16, to16(DType::bf16, std::nanf("")))));
  CHECK(std::isnan(from16(DType::f16, to16(DType::f16, std::nanf("")))));
  // Every f16 value survives f16 → f32 → f16, and every bf16 value bf16 → f32 → bf16.
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto v = static_cast<std::uint16_t>(h);
    if ((v & 0x7c00) != 0x7c00 || (v & 0x3ff) == 0) REQUIRE(to16(DType::f16, from16(DType::f16, v)) == v);
    if ((v & 0x7f80) != 0x7f80 || (v & 0x7f) == 0) REQUIRE(to16(DType::bf16, from16(DType::bf16, v)) == v);
  }
}
