// Weights in and out of a job's units: safetensors loaded box by box into every unit,
// saved tensor by tensor from replica 0, and checkpoints that resume a run exactly.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "job_state.hpp"
#include "nereus/base/error.hpp"
#include "nereus/core/bytes.hpp"
#include "nereus/core/fp8.hpp"
#include "nereus/core/fp8_layout.hpp"
#include "nereus/core/presets.hpp"
#include "nereus/core/safetensors.hpp"

namespace nereus {

namespace {

using json = nlohmann::json;

/// The bytes a box covers in a row-major tensor of `shape`: runs of contiguous elements,
/// as (first element in the tensor, element count), in the box's row-major order.
template <class F>
void for_each_run(const TensorInfo& t, const Box& box, F&& f) {
  if (t.rank == 1) {
    f(box.dims[0].lo, box.dims[0].size());
    return;
  }
  const std::int64_t cols = t.shape[1];
  const Range r = box.dims[0], c = box.dims[1];
  if (c.lo == 0 && c.hi == cols) {  // whole rows: one run
    f(r.lo * cols, r.size() * cols);
    return;
  }
  for (std::int64_t row = r.lo; row < r.hi; ++row) f(row * cols + c.lo, c.size());
}

/// An open safetensors file; closes itself.
class File {
 public:
  explicit File(const std::string& path) : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) throw Error("cannot open '" + path + "': " + std::strerror(errno));
  }
  ~File() { ::close(fd_); }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  void read(std::uint64_t offset, std::byte* out, std::size_t n) const {
    while (n > 0) {
      const ssize_t got = ::pread(fd_, out, n, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) throw Error("cannot read '" + path_ + "' at byte " + std::to_string(offset));
      out += got;
      offset += static_cast<std::uint64_t>(got);
      n -= static_cast<std::size_t>(got);
    }
  }

 private:
  std::string path_;
  int fd_;
};

/// A quantizable weight's `…weight_scale_inv` as a tensor of its own: float32, one per
/// block (sharding.md).
TensorInfo scale_tensor(const ModelConfig& cfg, const TensorInfo& t) {
  TensorInfo s = t;
  s.name = scale_name(t);
  s.dtype = DType::f32;
  const Box blocks = fp8_scale_box(cfg, Box::of_shape({t.shape[0], t.shape[1]}));
  s.shape = {blocks.dims[0].hi, blocks.dims[1].hi};
  return s;
}

/// A checkpoint's tensors by name, checked against the model, with their files open. A
/// quantizable weight may be stored block-scaled FP8 (F8_E4M3 with its F32
/// `…weight_scale_inv`, as DeepSeek-V3 ships and save_weights writes a dtype=fp8 stage).
struct Checkpoint {
  std::map<std::string, CheckpointTensor> tensors;
  std::map<std::string, std::unique_ptr<File>> files;
  std::string path;

  Checkpoint(const ModelSpec& m, const std::string& path_) : path(path_) {
    std::vector<CheckpointTensor> list = read_checkpoint_tensors(path);
    for (const auto& t : list)
      if (!t.dtype) throw Error(path + ": shard file '" + t.file + "' of tensor '" + t.name + "' is missing");
    auto take = [&](const TensorInfo& info, bool may_be_fp8) {
      auto it = std::find_if(list.begin(), list.end(), [&](const CheckpointTensor& t) { return t.name == info.name; });
      if (it == list.end()) throw Error(path + " lacks tensor '" + info.name + "' of model " + m.name());
      std::vector<std::int64_t> want(info.shape.begin(), info.shape.begin() + info.rank);
      if (*it->shape != want)
        throw Error(path + ": tensor '" + info.name + "' has shape " + json(*it->shape).dump() + " but the model has " +
                    json(want).dump());
      const bool fp8 = *it->dtype == "F8_E4M3";
      if (!parse_safetensors_dtype(*it->dtype) && !(fp8 && may_be_fp8))
        throw Error(path + ": tensor '" + info.name + "' has dtype " + *it->dtype + "; BF16, F16 or F32 are read" +
                    (may_be_fp8 ? ", or F8_E4M3 with its weight_scale_inv" : ""));
      if (!files.contains(it->file)) files.emplace(it->file, std::make_unique<File>(it->file));
      tensors.emplace(info.name, *it);
      return fp8;
    };
    for (const auto& info : m.tensors())
      if (take(info, quantizable(info))) take(scale_tensor(m.config(), info), false);
  }

