// Embedding a job in a framework: shard views of the units, framework-owned memory as
// units, stages held from the framework's threads, safetensors in and out, checkpoints
// that resume a run bit for bit.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "nereus/core/packing.hpp"
#include "nereus/core/safetensors.hpp"
#include "nereus/runtime/job.hpp"
#include "run_async.hpp"
#include "unit_values.hpp"
#include "test_util.hpp"

using namespace nereus;
using testing::error_of;
using testing::has;
using testing::run_on;
using testing::write_values;
using testing::wrong_values;
using testing::value;
using testing::each_element;

namespace {

const char* kPlanTp4 = R"({"actor/generate": "tp=2,pp=1,dp=2,devices=0-3",
  "actor/infer": "tp=2,pp=1,dp=1,devices=0-1", "critic/infer": "tp=2,pp=1,dp=1,devices=2-3",
  "reference/infer": "tp=2,pp=1,dp=1,devices=0-1", "reward/infer": "tp=2,pp=1,dp=1,devices=2-3",
  "actor/train": "tp=4,pp=1,dp=1,devices=0-3", "critic/train": "tp=4,pp=1,dp=1,devices=4-7"})";
const char* kPlanTp2Dp2 = R"({"actor/generate": "tp=2,pp=1,dp=2,devices=0-3",
  "actor/infer": "tp=2,pp=1,dp=1,devices=0-1", "critic/infer": "tp=2,pp=1,dp=1,devices=2-3",
  "reference/infer": "tp=2,pp=1,dp=1,devices=0-1", "reward/infer": "tp=2,pp=1,dp=1,devices=2-3",
  "actor/train": "tp=2,pp=1,dp=2,devices=4-7", "critic/train": "tp=2,pp=1,dp=2,devices=0-3"})";
const char* kPlanPp = R"({"actor/generate": "tp=2,pp=1,dp=2,devices=0-3",
  "actor/infer": "tp=2,pp=1,dp=1,devices=0-1", "critic/infer": "tp=2,pp=1,dp=1,devices=2-3",
  "reference/infer": "tp=2,pp=1,dp=1,devices=0-1", "reward/infer": "tp=2,pp=1,dp=1,devices=2-3",
  "actor/train": "tp=1,pp=2,dp=2,devices=0-3", "critic/train": "tp=2,pp=2,dp=1,devices=4-7"})";

JobOptions opts() {
  JobOptions o;
  o.devices = 8;
  o.capacity = 64 << 20;
  o.copy_threads = 1;
  return o;
}

