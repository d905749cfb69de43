// The embedded job behind the Python module: its loop thread, construction from Python
// arguments, and the live controller.
#include "py_job.hpp"

#include <nlohmann/json.hpp>

#include "nereus/base/error.hpp"
#include "nereus/core/bytes.hpp"
#include "nereus/core/cluster.hpp"

namespace nereus::python {

Loop::Loop()
    : guard_(io_.get_executor()), thread_([this] {
        while (!closing_) io_.run_one_for(std::chrono::milliseconds(20));
        // Close: run what is ready (a stopped transition winding down); what still waits
        // (a stage nobody left) is abandoned with the io_context.
        while (io_.poll() > 0) {
        }
      }) {}

Loop::~Loop() {
  closing_ = true;
  guard_.reset();
  if (thread_.joinable()) {
    if (on_loop())
      thread_.detach();
    else
      thread_.join();
  }
}

namespace {

std::size_t capacity_of(py::handle c) {
  if (py::isinstance<py::int_>(c)) return c.cast<std::size_t>();
  return parse_capacity(py::str(c).cast<std::string>());
}

/// A cluster for the controller: a preset or file, or one "node" of the job's host devices.
ClusterSpec cluster_of(py::handle c, int devices, std::size_t capacity) {
  if (!c.is_none()) return load_cluster(py::str(c).cast<std::string>());
  return host_cluster(devices, capacity);
}

}  // namespace

AdoptedBuffer adopted_of(py::handle entry, std::vector<py::object>& keep) {
  if (!py::isinstance<py::dict>(entry)) throw Error("adopt: each entry is a dict {stage, replica, device, buffer, slot, tensor}");
  const py::dict d = py::reinterpret_borrow<py::dict>(entry);
  auto need = [&](const char* key) -> py::object {
    if (!d.contains(key)) throw Error(std::string("adopt: an entry lacks '") + key + "'");
    return d[key];
  };
  AdoptedBuffer a;
  a.model_stage = py::str(need("stage")).cast<std::string>();
  a.replica = d.contains("replica") ? d["replica"].cast<int>() : 0;
  a.device = need("device").cast<DeviceId>();
  a.buffer = py::str(need("buffer")).cast<std::string>();
  const std::string slot = d.contains("slot") ? py::str(d["slot"]).cast<std::string>() : "param";
  bool found = false;
  for (Slot s : kTrainSlots)
    if (to_string(s) == slot) a.slot = s, found = true;
  if (!found) throw Error("adopt: unknown slot '" + slot + "' (param, master, exp_avg, exp_avg_sq)");
  py::object t = need("tensor");
  if (!py::hasattr(t, "data_ptr") || !py::hasattr(t, "is_contiguous"))
    throw Error("adopt: 'tensor' of " + a.buffer + " is not a torch tensor");
  if (!t.attr("is_contiguous")().cast<bool>()) throw Error("adopt: the tensor for " + a.buffer + " is not contiguous");
  const std::string where = py::str(t.attr("device").attr("type")).cast<std::string>();
  if (where == "cuda") {
    a.kind = MemoryKind::cuda;  // the job checks it against its own memory and GPU
    a.gpu = t.attr("device").attr("index").cast<int>();
  } else if (where != "cpu") {
    throw Error("adopt: the tensor for " + a.buffer + " is in " + where + " memory; units live in host (cpu) or cuda memory");
  }
  a.data = reinterpret_cast<std::byte*>(t.attr("data_ptr")().cast<std::uintptr_t>());
  a.bytes = t.attr("numel")().cast<std::size_t>() * t.attr("element_size")().cast<std::size_t>();
  keep.push_back(std::move(t));
  return a;
}

GlobalPlan PyJob::parse_plan(py::handle plan) const {
  if (py::isinstance<py::dict>(plan)) {
    nlohmann::json j = nlohmann::json::object();
    for (auto [k, v] : py::reinterpret_borrow<py::dict>(plan)) j[py::str(k).cast<std::string>()] = py::str(v).cast<std::string>();
    return parse_global_plan(spec_, j.dump(), "plan");
  }
  if (py::isinstance<py::str>(plan)) return load_global_plan(spec_, plan.cast<std::string>());
  throw py::type_error("plan: a dict {model-stage: layout spec}, a plan file's path or its JSON text");
}

PyJob::PyJob(const std::string& job, py::object plan, int devices, py::object capacity, double headroom,
             std::uint64_t seed, unsigned copy_threads, py::object adopt, bool fill, py::object cluster,
             const std::string& policy, double gamma, const std::string& resume_from, const std::string& memory)
    : spec_(load_job(job)) {
  JobOptions o;
  o.devices = devices;
  o.capacity = capacity_of(capacity);
  o.headroom = headroom;
  o.seed = seed;
  o.copy_threads = copy_threads;
  o.fill = fill;
  if (memory != "host" && memory != "cuda") throw Error("memory must be 'host' or 'cuda', not '" + memory + "'");
  o.memory = memory == "cuda" ? MemoryKind::cuda : MemoryKind::host;
  if (!adopt.is_none())
    for (py::handle e : adopt) o.adopt.push_back(adopted_of(e, adopted_));
  ControllerOptions co;
  int every = 0;
  co.policy = parse_policy(policy, every);
  co.every = every > 0 ? every : co.every;
  co.gamma = gamma;
  gamma_ = gamma;
  co.headroom = headroom;
  const ClusterSpec cl = cluster_of(cluster, devices, o.capacity);
  std::optional<GlobalPlan> initial;
  if (resume_from.empty()) initial = parse_plan(plan);
  loop_ = std::make_unique<Loop>();
  job_ = loop_->call([&] {
    if (!resume_from.empty()) return Job::resume(loop_->executor(), spec_, resume_from, o);
    return std::make_unique<Job>(loop_->executor(), spec_, *initial, o);
  });
  // The controller refers to the job's spec, which the Job owns for its whole life.
  controller_.emplace(job_->spec(), cl, co);
}

PyJob::~PyJob() {
  // The job is destroyed on its loop, where a transition in flight is stopped.
  py::gil_scoped_release unlocked;
  if (job_ && !loop_->on_loop()) {
    auto done = std::make_shared<std::promise<void>>();
    auto finished = done->get_future();
    loop_->post([this, done] {
      job_.reset();
      done->set_value();
    });
    finished.wait();
  }
  job_.reset();
  loop_.reset();
}

Decision PyJob::report(const StepObservation& o) {
  // An async job's controller plans the pool split between its streams and charges a plan
  // change the drain (controller.hpp); the stage times calibrate it as in a sync job.
  const GlobalPlan current = loop_->call([&] { return job_->plan(); });
  py::gil_scoped_release unlocked;
  return controller_->step(current, o);
}

}  // namespace nereus::python