  bool fp8(const TensorInfo& info) const { return *tensors.at(info.name).dtype == "F8_E4M3"; }

  /// Reads `box` of tensor `info` into a contiguous block of element type `to` at `out`.
  void read_box(const TensorInfo& info, const Box& box, DType to, std::byte* out, std::vector<std::byte>& scratch) const {
    const CheckpointTensor& t = tensors.at(info.name);
    const bool fp8 = *t.dtype == "F8_E4M3";
    if (fp8 != (to == DType::e4m3))
      throw Error(path + ": tensor '" + info.name + "' is " + (fp8 ? "block-scaled FP8 (F8_E4M3)" : *t.dtype) +
                  (fp8 ? "; only dtype=fp8 units read it (loading it into bf16 would need it dequantized, which is not done)"
                       : "; read into an FP8 unit it is quantized (read_buffer)"));
    const DType from = fp8 ? DType::e4m3 : *parse_safetensors_dtype(*t.dtype);
    const File& f = *files.at(t.file);
    for_each_run(info, box, [&](std::int64_t first, std::int64_t n) {
      const auto count = static_cast<std::size_t>(n);
      const std::uint64_t at = t.offset + static_cast<std::uint64_t>(first) * width(from);
      if (from == to) {
        f.read(at, out, count * width(to));
      } else {
        scratch.resize(count * width(from));
        f.read(at, scratch.data(), scratch.size());
        convert_elements(from, scratch.data(), to, out, count);
      }
      out += count * width(to);
    });
  }

  /// Reads one buffer of a unit (`bufs[b]`, at `base`; `all` are the unit's buffers at
  /// `bases`). An FP8 weight buffer takes its scales with it: read as they are from an FP8
  /// checkpoint, or quantized here from a bf16/f16/f32 one with sharding.md's quantizer
  /// (the same bytes a weight sync writes: every split falls on a block boundary). Scale
  /// buffers are skipped (their weight buffer writes them).
  void read_buffer(const ModelSpec& m, const std::vector<BufferSpec>& bufs, std::size_t b,
                   const std::vector<std::span<std::byte>>& bases, std::vector<std::byte>& scratch) const {
    const BufferSpec& spec = bufs[b];
    if (spec.key.slot == Slot::scale) return;
    std::byte* base = bases[b].data();
    if (spec.dtype != DType::e4m3) {
      for (const BufferSpec::Part& p : spec.parts)
        read_box(m.tensor(p.tensor), p.shard, spec.dtype, base + static_cast<std::size_t>(p.base) * width(spec.dtype), scratch);
      return;
    }
    std::size_t sb = 0;
    while (sb < bufs.size() && !(bufs[sb].key.slot == Slot::scale && bufs[sb].key.device == spec.key.device &&
                                 bufs[sb].key.buffer == spec.key.buffer))
      ++sb;
    if (sb == bufs.size()) throw Error("FP8 buffer without its scale buffer on device " + std::to_string(spec.key.device));
    const ModelConfig& cfg = m.config();
    std::vector<std::byte> source;
    for (std::size_t k = 0; k < spec.parts.size(); ++k) {
      const BufferSpec::Part& p = spec.parts[k];
      const BufferSpec::Part& sp = bufs[sb].parts.at(k);  // a scale buffer stacks its parts in the weight buffer's order
      const TensorInfo& info = m.tensor(p.tensor);
      auto* q = reinterpret_cast<std::uint8_t*>(base + static_cast<std::size_t>(p.base));
      auto* scales = reinterpret_cast<float*>(bases[sb].data() + static_cast<std::size_t>(sp.base) * 4);
      if (fp8(info)) {
        read_box(info, p.shard, DType::e4m3, reinterpret_cast<std::byte*>(q), scratch);
        read_box(scale_tensor(cfg, info), sp.shard, DType::f32, reinterpret_cast<std::byte*>(scales), scratch);
        continue;
      }
      const CheckpointTensor& t = tensors.at(info.name);
      const DType from = *parse_safetensors_dtype(*t.dtype);
      const std::int64_t rows = p.shard.dims[0].size(), cols = p.shard.dims[1].size();
      source.resize(static_cast<std::size_t>(rows * cols) * width(from));
      std::byte* at = source.data();
      for_each_run(info, p.shard, [&](std::int64_t first, std::int64_t n) {
        files.at(t.file)->read(t.offset + static_cast<std::uint64_t>(first) * width(from), at, static_cast<std::size_t>(n) * width(from));
        at += static_cast<std::size_t>(n) * width(from);
      });
      fp8::quantize({source.data(), fp8_source(from), rows, cols, cols}, cfg.fp8_block[0], cfg.fp8_block[1], q, cols, scales,
                    sp.shard.dims[1].size());
    }
  }
};