std::string temp_dir(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("nereus-embed-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

std::vector<std::byte> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

}  // namespace

TEST_CASE("embed: shard views tile every tensor and slot; writes through them are what transitions move") {
  asio::io_context io;
  const JobSpec spec = load_job("ppo-tiny");
  Job job(io.get_executor(), spec, load_global_plan(spec, kPlanTp4), opts());
  const ModelSpec& m = *spec.model("actor");
  const auto units = job.units("actor/train");
  REQUIRE(units.size() == 1);
  // Every element of every (tensor, slot) is covered by the unit's boxes exactly tp times
  // at most (replicated tensors) and at least once.
  for (Slot s : kTrainSlots)
    for (TensorId t = 0; t < m.tensors().size(); ++t) {
      std::int64_t covered = 0;
      for (const ShardView& v : units[0].shards)
        if (v.tensor == t && v.slot == s) {
          covered += v.box.elements();
          CHECK(v.dtype == slot_dtype(s, m.config().dtype));
        }
      CHECK(covered >= m.tensor(t).elements());
    }
  write_values(m, units);
  CHECK(wrong_values(m, job.units("actor/train")) == 0);
  for (const char* plan : {kPlanTp2Dp2, kPlanPp, kPlanTp4}) {
    CAPTURE(plan);
    const TransitionReport r = run_on(io, job.transition(load_global_plan(spec, plan)));
    REQUIRE(r.completed);
    CHECK(wrong_values(m, job.units("actor/train")) == 0);
  }
  CHECK(has(error_of([&] { job.units("actor/nope"); }), "not a model-stage"));
}

TEST_CASE("embed: framework-owned memory backs units, is moved in place and counted") {
  asio::io_context io;
  const JobSpec spec = load_job("ppo-tiny");
  const GlobalPlan plan = load_global_plan(spec, kPlanTp4);
  // What the framework holds: one vector per buffer of actor/train's param slot.
  Job look(io.get_executor(), spec, plan, opts());
  std::vector<std::vector<float>> owned;
  JobOptions o = opts();
  const ModelSpec& m = *spec.model("actor");
  std::uint64_t adopted_bytes = 0, arena_bytes = 0;
  for (const UnitView& u : look.units("actor/train"))
    for (const ShardView& v : u.shards)
      if (v.slot == Slot::param) {  // hf packing: one tensor per buffer
        owned.emplace_back((v.bytes() + 3) / 4);
        o.adopt.push_back({"actor/train", u.replica, v.device, m.tensor(v.tensor).name, Slot::param,
                           reinterpret_cast<std::byte*>(owned.back().data()), owned.back().size() * 4});
        adopted_bytes += owned.back().size() * 4;
        arena_bytes += (v.bytes() + 255) / 256 * 256;  // what the arena allocator would have taken
      }
  Job job(io.get_executor(), spec, plan, o);
  std::uint64_t used = 0, look_used = 0;
  for (const DeviceUse& d : job.devices()) used += d.used;
  for (const DeviceUse& d : look.devices()) look_used += d.used;
  // The adopted buffers replace those arena allocations and count at their own size.
  CHECK(used == look_used - arena_bytes + adopted_bytes);
  std::size_t k = 0;
  const std::vector<UnitView> adopted_units = job.units("actor/train");
  for (const ShardView& v : adopted_units[0].shards)
    if (v.slot == Slot::param) {
      const auto* mine = reinterpret_cast<const std::byte*>(owned[k].data());
      ++k;
      CHECK(v.data == mine);
    }
  write_values(m, job.units("actor/train"));  // the framework writes its own tensors
  REQUIRE(run_on(io, job.transition(load_global_plan(spec, kPlanTp2Dp2))).completed);
  CHECK(wrong_values(m, job.units("actor/train")) == 0);
  const std::vector<UnitView> new_units = job.units("actor/train");
  for (const ShardView& v : new_units[0].shards)  // the new units live in arenas
    for (const auto& vec : owned) CHECK(v.data != reinterpret_cast<const std::byte*>(vec.data()));

  JobOptions bad = opts();
  bad.adopt.push_back({"actor/train", 0, 0, "model.nope.weight", Slot::param, reinterpret_cast<std::byte*>(owned[0].data()), 4});
  CHECK(has(error_of([&] { Job(io.get_executor(), spec, plan, bad); }), "no buffer 'model.nope.weight@param' on device 0"));
  bad.adopt[0].buffer = m.tensor(0).name;
  CHECK(has(error_of([&] { Job(io.get_executor(), spec, plan, bad); }), "but the buffer needs"));
}

TEST_CASE("embed: a stage held from the framework's side lets a transition on other devices finish") {
  asio::io_context io;
  const JobSpec spec = load_job("ppo-tiny");
  Job job(io.get_executor(), spec, load_global_plan(spec, kPlanTp4), opts());
  // The framework holds critic/infer (devices 2-3) while reference/infer changes layout on
  // 0-1 (a model no stage trains, so nothing waits for this step's update).
  StageLease lease = run_on(io, job.enter_stage("critic/infer"));  // devices 2-3
  CHECK(lease.units().size() == 1);
  CHECK(has(error_of([&] { run_on(io, job.enter_stage("critic/infer")); }), "already running"));
  const GlobalPlan to = load_global_plan(spec, R"({"actor/generate": "tp=2,pp=1,dp=2,devices=0-3",
  "actor/infer": "tp=2,pp=1,dp=1,devices=0-1", "critic/infer": "tp=2,pp=1,dp=1,devices=2-3",
  "reference/infer": "tp=1,pp=1,dp=2,devices=0-1", "reward/infer": "tp=2,pp=1,dp=1,devices=2-3",
  "actor/train": "tp=4,pp=1,dp=1,devices=0-3", "critic/train": "tp=4,pp=1,dp=1,devices=4-7"})");
  TransitionHandle h = job.begin_transition(to);
  const TransitionReport r = run_on(io, h.wait());  // while the lease is still held
  CHECK(r.completed);
  lease.leave();
  CHECK(job.state("critic/infer").policy_version == 0);
}

