#pragma once
// The Python module's view of an embedded job: the C++ Job on its own event-loop thread,
// which never takes the GIL; Python threads hand it work and wait with the GIL released,
// so a Python stage computing for seconds never holds up a transition's transfers.
#include <pybind11/pybind11.h>

#include <boost/asio/use_future.hpp>
#include <atomic>
#include <future>
#include <memory>
#include <optional>
#include <thread>

#include "nereus/base/asio.hpp"
#include "nereus/control/controller.hpp"
#include "nereus/runtime/job.hpp"

namespace nereus::python {

namespace py = pybind11;

/// One entry of `adopt=` (a dict {stage, replica, device, buffer, slot, tensor}) as the
/// framework memory it names; the tensor goes to `keep`, which must outlive its use.
AdoptedBuffer adopted_of(py::handle entry, std::vector<py::object>& keep);

/// The job's event loop: one thread running an io_context until closed.
class Loop {
 public:
  Loop();
  ~Loop();
  asio::any_io_executor executor() { return io_.get_executor(); }
  bool on_loop() const { return std::this_thread::get_id() == thread_.get_id(); }

  /// Runs f() on the loop and returns its result; the caller waits without the GIL.
  template <class F>
  auto call(F f) -> decltype(f()) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto result = task.get_future();
    asio::post(io_, [&task] { task(); });
    py::gil_scoped_release unlocked;
    return result.get();
  }
  /// Runs a coroutine made by make() on the loop; the caller waits without the GIL.
  template <class Make>
  auto run(Make make) -> typename decltype(make())::value_type {
    auto result = asio::co_spawn(io_, make(), asio::use_future);
    py::gil_scoped_release unlocked;
    return result.get();
  }
  void post(std::function<void()> f) { asio::post(io_, std::move(f)); }

 private:
  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard_;
  std::atomic<bool> closing_ = false;
  std::thread thread_;
};

/// A job as Python holds it. Shards, stages and transitions keep it alive, so memory a
/// tensor view points into stays mapped while the view exists.
class PyJob : public std::enable_shared_from_this<PyJob> {
 public:
  PyJob(const std::string& job, py::object plan, int devices, py::object capacity, double headroom, std::uint64_t seed,
        unsigned copy_threads, py::object adopt, bool fill, py::object cluster, const std::string& policy, double gamma,
        const std::string& resume_from, const std::string& memory = "host");
  ~PyJob();

  Loop& loop() { return *loop_; }
  Job& job() { return *job_; }
  const JobSpec& spec() const { return spec_; }
  GlobalPlan parse_plan(py::handle plan) const;
  /// Decision of the live controller after a step.
  Decision report(const StepObservation& o);
  double gamma() const { return gamma_; }


 private:
  JobSpec spec_;
  std::unique_ptr<Loop> loop_;
  std::unique_ptr<Job> job_;
  std::optional<Controller> controller_;
  std::vector<py::object> adopted_;  ///< framework tensors backing units: kept alive
  double gamma_ = 0.5;
};

/// Registers Job, Unit, Shard, Stage, Transition and Error in module m.
void bind_job(py::module_& m);
/// Registers Member, Step and NodeUnit (py_member.cpp); after bind_job.
void bind_member(py::module_& m);
/// `views` (of `model_stage`'s units in `job`) as Shard objects of one slot (None: all);
/// `owner` keeps their memory mapped while one exists; with `unit` (its lifetime, named
/// `unit_name`), using one after that unit is freed raises.
py::list shards_of(std::shared_ptr<const void> owner, const JobSpec& job, std::string_view model_stage,
                   const std::vector<ShardView>& views, const std::optional<std::string>& slot,
                   const std::optional<std::weak_ptr<const void>>& unit = std::nullopt, const std::string& unit_name = "");

}  // namespace nereus::python