/// Writes one slot of `units` (replica 0 first; any replica holding a box will do) as a
/// safetensors file of the model's tensors.
void write_slot(const ModelSpec& m, const std::vector<UnitPtr>& units, Slot slot, const std::string& path) {
  // Replica 0's shards of this slot, by tensor (replicated shards: every copy; one is written).
  LiveUnit& u = *units.at(0);
  const auto host = std::make_shared<HostMirror>(u, true);  // GPU memory: a host copy the writer reads
  std::vector<std::vector<ShardView>> by_tensor(m.tensors().size()), scales(m.tensors().size());
  for (const ShardView& v : shard_views(u.buffers, host->spans()))
    if (v.slot == slot) by_tensor[v.tensor].push_back(v);
    else if (v.slot == Slot::scale && slot == Slot::param) scales[v.tensor].push_back(v);
  std::vector<SafetensorsOut> out;
  auto add = [&](const TensorInfo& info, const std::vector<ShardView>& parts) {
    const DType dtype = parts[0].dtype;
    std::vector<std::int64_t> shape(info.shape.begin(), info.shape.begin() + info.rank);
    out.push_back({info.name, dtype, shape, [info, parts, dtype, host](std::byte* dst, std::size_t) {
                     std::vector<Box> done;
                     for (const ShardView& v : parts) {
                       if (std::any_of(done.begin(), done.end(), [&](const Box& b) { return b == v.box; })) continue;
                       done.push_back(v.box);
                       const std::byte* src = v.data;
                       for_each_run(info, v.box, [&](std::int64_t first, std::int64_t n) {
                         const std::size_t bytes = static_cast<std::size_t>(n) * width(dtype);
                         std::memcpy(dst + static_cast<std::size_t>(first) * width(dtype), src, bytes);
                         src += bytes;
                       });
                     }
                   }});
  };
  for (TensorId id = 0; id < m.tensors().size(); ++id) {
    const TensorInfo& info = m.tensor(id);
    if (by_tensor[id].empty()) throw Error("save: replica 0 holds no " + std::string(to_string(slot)) + " of '" + info.name + "'");
    add(info, by_tensor[id]);
    // A dtype=fp8 stage's weight as its checkpoint ships it: F8_E4M3 and its scale_inv.
    if (!scales[id].empty()) add(scale_tensor(m.config(), info), scales[id]);
  }
  write_safetensors(path, out);
}

/// "actor/train" → "actor.train" (a file name).
std::string file_stem(const std::string& stage) {
  std::string s = stage;
  std::replace(s.begin(), s.end(), '/', '.');
  return s;
}

void check_idle(const JobState& s, std::string_view what) {
  if (s.transition && !s.transition->finished) throw Error(std::string(what) + ": a transition is in flight; wait for it first");
  for (const StageSlot& slot : s.slots) {
    if (slot.claimed) throw Error(std::string(what) + ": model-stage '" + slot.stage.name() + "' is running");
    if (slot.leaving)
      throw Error(std::string(what) + ": model-stage '" + slot.stage.name() +
                  "' was left while the framework's work on its GPUs still runs; wait for it (end_step does)");
  }
}