namespace {

/// A framework's completion event: ready once the framework says so.
struct FrameworkEvent final : DeviceEvent {
  std::shared_ptr<bool> done = std::make_shared<bool>(false);
  bool ready() const override { return *done; }
};

}  // namespace

TEST_CASE("embed: a stage left while the framework's work still runs keeps its devices and memory until that work ends") {
  asio::io_context io;
  const JobSpec spec = load_job("ppo-tiny");
  Job job(io.get_executor(), spec, load_global_plan(spec, kPlanTp4), opts());
  const std::uint64_t ws = 1 << 20;
  job.set_workspace("critic/train", ws);  // devices 4-7
  const std::uint64_t before = job.devices()[4].used;
  run_on(io, [&]() -> asio::awaitable<int> {
    for (const ModelStage& st : model_stages(spec))
      if (st.name() != "critic/train") co_await job.run_stage(st.name(), [](UnitContext&) -> asio::awaitable<void> { co_return; });
    co_return 0;
  }());
  StageLease lease = run_on(io, job.enter_stage("critic/train"));
  CHECK(job.devices()[4].used == before + ws);
  auto kernels = std::make_shared<FrameworkEvent>();  // the framework's kernels, still running
  lease.leave_after(true, {kernels});
  CHECK(job.state("critic/train").policy_version == 1);  // the step's logic counts it at once
  CHECK(job.devices()[4].used == before + ws);           // its memory is not handed back yet
  CHECK(has(error_of([&] { job.save_checkpoint("/nonexistent/never"); }), "framework's work on its GPUs still runs"));
  bool ended = false;
  std::string failed;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    try {
      co_await job.end_step();
      ended = true;
    } catch (const std::exception& e) {
      failed = e.what();
    }
  }, asio::detached);
  io.restart();  // run_on left it stopped, out of work
  io.run_for(std::chrono::milliseconds(50));
  CHECK_FALSE(ended);  // the sync would read what the kernels are still writing
  CHECK(failed.empty());
  *kernels->done = true;
  // Then the step ends: the sync runs (on a loaded machine, under the sanitizers, it can
  // take longer than any fixed slice; the check is that it ends, not how fast).
  for (int i = 0; i < 1000 && !ended && failed.empty(); ++i) io.run_for(std::chrono::milliseconds(10));
  CHECK(ended);
  CHECK(failed.empty());
  CHECK(job.devices()[4].used == before);
  // Host memory: a framework stream is done when its calls return; the lease lets go at once.
  StageLease again = run_on(io, job.enter_stage("critic/train"));
  const FrameworkStream stream{0, 0x1234};
  again.leave(true, {&stream, 1});
  CHECK(job.devices()[4].used == before);
}

TEST_CASE("embed: a stage's workspace comes from its devices' budget while it runs; step peaks count it") {
  asio::io_context io;
  const JobSpec spec = load_job("ppo-tiny");
  Job job(io.get_executor(), spec, load_global_plan(spec, kPlanTp4), opts());
  std::vector<std::uint64_t> before;
  for (const DeviceUse& d : job.devices()) before.push_back(d.used);
  const std::uint64_t ws = 3 << 20;
  job.set_workspace("critic/infer", ws);  // devices 2-3
  {
    StageLease lease = run_on(io, job.enter_stage("critic/infer"));
    const UnitContext& u = lease.units()[0];
    for (DeviceId d : u.emu().gpus) {
      REQUIRE(u.workspace(d).size() == ws);
      std::memset(u.workspace(d).data(), 0x5a, ws);  // it is the caller's memory
      CHECK(job.devices()[static_cast<std::size_t>(d)].used == before[static_cast<std::size_t>(d)] + ws);
      CHECK(job.devices()[static_cast<std::size_t>(d)].step_peak == before[static_cast<std::size_t>(d)] + ws);
    }
    CHECK(u.workspace(0).empty());  // not one of its devices
    lease.leave();
  }
  CHECK(job.devices()[2].used == before[2]);
  CHECK(job.devices()[2].step_peak == before[2] + ws);  // until the step ends
  CHECK(job.devices()[0].step_peak == 0);               // no stage ran there yet
  // More than a device has: one error naming the stage's workspace; nothing stays held.
  job.set_workspace("critic/infer", std::uint64_t{1} << 30);
  CHECK(has(error_of([&] { run_on(io, job.enter_stage("critic/infer")); }), "critic/infer workspace"));
  CHECK(job.devices()[2].used == before[2]);
  job.set_workspace("critic/infer", 0);
  CHECK(run_on(io, job.enter_stage("critic/infer")).units().size() == 1);
  CHECK(has(error_of([&] { job.set_workspace("critic/nothing", 1); }), "not a model-stage"));
}

