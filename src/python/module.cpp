// The `nereus._nereus` extension: conversions between Python and the C++ embedding API
// (docs/embedding.md). Shards export their memory zero-copy through DLPack.
#include <dlpack/dlpack.h>
#include <pybind11/stl.h>

#include "nereus/base/error.hpp"
#include "nereus/base/log.hpp"
#include "nereus/core/fp8_layout.hpp"
#include "nereus/core/model.hpp"
#include "nereus/core/packing.hpp"
#include "nereus/runtime/weight_update.hpp"
#include "py_job.hpp"

namespace nereus::python {

namespace {

/// One shard of one slot as Python sees it; keeps its owner (a job or a member, and so
/// the memory) alive.
struct PyShard {
  std::shared_ptr<const void> owner;
  ShardView view;
  /// The checkpoint's names: an FP8 weight's block scales are its `…weight_scale_inv`
  /// tensor, slot param (as `--dump` and vLLM name them), not slot `scale` of the weight.
  std::string tensor;
  std::string slot;
  /// The unit's lifetime (an embedded job's units; none for a member's step views, which
  /// last one step): once it expires the memory is the arena's again, and using the view
  /// raises instead of reading whatever the arena put there next.
  std::optional<std::weak_ptr<const void>> unit;
  std::string unit_name;  ///< "actor/train unit 0", for that error
  void check() const {
    if (unit && unit->expired())
      throw Error("shard " + tensor + "@" + slot + " on device " + std::to_string(view.device) +
                  " of " + unit_name + ": a transition or weight update freed this memory; take new views from job.units()");
  }
  std::vector<std::int64_t> shape() const {
    std::vector<std::int64_t> s;
    for (int d = 0; d < view.box.rank; ++d) s.push_back(view.box.dims[static_cast<std::size_t>(d)].size());
    return s;
  }
};

struct PyUnit {
  std::shared_ptr<PyJob> job;
  std::string stage;
  UnitView view;
  std::vector<std::pair<DeviceId, std::span<std::byte>>> workspace;  ///< inside a stage block
};

/// A unit's workspace on one device, for this run of its stage: raw bytes.
struct PyWorkspace {
  std::shared_ptr<PyJob> job;
  DeviceId device = 0;
  std::span<std::byte> memory;
  DLDevice where{kDLCPU, 0};
};

/// Where a unit's memory is for DLPack: the host, or its GPU.
DLDevice dl_device(MemoryKind kind, int gpu) { return kind == MemoryKind::cuda ? DLDevice{kDLCUDA, gpu} : DLDevice{kDLCPU, 0}; }

/// What a DLPack consumer owns until it calls the deleter.
struct Exported {
  DLManagedTensor managed{};
  std::shared_ptr<const void> owner;
  std::vector<std::int64_t> shape;
};

DLDataType dl_dtype(DType t) {
  switch (t) {
    case DType::bf16: return {kDLBfloat, 16, 1};
    case DType::f16: return {kDLFloat, 16, 1};
    case DType::f32: return {kDLFloat, 32, 1};
    case DType::e4m3: return {kDLUInt, 8, 1};  // Debian's torch has no float8: the bytes as uint8
  }
  return {kDLFloat, 32, 1};
}

/// Exports `data` (compact row-major) to a DLPack consumer; its owner stays alive meanwhile.
py::capsule to_dlpack(std::shared_ptr<const void> owner, std::byte* data, std::vector<std::int64_t> shape, DLDataType dtype,
                      DLDevice where) {
  auto* e = new Exported;
  e->owner = std::move(owner);
  e->shape = std::move(shape);
  DLTensor& t = e->managed.dl_tensor;
  t.data = data;
  t.device = where;
  t.ndim = static_cast<std::int32_t>(e->shape.size());
  t.dtype = dtype;
  t.shape = e->shape.data();
  t.strides = nullptr;  // compact row-major
  t.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = [](DLManagedTensor* m) {
    // torch may free a tensor on any thread, with or without the GIL; this may drop the
    // last reference to a job, whose teardown touches Python objects.
    if (!Py_IsInitialized()) return;  // the interpreter is gone: leak rather than crash
    py::gil_scoped_acquire gil;
    delete static_cast<Exported*>(m->manager_ctx);
  };
  // A consumer renames the capsule to "used_dltensor"; one nobody consumed is freed here.
  return py::capsule(&e->managed, "dltensor", [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      m->deleter(m);
    }
  });
}

}  // namespace