/// Reads every slot file of a checkpoint into the units of stage i.
void load_slots(JobState& s, std::size_t i, const std::string& dir) {
  const ModelStage& st = s.stages[i];
  std::vector<std::byte> scratch;
  std::map<Slot, std::unique_ptr<Checkpoint>> files;
  for (const UnitPtr& u : s.slots[i].units) {
    const HostMirror host(*u, false);  // every byte is read from the files
    for (std::size_t b = 0; b < u->buffers.size(); ++b) {
      const Slot slot = u->buffers[b].key.slot == Slot::scale ? Slot::param : u->buffers[b].key.slot;
      auto& f = files[slot];
      if (!f) f = std::make_unique<Checkpoint>(*st.model, dir + "/" + file_stem(st.name()) + "." + std::string(to_string(slot)) + ".safetensors");
      f->read_buffer(*st.model, u->buffers, b, host.spans(), scratch);
    }
    host.commit();
  }
}

}  // namespace

void Job::load_weights(std::string_view what, const std::string& path) {
  JobState& s = *s_;
  check_idle(s, "load_weights");
  std::vector<std::size_t> targets;
  for (std::size_t i = 0; i < s.stages.size(); ++i)
    if (s.stages[i].name() == what || s.stages[i].role == what) targets.push_back(i);
  if (targets.empty()) s.index(what);  // throws, naming the model-stages
  // Open and check everything before the first byte lands in a unit.
  const Checkpoint ckpt(*s.stages[targets[0]].model, path);
  for (std::size_t i : targets)
    for (const UnitPtr& u : s.slots[i].units)
      for (const BufferSpec& spec : u->buffers)
        if (spec.dtype != DType::e4m3 && spec.key.slot != Slot::scale && spec.key.slot != Slot::exp_avg &&
            spec.key.slot != Slot::exp_avg_sq)
          for (const BufferSpec::Part& p : spec.parts)
            if (ckpt.fp8(s.stages[i].model->tensor(p.tensor)))
              throw Error(path + ": tensor '" + s.stages[i].model->tensor(p.tensor).name + "' is block-scaled FP8 (F8_E4M3) and '" +
                          s.stages[i].name() + "' holds it in " + std::string(to_string(spec.dtype)) +
                          "; only dtype=fp8 units read FP8 weights (they are not dequantized)");
  std::vector<std::byte> scratch;
  for (std::size_t i : targets) {
    const ModelSpec& m = *s.stages[i].model;
    for (const UnitPtr& u : s.slots[i].units) {
      const HostMirror host(*u, true);  // buffers of other slots come back unchanged
      for (std::size_t b = 0; b < u->buffers.size(); ++b) {
        const BufferSpec& spec = u->buffers[b];
        if (spec.key.slot == Slot::exp_avg || spec.key.slot == Slot::exp_avg_sq)
          std::memset(host.data(b), 0, spec.bytes());
        else
          ckpt.read_buffer(m, u->buffers, b, host.spans(), scratch);  // param, and master as f32
      }
      host.commit();
    }
  }
}

void Job::save_weights(std::string_view model_stage, const std::string& path, Slot slot) const {
  const JobState& s = *s_;
  check_idle(s, "save_weights");
  const std::size_t i = s.index(model_stage);
  if (slot != Slot::param && s.stages[i].kind != StageKind::train)
    throw Error("save_weights: '" + std::string(model_stage) + "' has only the param slot");
  write_slot(*s.stages[i].model, s.slots[i].units, slot, path);
}