TEST_CASE("embed: safetensors load into every unit's boxes and save back with the same names") {
  asio::io_context io;
  const JobSpec spec = load_job("ppo-tiny");
  const ModelSpec& m = *spec.model("actor");
  const std::string dir = temp_dir("weights");
  // A checkpoint the test writes: f32 values (exact in bf16), split over two files with an index.
  std::vector<SafetensorsOut> first, second;
  nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
  for (TensorId t = 0; t < m.tensors().size(); ++t) {
    const TensorInfo& info = m.tensor(t);
    std::vector<std::int64_t> shape(info.shape.begin(), info.shape.begin() + info.rank);
    SafetensorsOut out{info.name, DType::f32, shape, [t](std::byte* p, std::size_t bytes) {
                         for (std::size_t i = 0; i < bytes / 4; ++i) {
                           const float x = value(t, Slot::param, static_cast<std::int64_t>(i));
                           std::memcpy(p + 4 * i, &x, 4);
                         }
                       }};
    const bool in_first = t % 2 == 0;
    (in_first ? first : second).push_back(out);
    index["weight_map"][info.name] = in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_safetensors(dir + "/model-00001-of-00002.safetensors", first);
  write_safetensors(dir + "/model-00002-of-00002.safetensors", second);
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump();

  Job job(io.get_executor(), spec, load_global_plan(spec, kPlanPp), opts());
  job.load_weights("actor", dir + "/model.safetensors.index.json");
  for (const char* stage : {"actor/generate", "actor/infer", "actor/train"})
    for (const UnitView& u : job.units(stage))
      for (const ShardView& v : u.shards)
        each_element(m, v, [&](std::int64_t i, std::byte* p) {
          float x = 0;
          convert_elements(v.dtype, p, DType::f32, reinterpret_cast<std::byte*>(&x), 1);
          const bool moment = v.slot == Slot::exp_avg || v.slot == Slot::exp_avg_sq;
          if (x != (moment ? 0.0f : value(v.tensor, Slot::param, i))) {
            FAIL_CHECK(stage << " " << m.tensor(v.tensor).name << "@" << to_string(v.slot) << " element " << i);
            throw Error("stop");
          }
        });
  // Saved from a pp=2 unit: the same tensors, names and values, in the model's dtype.
  job.save_weights("actor/train", dir + "/out.safetensors");
  job.save_weights("actor/train", dir + "/master.safetensors", Slot::master);
  const auto header = read_safetensors_header(dir + "/out.safetensors");
  CHECK(header.size() == m.tensors().size());
  CHECK_NOTHROW(check_checkpoint(m, header));
  Job back(io.get_executor(), spec, load_global_plan(spec, kPlanTp4), opts());
  back.load_weights("actor/train", dir + "/out.safetensors");
  CHECK(wrong_values(m, {back.units("actor/train")[0]}) > 0);  // moments are zero, not value()
  std::int64_t wrong = 0;
  const std::vector<UnitView> back_units = back.units("actor/train");
  for (const ShardView& v : back_units[0].shards)
    if (v.slot == Slot::param || v.slot == Slot::master)
      each_element(m, v, [&](std::int64_t i, std::byte* p) {
        float x = 0;
        convert_elements(v.dtype, p, DType::f32, reinterpret_cast<std::byte*>(&x), 1);
        wrong += x != value(v.tensor, Slot::param, i);
      });
  CHECK(wrong == 0);
  CHECK(read_safetensors_header(dir + "/master.safetensors")[0].dtype == "F32");

  // Bad input: a missing tensor, a wrong shape, an unknown stage; nothing is half-loaded.
  write_safetensors(dir + "/short.safetensors", {first[0]});
  CHECK(has(error_of([&] { job.load_weights("actor", dir + "/short.safetensors"); }), "lacks tensor"));
  SafetensorsOut wrong_shape = first[0];
  wrong_shape.shape = {1, first[0].shape[0] * (first[0].shape.size() > 1 ? first[0].shape[1] : 1)};
  write_safetensors(dir + "/shape.safetensors", {wrong_shape});
  CHECK(has(error_of([&] { job.load_weights("actor", dir + "/shape.safetensors"); }), "has shape"));
  CHECK(has(error_of([&] { job.load_weights("nobody", dir + "/out.safetensors"); }), "not a model-stage"));
  std::filesystem::remove_all(dir);
}

namespace {

/// A deterministic training step: every training unit's slots change as a function of
/// the version it holds and the stage's seed, the same on every replica.
asio::awaitable<void> train_step(Job& job) {
  for (const auto& phase : job.spec().phases())
    for (const ModelStage& s : phase)
      co_await job.run_stage(s.name(), [&job](UnitContext& c) -> asio::awaitable<void> {
        const ModelSpec& m = *job.spec().model(std::string(role_of(c.model_stage())));
        if (c.model_stage().ends_with("/train")) {
          std::mt19937_64 rng(c.state().rng_seed ^ static_cast<std::uint64_t>(c.version()));
          const float step = static_cast<float>(rng() % 7) / 8.0f;
          for (const ShardView& v : c.shards())
            each_element(m, v, [&](std::int64_t i, std::byte* p) {
              float x = 0;
              convert_elements(v.dtype, p, DType::f32, reinterpret_cast<std::byte*>(&x), 1);
              x = x * 0.5f + step + static_cast<float>(i % 3);
              convert_elements(DType::f32, reinterpret_cast<const std::byte*>(&x), v.dtype, p, 1);
            });
        }
        co_return;
      });
  co_await job.end_step();
}

}  // namespace

TEST_CASE("embed: a checkpointed job resumes bit for bit") {
  asio::io_context io;
  const JobSpec spec = load_job("ppo-tiny");
  const std::string dir = temp_dir("ckpt");
  Job job(io.get_executor(), spec, load_global_plan(spec, kPlanTp2Dp2), opts());
  write_values(*spec.model("actor"), job.units("actor/train"));
  write_values(*spec.model("critic"), job.units("critic/train"));
  run_on(io, [&]() -> asio::awaitable<int> {
    co_await train_step(job);
    co_await job.transition(load_global_plan(spec, kPlanPp));
    co_await train_step(job);
    co_return 0;
  }());
  run_on(io, [&]() -> asio::awaitable<int> {
    co_await job.run_stage("actor/generate", [](UnitContext&) -> asio::awaitable<void> { co_return; });
    co_return 0;
  }());
  CHECK(has(error_of([&] { job.save_checkpoint(dir + "/x"); }), "already ran in step"));
  run_on(io, [&]() -> asio::awaitable<int> { co_await job.end_step(); co_return 0; }());
  job.save_checkpoint(dir + "/ckpt");
  auto resumed = Job::resume(io.get_executor(), spec, dir + "/ckpt", opts());
  CHECK(to_json_text(resumed->plan()) == to_json_text(job.plan()));
  CHECK(resumed->step() == job.step());
  for (const auto& [stage, _] : job.plan().stages) CHECK(resumed->state(stage) == job.state(stage));
  run_on(io, [&]() -> asio::awaitable<int> {
    for (Job* j : {&job, resumed.get()}) {
      co_await train_step(*j);
      co_await train_step(*j);
    }
    co_return 0;
  }());
  for (const auto& entry : job.plan().stages) {
    const std::string& stage = entry.first;  // not a structured binding: CAPTURE takes it in a lambda
    CAPTURE(stage);
    CHECK(resumed->state(stage) == job.state(stage));
    const std::vector<Slot> slots = stage.ends_with("/train") ? std::vector<Slot>(kTrainSlots.begin(), kTrainSlots.end())
                                                               : std::vector<Slot>{Slot::param};
    for (Slot s : slots) {
      job.save_weights(stage, dir + "/a.safetensors", s);
      resumed->save_weights(stage, dir + "/b.safetensors", s);
      CHECK(file_bytes(dir + "/a.safetensors") == file_bytes(dir + "/b.safetensors"));
    }
  }
  CHECK(has(error_of([&] { Job::resume(io.get_executor(), spec, dir, opts()); }), "checkpoint.json"));
  std::filesystem::remove_all(dir);
}