py::list shards_of(std::shared_ptr<const void> owner, const JobSpec& job, std::string_view model_stage,
                   const std::vector<ShardView>& views, const std::optional<std::string>& slot,
                   const std::optional<std::weak_ptr<const void>>& unit, const std::string& unit_name) {
  const ModelSpec& m = *job.model(std::string(role_of(model_stage)));
  py::list out;
  bool known = !slot;
  for (Slot s : kTrainSlots) known = known || to_string(s) == *slot;
  if (!known) throw Error("unknown slot '" + *slot + "' (param, master, exp_avg, exp_avg_sq)");
  for (const ShardView& v : views) {
    const bool scale = v.slot == Slot::scale;
    const TensorInfo& info = m.tensor(v.tensor);
    const std::string shown(to_string(scale ? Slot::param : v.slot));
    if (!slot || shown == *slot) out.append(PyShard{owner, v, scale ? scale_name(info) : info.name, shown, unit, unit_name});
  }
  return out;
}

namespace {

std::vector<std::span<std::byte>> memory_of(const UnitContext& c) {
  std::vector<std::span<std::byte>> out;
  for (std::size_t b = 0; b < c.buffers().size(); ++b) out.push_back(c.memory(b));
  return out;
}

py::dict state_dict(const StageState& s) {
  py::dict d;
  d["policy_version"] = s.policy_version;
  d["update_count"] = s.update_count;
  d["minibatch_position"] = s.minibatch_position;
  d["dataloader_position"] = s.dataloader_position;
  d["rng_seed"] = s.rng_seed;
  d["global_batch"] = s.global_batch;
  d["micro_batch"] = s.micro_batch;
  d["accumulation_steps"] = s.accumulation_steps;
  d["dp"] = s.dp;
  return d;
}

py::dict plan_dict(const GlobalPlan& p) {
  py::dict d;
  for (const auto& [name, spec] : p.stages) d[py::str(name)] = to_string(spec);
  return d;
}

py::dict report_dict(const TransitionReport& r) {
  py::dict d;
  d["completed"] = r.completed;
  d["cancelled"] = r.cancelled;
  d["error"] = r.error;
  d["moved_bytes"] = r.moved_bytes;
  d["copied_bytes"] = r.copied_bytes;
  d["seconds"] = r.seconds;
  d["planned_seconds"] = r.planned_seconds;
  d["plan_ms"] = r.plan_ms;
  py::dict stages;
  for (const StageOutcome& s : r.stages) {
    py::dict o;
    o["on_new_plan"] = s.on_new_plan;
    o["spec"] = s.spec;
    stages[py::str(s.model_stage)] = o;
  }
  d["stages"] = stages;
  py::list nodes;  // what ran, when (seconds from the transition's start), on which devices
  for (const NodeRun& n : r.nodes) {
    py::dict o;
    o["kind"] = std::string(to_string(n.kind));
    o["start"] = n.start;
    o["end"] = n.end;
    o["bytes"] = n.bytes;
    o["unit"] = n.unit;
    o["devices"] = n.devices;
    nodes.append(o);
  }
  d["nodes"] = nodes;
  return d;
}

py::dict decision_dict(const Decision& x, double gamma) {
  py::dict d;
  d["step"] = x.step;
  d["trigger"] = x.trigger;
  d["urgent"] = x.urgent;
  d["replanned"] = x.replanned;
  d["admitted"] = x.admitted;
  d["blocked"] = x.blocked;
  d["why"] = x.why;
  d["refused"] = x.refused;
  d["current_seconds"] = x.current_seconds;
  d["target_seconds"] = x.target_seconds;
  d["delta_seconds"] = x.current_seconds - x.target_seconds;  // ΔL
  d["transition_seconds"] = x.transition_seconds;            // L_tran
  d["charged_seconds"] = x.charged_seconds;                  // what admission charged (L_tran between steps)
  d["horizon_steps"] = x.horizon_steps;                      // H_x
  d["gamma"] = gamma;
  d["moved_bytes"] = x.moved_bytes;
  d["decision_ms"] = x.decision_ms;
  d["target"] = x.admitted ? py::object(plan_dict(x.target)) : py::object(py::none());
  return d;
}

/// `with job.stage(name) as units:` — the stage's devices are busy until the block ends.
/// The framework's streams a stage's work ran on, from Python: None (each GPU's default
/// stream), a stream (torch.cuda.Stream or anything with `.cuda_stream` and
/// `.device_index`), a list of them, or {gpu: stream or raw handle}.
std::vector<FrameworkStream> framework_streams(const py::object& o) {
  std::vector<FrameworkStream> out;
  if (o.is_none()) return out;
  auto handle = [](py::handle x) -> std::uintptr_t {
    if (py::isinstance<py::int_>(x)) return x.cast<std::uintptr_t>();
    if (py::hasattr(x, "cuda_stream")) return x.attr("cuda_stream").cast<std::uintptr_t>();
    throw Error("stream: a torch.cuda.Stream (or an object with .cuda_stream), or an int handle in {gpu: stream}");
  };
  auto stream = [&](py::handle x) {
    if (!py::hasattr(x, "device_index"))
      throw Error("stream: it does not say its GPU (no .device_index); pass {gpu: stream} instead");
    out.push_back({x.attr("device_index").cast<int>(), handle(x)});
  };
  if (py::isinstance<py::dict>(o)) {
    for (auto [gpu, x] : o.cast<py::dict>()) out.push_back({gpu.cast<int>(), handle(x)});
  } else if (py::isinstance<py::list>(o) || py::isinstance<py::tuple>(o)) {
    for (py::handle x : o) stream(x);
  } else {
    stream(o);
  }
  return out;
}

class PyStage {
 public:
  PyStage(std::shared_ptr<PyJob> job, std::string name, std::vector<FrameworkStream> streams)
      : job_(std::move(job)), name_(std::move(name)), streams_(std::move(streams)) {}
  ~PyStage() {
    if (lease_ && lease_->held()) job_->loop().post([l = std::move(lease_), st = streams_] { l->leave(false, st); });
  }
  py::list enter() {
    if (lease_ && lease_->held()) throw Error("stage '" + name_ + "' is already entered");
    lease_ = std::make_shared<StageLease>(job_->loop().run([&] { return job_->job().enter_stage(name_); }));
    py::list units;
    for (const UnitContext& c : lease_->units()) {
      PyUnit u{job_, name_, UnitView{c.replica(), c.emu(), c.version(), c.shards(), c.buffers(), memory_of(c), c.lifetime()}, {}};
      for (DeviceId d : c.emu().gpus)
        if (!c.workspace(d).empty()) u.workspace.emplace_back(d, c.workspace(d));
      units.append(std::move(u));
    }
    return units;
  }
  bool exit(py::handle type, py::handle, py::handle) {
    if (lease_) job_->loop().call([&] { lease_->leave(type.is_none(), streams_); });
    lease_.reset();
    return false;
  }

