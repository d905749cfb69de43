#pragma once
// Layouts (tp, pp, layer partition, packing) and the layout spec string of interfaces.md.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "nereus/base/device_id.hpp"
#include "nereus/core/box.hpp"
#include "nereus/core/model.hpp"

namespace nereus {

/// How a unit stores its shards locally (sharding.md, "Local packing", "Megatron packing").
enum class Packing : std::uint8_t { hf, fused, megatron };

std::string_view to_string(Packing p);

/// Parallel layout of one unit: TP degree, PP degree, layers per stage, packing, and for
/// mixture-of-experts models the expert-parallel degree ep (attention copies inside the
/// unit) and the expert tensor-parallel degree etp (sharding.md).
struct Layout {
  int tp = 1;
  int pp = 1;
  std::vector<int> partition;  ///< layers per stage; empty: part(L, pp, s)
  Packing packing = Packing::hf;
  int ep = 1;
  int etp = 0;  ///< 0: the default, tp
  /// `dtype=fp8`: quantizable weights held as float8_e4m3fn with float32 block scales
  /// (generation and inference units only; core/fp8_layout.hpp).
  bool fp8 = false;
  /// `fsdp=F`: FSDP2's dim-0 chunks of each TP box over F GPUs (dense models only;
  /// sharding.md, "FSDP"). Position (s, f, r) has in-stage index g = f·tp + r.
  int fsdp = 1;

  /// GPUs of one pipeline stage: tp·ep·fsdp (ep or fsdp is 1); position (s, g) is
  /// R[s·stage_size() + g], g = e·tp + r or f·tp + r.
  int stage_size() const { return tp * ep * fsdp; }
  int size() const { return stage_size() * pp; }
  int expert_tp() const { return etp > 0 ? etp : tp; }
  /// Expert groups per stage: tp·ep / etp.
  int expert_groups() const { return tp * ep / expert_tp(); }
  /// Layers [lo, hi) held by pipeline stage s of a model with L layers.
  Range stage_layers(int s, std::int64_t L) const;
  /// Pipeline stage holding layer l.
  int stage_of(std::int64_t layer, std::int64_t L) const;
  /// Same shards in the same element types (packing aside).
  bool same_sharding(const Layout& o) const {
    return tp == o.tp && pp == o.pp && partition == o.partition && ep == o.ep && expert_tp() == o.expert_tp() &&
           fp8 == o.fp8 && fsdp == o.fsdp;
  }
  bool operator==(const Layout&) const = default;
};

/// Whether TP degree tp is valid for `model`: it divides the heads, and divides or is a
/// multiple of the KV heads (sharding.md).
bool valid_tp(const ModelConfig& model, int tp);

/// The first rule of sharding.md's ep/etp validity that `layout` breaks for `model`
/// (empty when none): a dense model takes only ep = 1; etp divides tp·ep; at most
/// num_experts groups; etp ≤ moe_intermediate_size; tp·ep ≤ 4096.
std::string broken_expert_rule(const ModelConfig& model, const Layout& layout);

/// The first FSDP rule `layout` breaks for `model` (empty when none): fsdp ≥ 1; fsdp > 1
/// only on dense models, without dtype=fp8, and tp·fsdp ≤ 4096.
std::string broken_fsdp_rule(const ModelConfig& model, const Layout& layout);

/// Throws Error unless `layout` is valid for `model` (sharding.md validity rules); the
/// message names the rule that failed.
void validate_layout(const ModelConfig& model, const Layout& layout);

/// A parsed layout spec: layout, dp degree and the concatenated R lists.
struct CollectionSpec {
  Layout layout;
  int dp = 1;
  std::vector<DeviceId> devices;  ///< tp·pp·ep·fsdp·dp ids; filled with 0.. when not given
};

/// Parses `tp=T,pp=P[,ep=X[,etp=K]][,fsdp=F],dp=D[,devices=LIST][,partition=A/B/C][,packing=hf|fused|megatron][,dtype=fp8]`.
/// Every error names the offending key and value.
CollectionSpec parse_collection_spec(std::string_view spec);

/// Spec string of a collection spec (devices written as ranges where consecutive).
std::string to_string(const CollectionSpec& spec);
std::string to_string(const Layout& layout);
/// "0-7" / "0:4:1:5" style list.
std::string device_list_string(const std::vector<DeviceId>& devices);

}  // namespace nereus
