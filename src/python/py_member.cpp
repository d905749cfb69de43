// `nereus.Member`: a framework process as its node of a cluster (cluster/member.hpp,
// docs/cluster.md "A framework as a node"). The node's daemon runs on its own thread and
// never takes the GIL; next_step() waits with the GIL released, a slice at a time, so
// Ctrl-C reaches Python.
#include <pybind11/stl.h>

#include <chrono>
#include <cstdlib>

#include "nereus/base/error.hpp"
#include "nereus/cluster/auth.hpp"
#include "nereus/cluster/member.hpp"
#include "nereus/core/bytes.hpp"
#include "nereus/runtime/job.hpp"
#include "py_job.hpp"

namespace nereus::python {

namespace {

using cluster::Member;
using cluster::NodeStep;
using cluster::NodeUnit;

struct PyMember {
  std::unique_ptr<Member> member;
  std::vector<py::object> adopted;  ///< the framework's tensors backing units: outlive the member
  ~PyMember() {
    py::gil_scoped_release unlocked;  // joining the node's thread
    member.reset();
  }
};

/// One unit of the step as far as it lives on this node; valid until report().
struct PyNodeUnit {
  std::shared_ptr<PyMember> owner;
  std::shared_ptr<const JobSpec> job;
  NodeUnit unit;
};

struct PyStep {
  std::int64_t step = 0;
  double response_len = 0;
  std::map<std::string, int> replicas;
  py::list units;
  std::string stream = "whole";
  std::int64_t weight_version = 0;
};

cluster::StepStream stream_of(const std::string& name) {
  for (auto s : {cluster::StepStream::whole, cluster::StepStream::generation, cluster::StepStream::training})
    if (name == cluster::to_string(s)) return s;
  throw Error("stream must be 'whole', 'generation' or 'training', not '" + name + "'");
}

cluster::DaemonOptions options_of(const std::string& coordinator, std::optional<int> rank, std::optional<int> nodes,
                                  const std::optional<std::string>& token_file, int devices, py::handle capacity,
                                  const std::string& listen, const std::optional<std::string>& advertise,
                                  const std::optional<std::string>& metrics, int heartbeat_ms, int dead_after_ms,
                                  int join_timeout_ms, const std::string& memory) {
  cluster::DaemonOptions o;
  cluster::LaunchArgs l;
  l.coordinator = coordinator;
  l.node_rank = rank;
  l.nodes = nodes;
  l.listen = listen;
  o.launch = cluster::resolve_launch(l, [](const char* k) { return std::getenv(k); });
  o.token = cluster::load_token(token_file.value_or(""));
  if (devices < 1) throw Error("devices: at least one, got " + std::to_string(devices));
  o.devices = devices;
  if (memory != "host" && memory != "cuda") throw Error("memory must be 'host' or 'cuda', not '" + memory + "'");
  o.device_kind = memory == "cuda" ? MemoryKind::cuda : MemoryKind::host;
  o.device_capacity = py::isinstance<py::int_>(capacity) ? capacity.cast<std::uint64_t>() : parse_capacity(py::str(capacity).cast<std::string>());
  if (advertise) o.advertise = cluster::parse_endpoint(*advertise, "advertise");
  if (metrics) o.metrics = cluster::parse_endpoint(*metrics, "metrics");
  if (heartbeat_ms < 1 || dead_after_ms <= heartbeat_ms) throw Error("dead_after_ms must exceed heartbeat_ms, and both be positive");
  o.heartbeat_every = cluster::Millis(heartbeat_ms);
  o.dead_after = cluster::Millis(dead_after_ms);
  o.join_limit = cluster::Millis(join_timeout_ms);
  return o;
}

/// The unit's shards on this node; GPU memory is exported as its GPU's (kDLCUDA).
std::vector<ShardView> views_of(const NodeUnit& u) {
  std::vector<ShardView> views = shard_views(u.buffers, u.memory);
  std::map<DeviceId, int> gpu;
  for (std::size_t b = 0; b < u.buffers.size() && b < u.gpu.size(); ++b) gpu[u.buffers[b].key.device] = u.gpu[b];
  for (ShardView& v : views) {
    v.kind = u.kind;
    v.gpu = gpu[v.device];
  }
  return views;
}

}  // namespace

void bind_member(py::module_& m) {
  py::class_<PyNodeUnit>(m, "NodeUnit", "A unit of a Member's step, as far as it lives on this node.")
      .def_property_readonly("id", [](const PyNodeUnit& u) { return u.unit.id; })
      .def_property_readonly("model_stage", [](const PyNodeUnit& u) { return u.unit.model_stage; })
      .def_property_readonly("replica", [](const PyNodeUnit& u) { return u.unit.replica; })
      .def_property_readonly("devices", [](const PyNodeUnit& u) { return u.unit.emu.gpus; },
                             "Every GPU of the unit (global ids); shards() holds this node's.")
      .def_property_readonly("layout", [](const PyNodeUnit& u) { return to_string(u.unit.emu.layout); })
      .def(
          "shards",
          [](const PyNodeUnit& u, std::optional<std::string> slot) {
            return shards_of(u.owner, *u.job, u.unit.model_stage, views_of(u.unit), slot);
          },
          py::arg("slot") = "param", "Its shards on this node of one slot (None: every slot), buffer by buffer.")
      .def("__repr__", [](const PyNodeUnit& u) {
        return "<NodeUnit " + u.unit.model_stage + " #" + std::to_string(u.unit.replica) + " " + to_string(u.unit.emu.layout) +
               " on " + device_list_string(u.unit.emu.gpus) + ">";
      });

  py::class_<PyStep>(m, "Step", "A step the coordinator asks this node to run.")
      .def_readonly("step", &PyStep::step)
      .def_readonly("response_len", &PyStep::response_len, "The mean response length the coordinator expects.")
      .def_readonly("replicas", &PyStep::replicas, "Each model-stage's unit count (its DP degree).")
      .def_readonly("units", &PyStep::units, "The current units with memory on this node (of the step's stream).")
      .def_readonly("stream", &PyStep::stream,
                    "'whole' (sync jobs), or in an async job 'generation' or 'training' (docs/cluster.md).")
      .def_readonly("weight_version", &PyStep::weight_version,
                    "Of a generation step, the weight version its units hold; of a training step, the one it trains from.")
      .def("__repr__", [](const PyStep& s) {
        return "<Step " + std::to_string(s.step) + (s.stream == "whole" ? std::string() : " " + s.stream) + ", " +
               std::to_string(py::len(s.units)) + " units here>";
      });

  py::class_<PyMember, std::shared_ptr<PyMember>>(m, "Member",
                                                  "This process as its node of a cluster: the node's daemon runs inside it "
                                                  "(docs/cluster.md, \"A framework as a node\").")
      .def(py::init([](const std::string& coordinator, std::optional<int> rank, std::optional<int> nodes,
                       std::optional<std::string> token_file, int devices, py::object capacity, const std::string& listen,
                       std::optional<std::string> advertise, std::optional<std::string> metrics, int heartbeat_ms,
                       int dead_after_ms, int join_timeout_ms, py::object adopt, const std::string& memory) {
             auto o = options_of(coordinator, rank, nodes, token_file, devices, capacity, listen, advertise, metrics, heartbeat_ms,
                                 dead_after_ms, join_timeout_ms, memory);
             auto p = std::make_shared<PyMember>();
             if (!adopt.is_none())
               for (py::handle e : adopt) o.adopt.push_back(adopted_of(e, p->adopted));
             py::gil_scoped_release unlocked;
             p->member = std::make_unique<Member>(std::move(o));
             return p;
           }),
           py::arg("coordinator") = "", py::arg("rank") = py::none(), py::arg("nodes") = py::none(),
           py::arg("token_file") = py::none(), py::arg("devices") = 1, py::arg("capacity") = "1GiB",
           py::arg("listen") = "127.0.0.1:0", py::arg("advertise") = py::none(), py::arg("metrics") = py::none(),
           py::arg("heartbeat_ms") = 250,
           py::arg("dead_after_ms") = 1500, py::arg("join_timeout_ms") = 60000, py::arg("adopt") = py::none(),
           py::arg("memory") = "host")
      .def_property_readonly("listening", [](const PyMember& p) { return p.member->listening().str(); })
      .def_property_readonly("running", [](const PyMember& p) { return p.member->running(); })
      .def_property_readonly(
          "metrics_listening",
          [](const PyMember& p) -> std::optional<std::string> {
            const auto at = p.member->metrics_listening();
            return at ? std::optional<std::string>(at->str()) : std::nullopt;
          },
          "Where the node's Prometheus endpoint listens (metrics=HOST:PORT), or None.")
      .def(
          "next_step",
          [](const std::shared_ptr<PyMember>& p, std::optional<double> timeout) -> py::object {
            using namespace std::chrono;
            const auto until = steady_clock::now() + duration_cast<steady_clock::duration>(duration<double>(timeout.value_or(1e9)));
            for (;;) {
              bool ready;
              {
                py::gil_scoped_release unlocked;
                ready = p->member->wait(milliseconds(100));
              }
              if (ready) break;
              if (PyErr_CheckSignals() != 0) throw py::error_already_set();
              if (steady_clock::now() >= until) throw Error("no step from the coordinator within " + std::to_string(*timeout) + " s");
            }
            std::optional<NodeStep> s;
            {
              py::gil_scoped_release unlocked;
              s = p->member->next_step();
            }
            if (!s) return py::none();
            PyStep out{s->step, s->response_len, s->replicas, py::list(), cluster::to_string(s->stream), s->weight_version};
            for (NodeUnit& u : s->units) out.units.append(PyNodeUnit{p, s->job, std::move(u)});
            return py::cast(std::move(out));
          },
          py::arg("timeout") = py::none(),
          "The next step (a Step), or None once the job on this node ended. Raises Error after `timeout` seconds "
          "without either, or when the node stopped.")
      .def(
          "report",
          [](PyMember& p, std::map<std::string, double> stage_seconds, double response_len_mean, double response_len_p95,
             std::uint64_t peak_bytes, std::optional<std::string> stream) {
            cluster::StepDone d{{stage_seconds.begin(), stage_seconds.end()}, response_len_mean, response_len_p95, peak_bytes};
            if (stream)
              p.member->report(stream_of(*stream), std::move(d));
            else
              p.member->report(std::move(d));
          },
          py::arg("stage_seconds") = std::map<std::string, double>{}, py::arg("response_len_mean") = 0.0,
          py::arg("response_len_p95") = 0.0, py::arg("peak_bytes") = 0, py::arg("stream") = py::none(),
          "Answers the step with what this node measured; its units' views are invalid from here on. In an async "
          "job, where a generation and a training step may be in hand at once, `stream` names which one it answers.")
      .def("stop", [](PyMember& p) { p.member->stop(); }, "Stops the node; its units are freed.");
}

}  // namespace nereus::python