 private:
  std::shared_ptr<PyJob> job_;
  std::string name_;
  std::vector<FrameworkStream> streams_;
  std::shared_ptr<StageLease> lease_;
};

struct PyTransition {
  std::shared_ptr<PyJob> job;
  TransitionHandle handle;
};

struct PyUpdate {
  std::shared_ptr<PyJob> job;
  WeightUpdate update;
};

py::dict update_dict(const WeightUpdateReport& r) {
  py::dict d;
  d["model_stage"] = r.model_stage;
  d["weight_version"] = r.version;
  d["completed"] = r.completed;
  d["error"] = r.error;
  d["pause"] = std::string(to_string(r.pause));
  d["automatic"] = r.automatic;
  d["started"] = r.started;
  d["seconds"] = r.seconds;
  d["copy_seconds"] = r.copy_seconds;
  d["paused_seconds"] = r.paused_seconds;
  d["moved_bytes"] = r.moved_bytes;
  d["copied_bytes"] = r.copied_bytes;
  d["unit_versions"] = r.unit_versions;
  return d;
}

}  // namespace

void bind_job(py::module_& m) {
  py::register_exception<Error>(m, "Error", PyExc_RuntimeError);

  py::class_<PyShard>(m, "Shard", "One tensor shard of one slot in a unit (a view of the unit's memory).")
      .def_property_readonly("device", [](const PyShard& s) { return s.view.device; })
      .def_property_readonly("tensor", [](const PyShard& s) { return s.tensor; })
      .def_property_readonly("slot", [](const PyShard& s) { return s.slot; })
      .def_property_readonly("dtype", [](const PyShard& s) { return std::string(to_string(s.view.dtype)); })
      .def_property_readonly("box", [](const PyShard& s) {
        py::list b;
        for (int d = 0; d < s.view.box.rank; ++d) {
          const Range r = s.view.box.dims[static_cast<std::size_t>(d)];
          b.append(py::make_tuple(r.lo, r.hi));
        }
        return b;
      })
      .def_property_readonly("shape", [](const PyShard& s) { return py::tuple(py::cast(s.shape())); })
      .def_property_readonly("nbytes", [](const PyShard& s) { return s.view.bytes(); })
      .def_property_readonly("data_ptr", [](const PyShard& s) {
        s.check();
        return reinterpret_cast<std::uintptr_t>(s.view.data);
      })
      .def("__dlpack__", [](const PyShard& s, py::object) {
        s.check();
        return to_dlpack(s.owner, s.view.data, s.shape(), dl_dtype(s.view.dtype), dl_device(s.view.kind, s.view.gpu));
      }, py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const PyShard& s) {
        const DLDevice d = dl_device(s.view.kind, s.view.gpu);
        return py::make_tuple(static_cast<int>(d.device_type), d.device_id);
      })
      .def("__repr__", [](const PyShard& s) {
        return "<Shard " + s.tensor + "@" + s.slot + " device " + std::to_string(s.view.device) +
               " box " + s.view.box.to_string() + ">";
      });

  py::class_<PyUnit>(m, "Unit", "One unit (EMU) of a model-stage.")
      .def_property_readonly("replica", [](const PyUnit& u) { return u.view.replica; })
      .def_property_readonly("devices", [](const PyUnit& u) { return u.view.emu.gpus; })
      .def_property_readonly("layout", [](const PyUnit& u) { return to_string(u.view.emu.layout); })
      .def_property_readonly("version", [](const PyUnit& u) { return u.view.version; })
      .def_property_readonly("model_stage", [](const PyUnit& u) { return u.stage; })
      .def("buffers", [](const PyUnit& u) {
        if (u.view.lifetime.expired())
          throw Error(u.stage + " unit " + std::to_string(u.view.replica) +
                      ": a transition or weight update freed this memory; take new views from job.units()");
        const ModelSpec& m = *u.job->spec().model(std::string(role_of(u.stage)));
        py::list out;
        for (std::size_t b = 0; b < u.view.buffers.size(); ++b) {
          const BufferSpec& spec = u.view.buffers[b];
          py::dict d;
          d["device"] = spec.key.device;
          const bool scale = spec.key.slot == Slot::scale;  // named as the checkpoint names it (PyShard)
          d["buffer"] = scale ? scale_buffer_name(m, spec.key.buffer, spec.packing)
                              : buffer_name(m, spec.key.buffer, spec.packing, spec.expert_groups);
          d["slot"] = std::string(to_string(scale ? Slot::param : spec.key.slot));
          d["dtype"] = std::string(to_string(spec.dtype));
          d["data_ptr"] = reinterpret_cast<std::uintptr_t>(u.view.memory[b].data());
          d["nbytes"] = spec.bytes();
          out.append(d);
        }
        return out;
      }, "Its local buffers (sharding.md packing): device, buffer name, slot, dtype, data_ptr, nbytes.")
      .def("workspace", [](const PyUnit& u, DeviceId device) {
        for (const auto& [d, memory] : u.workspace)
          if (d == device) return PyWorkspace{u.job, d, memory, dl_device(u.job->job().memory(), u.job->job().gpu_of(d))};
        throw Error("unit " + std::to_string(u.view.replica) + " of " + u.stage + " has no workspace on device " +
                    std::to_string(device) + " (set_workspace() before the stage, and ask inside its block)");
      }, py::arg("device"), "Its workspace on one of its devices, inside the stage's block (Job.set_workspace).")
      .def(
          "shards", [](const PyUnit& u, std::optional<std::string> slot) {
            return shards_of(u.job, u.job->spec(), u.stage, u.view.shards, slot, u.view.lifetime,
                             u.stage + " unit " + std::to_string(u.view.replica));
          },
          py::arg("slot") = "param", "Its shards of one slot (None: every slot), buffer by buffer.")
      .def("__repr__", [](const PyUnit& u) {
        return "<Unit " + u.stage + " #" + std::to_string(u.view.replica) + " " + to_string(u.view.emu.layout) + " on " +
               device_list_string(u.view.emu.gpus) + ">";
      });

  py::class_<PyWorkspace>(m, "Workspace", "Scratch bytes of one unit on one device for one run of its stage.")
      .def_property_readonly("device", [](const PyWorkspace& w) { return w.device; })
      .def_property_readonly("nbytes", [](const PyWorkspace& w) { return w.memory.size(); })
      .def("__dlpack__", [](const PyWorkspace& w, py::object) {
        return to_dlpack(w.job, w.memory.data(), {static_cast<std::int64_t>(w.memory.size())}, {kDLUInt, 8, 1}, w.where);
      }, py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const PyWorkspace& w) { return py::make_tuple(static_cast<int>(w.where.device_type), w.where.device_id); });

  py::class_<PyStage>(m, "Stage", "A model-stage held busy while the framework computes on its units.")
      .def("__enter__", &PyStage::enter)
      .def("__exit__", &PyStage::exit);

  py::class_<PyTransition>(m, "Transition", "A transition in flight.")
      .def("wait", [](PyTransition& t) {
        TransitionHandle h = t.handle;
        return report_dict(t.job->loop().run([h]() mutable { return h.wait(); }));
      }, "Blocks until it finished, failed or was cancelled; returns the report.")
      .def("cancel", [](PyTransition& t) { t.job->loop().call([&] { t.handle.cancel(); }); })
      .def_property_readonly("done", [](PyTransition& t) { return t.job->loop().call([&] { return t.handle.done(); }); });

  py::class_<PyUpdate>(m, "WeightUpdate", "A weight update of an async job's generation stage in flight (docs/embedding.md).")
      .def_property_readonly("version", [](PyUpdate& u) { return u.job->loop().call([&] { return u.update.version(); }); })
      .def_property_readonly("model_stage", [](PyUpdate& u) { return u.job->loop().call([&] { return u.update.model_stage(); }); })
      .def_property_readonly("ready", [](PyUpdate& u) { return u.job->loop().call([&] { return u.update.ready(); }); },
                             "Whether the staging is complete (or the update failed).")
      .def_property_readonly("switched", [](PyUpdate& u) { return u.job->loop().call([&] { return u.update.switched(); }); })
      .def("metadata", [](PyUpdate& u) {
        const std::vector<EngineTensor> meta = u.job->loop().call([&] { return u.update.metadata(); });
        py::dict out;
        for (const EngineTensor& t : meta) {
          py::dict e;
          e["name"] = t.name;
          e["dtype"] = std::string(to_string(t.dtype));
          e["shape"] = t.shape;
          e["slot"] = t.slot;
          const py::int_ device(t.device);
          if (!out.contains(device)) out[device] = py::list();
          out[device].cast<py::list>().append(e);
        }
        return out;
      }, "{device: [{name, dtype, shape, slot}]}: the generation units' local buffers in the stage's packing.")
      .def("wait", [](PyUpdate& u) {
        WeightUpdate w = u.update;
        u.job->loop().run([w]() mutable -> asio::awaitable<bool> {
          co_await w.wait();
          co_return true;
        });
      }, "Blocks until the staging is complete; raises nereus.Error when the copy failed.")
      .def("finish", [](PyUpdate& u, const std::string& pause, const py::object& stream) {
        const PauseMode p = parse_pause_mode(pause);
        std::vector<FrameworkStream> streams = framework_streams(stream);
        WeightUpdate w = u.update;
        return update_dict(u.job->loop().run([w, p, streams]() mutable { return w.finish(p, streams); }));
      }, py::arg("pause") = "keep", py::arg("stream") = py::none(),
         "Switches the staged weights in: 'wait' after the stage's run in flight, 'keep' now (between two decode "
         "steps; the KV cache stays), 'abort' now, telling the run in flight to drop its sequences. Returns the report.")
      .def("cancel", [](PyUpdate& u) { u.job->loop().call([&] { u.update.cancel(); }); });

  py::class_<PyJob, std::shared_ptr<PyJob>>(m, "Job", "A job embedded in this process (docs/embedding.md).")
      .def(py::init([](const std::string& job, py::object plan, int devices, py::object capacity, double headroom,
                       std::uint64_t seed, unsigned copy_threads, py::object adopt, bool fill, py::object cluster,
                       const std::string& policy, double gamma, const std::string& memory) {
             return std::make_shared<PyJob>(job, plan, devices, capacity, headroom, seed, copy_threads, adopt, fill, cluster,
                                            policy, gamma, "", memory);
           }),
           py::arg("job"), py::arg("plan"), py::arg("devices") = 8, py::arg("capacity") = "1GiB", py::arg("headroom") = 0.1,
           py::arg("seed") = 1, py::arg("copy_threads") = 1, py::arg("adopt") = py::none(), py::arg("fill") = false,
           py::arg("cluster") = py::none(), py::arg("policy") = "nereus", py::arg("gamma") = 0.5, py::arg("memory") = "host")
      .def_static(
          "resume",
          [](const std::string& checkpoint, const std::string& job, int devices, py::object capacity, double headroom,
             unsigned copy_threads, py::object cluster, const std::string& policy, double gamma, const std::string& memory) {
            return std::make_shared<PyJob>(job, py::none(), devices, capacity, headroom, 1, copy_threads, py::none(), false,
                                           cluster, policy, gamma, checkpoint, memory);
          },
          py::arg("checkpoint"), py::arg("job"), py::arg("devices") = 8, py::arg("capacity") = "1GiB",
          py::arg("headroom") = 0.1, py::arg("copy_threads") = 1, py::arg("cluster") = py::none(),
          py::arg("policy") = "nereus", py::arg("gamma") = 0.5, py::arg("memory") = "host", "A job continued from save_checkpoint(checkpoint).")
      .def_property_readonly("mode", [](PyJob& j) { return std::string(j.spec().async ? "async" : "sync"); })
      .def_property_readonly("max_staleness", [](PyJob& j) { return j.spec().max_staleness; })
      .def("weight_updates", [](PyJob& j) {
        py::list out;
        for (const WeightUpdateReport& r : j.loop().call([&] { return j.job().weight_updates(); })) out.append(update_dict(r));
        return out;
      }, "Async jobs: the report of every weight update switched in so far, in order.")
      .def("begin_weight_update", [](const std::shared_ptr<PyJob>& j, const std::string& stage) {
        return PyUpdate{j, j->loop().call([&] { return j->job().begin_weight_update(stage); })};
      }, py::arg("model_stage"),
         "Async jobs: starts copying the trainer's latest params into staging beside a generation stage's units while "
         "it keeps running; returns a WeightUpdate.")
      .def_property_readonly("step", [](PyJob& j) { return j.loop().call([&] { return j.job().step(); }); })
      .def_property_readonly("plan", [](PyJob& j) { return plan_dict(j.loop().call([&] { return j.job().plan(); })); })
      .def_property_readonly("model_stages", [](PyJob& j) {
        std::vector<std::string> names;
        for (const ModelStage& s : model_stages(j.spec())) names.push_back(s.name());
        return names;
      })
      .def("units", [](const std::shared_ptr<PyJob>& j, const std::string& stage) {
        const auto views = j->loop().call([&] { return j->job().units(stage); });
        py::list out;
        for (const UnitView& v : views) out.append(PyUnit{j, stage, v, {}});
        return out;
      }, py::arg("model_stage"))
      .def("state", [](PyJob& j, const std::string& stage) {
        return state_dict(j.loop().call([&] { return j.job().state(stage); }));
      }, py::arg("model_stage"))
      .def("devices", [](PyJob& j) {
        py::list out;
        for (const DeviceUse& d : j.loop().call([&] { return j.job().devices(); })) {
          py::dict e;
          e["device"] = d.device;
          e["used"] = d.used;
          e["peak"] = d.peak;
          e["budget"] = d.budget;
          e["step_peak"] = d.step_peak;
          out.append(e);
        }
        return out;
      })
      .def("verify", [](PyJob& j) {
        const FillCheck c = j.loop().call([&] { return j.job().verify(); });
        py::dict d;
        d["ok"] = c.ok;
        d["buffers"] = c.buffers;
        d["bytes"] = c.bytes;
        d["first_error"] = c.first_error;
        return d;
      }, "Checks every live unit against the verification fill (jobs made with fill=True).")
      .def("stage", [](const std::shared_ptr<PyJob>& j, const std::string& stage, const py::object& stream) {
        return std::make_unique<PyStage>(j, stage, framework_streams(stream));
      }, py::arg("model_stage"), py::arg("stream") = py::none(),
         "Holds a model-stage's devices for a `with` block. `stream`: where the block's GPU work was enqueued "
         "(default: each GPU's default stream); the devices are given back once it completes.")
      .def("set_workspace", [](PyJob& j, const std::string& stage, std::uint64_t nbytes) {
        j.loop().call([&] { j.job().set_workspace(stage, nbytes); });
      }, py::arg("model_stage"), py::arg("nbytes"),
         "Bytes per device each run of the stage allocates as its workspace from now on (Unit.workspace).")
      .def("end_step", [](PyJob& j, const py::object& stream) {
        const std::vector<FrameworkStream> streams = framework_streams(stream);
        j.loop().run([&] { return j.job().end_step(streams); });
      }, py::arg("stream") = py::none(),
           "Ends the step: weight sync, and a transition begun mid-step takes effect. GPU memory: after the "
           "framework's work on `stream` (default: each GPU's default stream).")
      .def("transition", [](PyJob& j, py::object plan, const py::object& stream) {
        const GlobalPlan target = j.parse_plan(plan);
        const std::vector<FrameworkStream> streams = framework_streams(stream);
        return report_dict(j.loop().run([&] { return j.job().transition(target, streams); }));
      }, py::arg("plan"), py::arg("stream") = py::none(), "Changes plan between steps; blocks until done and returns the report.")
      .def("begin_transition", [](const std::shared_ptr<PyJob>& j, py::object plan, const py::object& stream) {
        const GlobalPlan target = j->parse_plan(plan);
        const std::vector<FrameworkStream> streams = framework_streams(stream);
        return PyTransition{j, j->loop().call([&] { return j->job().begin_transition(target, streams); })};
      }, py::arg("plan"), py::arg("stream") = py::none(),
         "Starts a transition; it runs alongside the stages that follow (GPU memory: after the framework's work on `stream`).")
      .def("report_step", [](PyJob& j, std::map<std::string, double> stage_seconds, double response_len_mean,
                             double response_len_p95, std::optional<int> gpus, double link_slowdown, std::uint64_t peak_bytes,
                             std::optional<double> next_response_len_mean, std::optional<double> next_response_len_p95) {
        StepObservation o;
        o.stage_seconds.assign(stage_seconds.begin(), stage_seconds.end());
        o.response_len_mean = response_len_mean;
        o.response_len_p95 = response_len_p95;
        o.peak_bytes = peak_bytes;
        o.next.step = j.loop().call([&] { return j.job().step(); });
        o.next.gpus = gpus ? *gpus : static_cast<int>(j.loop().call([&] { return j.job().devices(); }).size());
        o.next.response_len_mean = next_response_len_mean.value_or(response_len_mean);
        o.next.response_len_p95 = next_response_len_p95.value_or(response_len_p95);
        o.next.link_slowdown = link_slowdown;
        const Decision d = j.report(o);
        // No plan the controller can reach runs the next step: the job stops here, with the
        // controller's reason, rather than in the next stage that runs out of memory.
        if (d.blocked) throw Error("controller: " + d.why);
        return decision_dict(d, j.gamma());
      }, py::arg("stage_seconds"), py::arg("response_len_mean"), py::arg("response_len_p95"), py::arg("gpus") = py::none(),
         py::arg("link_slowdown") = 1.0, py::arg("peak_bytes") = 0, py::arg("next_response_len_mean") = py::none(),
         py::arg("next_response_len_p95") = py::none(),
         "Feeds the live controller one step's measurements; returns its decision for the next step. Raises "
         "nereus.Error when the next step cannot run on the current plan and no plan that can is reachable.")
      .def("load_weights", [](PyJob& j, const std::string& what, const std::string& path) {
        j.loop().call([&] { j.job().load_weights(what, path); });
      }, py::arg("what"), py::arg("path"))
      .def("save_weights", [](PyJob& j, const std::string& stage, const std::string& path, const std::string& slot) {
        Slot s = Slot::param;
        bool found = false;
        for (Slot x : kTrainSlots)
          if (to_string(x) == slot) s = x, found = true;
        if (!found) throw Error("unknown slot '" + slot + "' (param, master, exp_avg, exp_avg_sq)");
        j.loop().call([&] { j.job().save_weights(stage, path, s); });
      }, py::arg("model_stage"), py::arg("path"), py::arg("slot") = "param")
      .def("save_checkpoint", [](PyJob& j, const std::string& dir) { j.loop().call([&] { j.job().save_checkpoint(dir); }); },
           py::arg("dir"));
}

}  // namespace nereus::python

PYBIND11_MODULE(_nereus, m) {
  m.doc() = "Nereus embedded in a Python RLHF framework (docs/embedding.md)";
  // Log lines (the live controller's decisions at info) go to stderr at NEREUS_LOG's level.
  nereus::init_logging("nereus", -1, nereus::LogLevel::warn);
  m.def(
      "set_log_level", [](const std::string& level) { nereus::set_log_level(nereus::parse_log_level(level)); }, pybind11::arg("level"),
      "Log level of Nereus's lines on stderr: error, warn (default), info (the controller's decisions), debug, trace.");
  nereus::python::bind_job(m);
#ifdef NEREUS_HAVE_CLUSTER
  nereus::python::bind_member(m);
#endif
}