void Job::save_checkpoint(const std::string& dir) const {
  const JobState& s = *s_;
  check_idle(s, "save_checkpoint");
  for (const StageSlot& slot : s.slots)
    if (slot.ran_this_step)
      throw Error("save_checkpoint: model-stage '" + slot.stage.name() + "' already ran in step " + std::to_string(s.step) +
                  "; checkpoint between steps (after end_step)");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("save_checkpoint: cannot create '" + dir + "': " + ec.message());
  json stages = json::object();
  for (std::size_t i = 0; i < s.slots.size(); ++i) {
    const StageSlot& slot = s.slots[i];
    const StageState& st = slot.state;
    json versions = json::array();
    for (const UnitPtr& u : slot.units) versions.push_back(u->version);
    stages[slot.stage.name()] = {{"model", s.stages[i].model->name()},
                                 {"policy_version", st.policy_version},
                                 {"update_count", st.update_count},
                                 {"minibatch_position", st.minibatch_position},
                                 {"dataloader_position", st.dataloader_position},
                                 {"rng_seed", st.rng_seed},
                                 {"global_batch", st.global_batch},
                                 {"micro_batch", st.micro_batch},
                                 {"accumulation_steps", st.accumulation_steps},
                                 {"dp", st.dp},
                                 {"unit_versions", versions}};
    const std::vector<Slot> slots = s.stages[i].kind == StageKind::train
                                        ? std::vector<Slot>(kTrainSlots.begin(), kTrainSlots.end())
                                        : std::vector<Slot>{Slot::param};
    for (Slot sl : slots)
      write_slot(*s.stages[i].model, slot.units, sl, dir + "/" + file_stem(slot.stage.name()) + "." + std::string(to_string(sl)) + ".safetensors");
  }
  const json doc = {{"format", "nereus-checkpoint"}, {"version", 1}, {"step", s.step},
                    {"plan", json::parse(to_json_text(plan()))}, {"stages", stages}};
  // checkpoint.json last: a directory without it is not a checkpoint.
  const std::string tmp = dir + "/checkpoint.json.tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << doc.dump(2) << "\n";
    if (!out) throw Error("save_checkpoint: cannot write '" + tmp + "'");
  }
  std::filesystem::rename(tmp, dir + "/checkpoint.json", ec);
  if (ec) throw Error("save_checkpoint: cannot write '" + dir + "/checkpoint.json': " + ec.message());
}

std::unique_ptr<Job> Job::resume(asio::any_io_executor ex, JobSpec spec, const std::string& dir, JobOptions options) {
  const std::string meta = dir + "/checkpoint.json";
  json doc;
  try {
    doc = json::parse(read_text_file(meta));
  } catch (const json::exception& e) {
    throw Error(meta + ": not a checkpoint (" + e.what() + ")");
  }
  if (doc.value("format", "") != "nereus-checkpoint" || doc.value("version", 0) != 1)
    throw Error(meta + ": not a version 1 nereus checkpoint");
  try {
    const GlobalPlan plan = parse_global_plan(spec, doc.at("plan").dump(), meta);
    options.fill = false;
    auto job = std::make_unique<Job>(ex, std::move(spec), plan, std::move(options));
    JobState& s = *job->s_;
    for (std::size_t i = 0; i < s.slots.size(); ++i) {
      const std::string name = s.stages[i].name();
      if (!doc.at("stages").contains(name)) throw Error(meta + ": no state for model-stage '" + name + "'");
      const json& j = doc.at("stages").at(name);
      if (j.at("model").get<std::string>() != s.stages[i].model->name())
        throw Error(meta + ": '" + name + "' was saved with model " + j.at("model").get<std::string>() + ", not " +
                    s.stages[i].model->name());
      StageState& st = s.slots[i].state;
      st.policy_version = j.at("policy_version");
      st.update_count = j.at("update_count");
      st.minibatch_position = j.at("minibatch_position");
      st.dataloader_position = j.at("dataloader_position");
      st.rng_seed = j.at("rng_seed");
      st.global_batch = j.at("global_batch");
      st.micro_batch = j.at("micro_batch");
      st.accumulation_steps = j.at("accumulation_steps");
      st.dp = j.at("dp");
      const json& versions = j.at("unit_versions");
      if (versions.size() != s.slots[i].units.size())
        throw Error(meta + ": '" + name + "' lists " + std::to_string(versions.size()) + " unit versions for " +
                    std::to_string(s.slots[i].units.size()) + " units");
      for (std::size_t r = 0; r < versions.size(); ++r) s.slots[i].units[r]->version = versions[r];
      load_slots(s, i, dir);
    }
    s.step = doc.at("step");
    return job;
  } catch (const json::exception& e) {
    throw Error(meta + ": " + e.what());
  }
}

}  // namespace nereus
