// The job runtime: units in device arenas, stage work, steps and weight syncs. The
// transition machinery is in job_transition.cpp.
#include "nereus/runtime/job.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <set>

#include "job_state.hpp"
#include "nereus/base/error.hpp"
#include "nereus/base/log.hpp"
#include "nereus/core/bytes.hpp"
#include "nereus/core/packing.hpp"
#include "nereus/runtime/quantize_pass.hpp"
#include "nereus/transport/cuda.hpp"

namespace nereus {

JobState::JobState(asio::any_io_executor e, JobSpec s, JobOptions o)
    : ex(e), spec(std::move(s)), options(std::move(o)), changed(e) {}

std::size_t JobState::index(std::string_view model_stage) const {
  for (std::size_t i = 0; i < stages.size(); ++i)
    if (stages[i].name() == model_stage) return i;
  std::string names;
  for (const auto& st : stages) names += (names.empty() ? "" : ", ") + st.name();
  throw Error("'" + std::string(model_stage) + "' is not a model-stage of this job (it has " + names + ")");
}

DeviceBuffer JobState::allocate(DeviceId d, std::size_t bytes, const std::string& what) {
  if (d < 0 || static_cast<std::size_t>(d) >= devices.size())
    throw Error("device " + std::to_string(d) + " is not one of the job's " + std::to_string(devices.size()) + " devices");
  Device& dev = *devices[static_cast<std::size_t>(d)];
  const std::size_t rounded = (bytes + 255) / 256 * 256;
  const std::uint64_t in_use = used(d);
  if (in_use + rounded > budget) {
    ++cap_violations;
    throw Error("device " + std::to_string(d) + ": " + what + " needs " + human_bytes(bytes) + " but only " +
                human_bytes(budget > in_use ? budget - in_use : 0) + " of its " + human_bytes(budget) +
                " budget is free");
  }
  return dev.allocate(bytes, what);
}

UnitPtr JobState::allocate_unit(std::size_t stage, const Emu& e, int adopt_as) {
  auto u = std::make_shared<LiveUnit>();
  u->emu = e;
  const ModelStage& st = stages[stage];
  const Collection one{st.model, st.name(), st.kind == StageKind::train, {e}};
  u->buffers = collection_buffers(one, 0, e.gpus);
  for (const BufferSpec& b : u->buffers) {
    const std::string name = buffer_name(*st.model, b.key.buffer, b.packing, b.expert_groups);
    const std::string what = st.name() + " " + name + "@" + std::string(to_string(b.key.slot));
    const int k = adopt_as >= 0 ? adopted_for(options.adopt, st.name(), adopt_as, b, name) : -1;
    if (k < 0) {
      u->memory.push_back(allocate(b.key.device, b.bytes(), what));
      continue;
    }
    adoption_used[static_cast<std::size_t>(k)] = 1;
    const AdoptedBuffer* framework = &options.adopt[static_cast<std::size_t>(k)];
    const auto d = static_cast<std::size_t>(b.key.device);
    if (framework->kind != options.memory || (options.memory == MemoryKind::cuda && framework->gpu != b.key.device % gpus))
      throw Error("adopted " + what + " is in " + std::string(to_string(framework->kind)) + " memory" +
                  (framework->kind == MemoryKind::cuda ? " of GPU " + std::to_string(framework->gpu) : std::string()) +
                  ", but device " + std::to_string(b.key.device) + " is " + std::string(to_string(options.memory)) + " memory" +
                  (options.memory == MemoryKind::cuda ? " of GPU " + std::to_string(b.key.device % gpus) : std::string()));
    if (used(b.key.device) + framework->bytes > budget) {
      ++cap_violations;
      throw Error("device " + std::to_string(b.key.device) + ": adopted " + what + " (" + human_bytes(framework->bytes) +
                  ") does not fit its " + human_bytes(budget) + " budget");
    }
    adopted[d] += framework->bytes;
    u->memory.push_back(DeviceBuffer::borrow(framework->data, framework->bytes, framework->kind));
  }
  return u;
}

void JobState::free_unit(LiveUnit& u) {
  for (std::size_t b = 0; b < u.memory.size(); ++b)
    if (u.memory[b].borrowed()) adopted[static_cast<std::size_t>(u.buffers[b].key.device)] -= u.memory[b].size();
  u.memory.clear();
  u.freed = true;
  u.lifetime.reset();
}

bool JobState::retired(std::size_t stage) const {
  const StageSlot& s = slots[stage];
  if (s.running) return false;
  return !transition || transition->effective_step <= step || s.ran_this_step;
}

void JobState::free_retired() {
  for (std::size_t i = 0; i < slots.size(); ++i)
    if (retired(i)) {
      for (auto& u : slots[i].retiring)
        if (u->in_use == 0) free_unit(*u);
      std::erase_if(slots[i].retiring, [](const UnitPtr& u) { return u->freed; });
    }
}

Collection JobState::collection(std::size_t stage, const std::vector<UnitPtr>& units) const {
  Collection c{stages[stage].model, stages[stage].name(), stages[stage].kind == StageKind::train, {}};
  for (const auto& u : units) c.units.push_back(u->emu);
  return c;
}

asio::awaitable<ExecutionReport> JobState::copy_units(
    const std::vector<std::pair<std::size_t, std::vector<UnitPtr>>>& sources, std::size_t to,
    const std::vector<UnitPtr>& targets, std::vector<Executor*>* active) {
  std::vector<Collection> from;
  BufferTable table;
  for (std::uint32_t k = 0; k < sources.size(); ++k) {
    from.push_back(collection(sources[k].first, sources[k].second));
    for (const UnitPtr& u : sources[k].second)
      for (std::size_t b = 0; b < u->buffers.size(); ++b) {
        const BufferKey& key = u->buffers[b].key;
        table.bind({k, key.device, key.buffer, key.slot},
                   {reinterpret_cast<std::uint64_t>(u->memory[b].data()), u->memory[b].size(), 0, u->memory[b].kind()});
      }
  }
  for (const UnitPtr& u : targets)
    for (std::size_t b = 0; b < u->buffers.size(); ++b) {
      const BufferKey& key = u->buffers[b].key;
      table.bind({kTargetSide, key.device, key.buffer, key.slot},
                 {reinterpret_cast<std::uint64_t>(u->memory[b].data()), u->memory[b].size(), 0, u->memory[b].kind()});
    }
  const ReshardPlan plan = plan_reshard(from, collection(to, targets), {options.links});
  const std::vector<DeviceId> all = all_devices();
  ExecutableTransfers moves = executable_transfers(plan, all);
  // An FP8 target read from bf16 sources: the blocks it reads are quantized first, into
  // staging beside their sources (sharding.md's quantizer; fp8_moves.hpp), which the
  // device budget pays for until the copy ends.
  std::vector<DeviceBuffer> staging;
  if (!moves.quantize.empty()) {
    const ModelSpec& m = *plan.target().model;
    for (const BufferSpec& b : quantize_staging(plan, moves.quantize, all)) {
      staging.push_back(allocate(b.key.device, b.bytes(),
                                 "FP8 staging of " + from[b.key.side & ~kQuantizedSide].model_stage + " " +
                                     buffer_name(m, b.key.buffer, b.packing, b.expert_groups) + "@" + std::string(to_string(b.key.slot))));
      table.bind(b.key, {reinterpret_cast<std::uint64_t>(staging.back().data()), staging.back().size(), 0, staging.back().kind()});
    }
    auto pass = [&] {
      const auto t0 = std::chrono::steady_clock::now();
      run_quantize(m, moves.quantize, table, options.memory, gpus, std::max(1u, options.copy_threads));
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    const double seconds = co_await offload(pass);  // gigabytes of blocks: off the event loop the running steps share
    log(LogLevel::debug, "job", "{} into {}: quantize pass, {} boxes in {:.3f} s", from[0].model_stage, stages[to].name(),
        moves.quantize.size(), seconds);
  }
  ExecutorOptions eo = options.executor;
  eo.self = 0;
  Executor executor(*transport, nullptr, [](DeviceId) { return PeerId{0}; }, eo);
  const BoundTransition bound = executor.bind(moves.transfers, plan.target(), table);
  if (active) active->push_back(&executor);
  ExecutionReport report;
  try {
    report = co_await executor.run(bound);
  } catch (...) {
    if (active) std::erase(*active, &executor);
    throw;
  }
  if (active) std::erase(*active, &executor);
  co_return report;
}

Job::Job(asio::any_io_executor ex, JobSpec spec, const GlobalPlan& initial, JobOptions options)
    : s_(std::make_shared<JobState>(ex, std::move(spec), std::move(options))) {
  JobState& s = *s_;
  if (s.options.devices < 1) throw Error("job: needs at least one device");
  if (!(s.options.headroom >= 0 && s.options.headroom < 1)) throw Error("job: headroom must be in [0, 1)");
  s.budget = static_cast<std::uint64_t>(static_cast<double>(s.options.capacity) * (1.0 - s.options.headroom));
  s.stages = model_stages(s.spec);
  s.gpus = s.options.memory == MemoryKind::cuda ? (s.options.gpus > 0 ? s.options.gpus : std::max(1, cuda_device_count())) : 1;
  for (int d = 0; d < s.options.devices; ++d)
    s.devices.push_back(make_device({s.options.memory, d, s.options.capacity, nullptr, d % s.gpus}));
  s.busy.assign(s.devices.size(), 0);
  s.step_peak.assign(s.devices.size(), 0);
  s.adopted.assign(s.devices.size(), 0);
  s.adoption_used.assign(s.options.adopt.size(), 0);
  if (s.options.transport) {
    s.transport = s.options.transport;
  } else {
    if (s.options.memory == MemoryKind::cuda) s.own_transport = make_cuda_transport(ex);
    else s.own_transport = std::make_unique<LocalTransport>(LocalTransportOptions{std::max(1u, s.options.copy_threads), 1 << 20});
    s.transport = s.own_transport.get();
  }
  const std::vector<Collection> cols = plan_collections(s.spec, initial, s.options.devices);
  if (const std::string why = s.shared_device(cols); !why.empty()) throw Error(why);
  const std::int64_t batch = s.spec.prompts_per_step * s.spec.samples_per_prompt;
  for (std::size_t i = 0; i < s.stages.size(); ++i) {
    StageSlot slot;
    slot.stage = s.stages[i];
    slot.state = initial_stage_state(s.stages[i].name(), batch, cols[i].dp(), s.options.max_micro_batch, s.options.seed);
    s.slots.push_back(std::move(slot));
    for (std::size_t r = 0; r < cols[i].units.size(); ++r) {
      UnitPtr u = s.allocate_unit(i, cols[i].units[r], static_cast<int>(r));
      if (s.options.fill) {
        const HostMirror host(*u, false);
        for (std::size_t b = 0; b < u->buffers.size(); ++b) fill_buffer(*s.stages[i].model, u->buffers[b], host.data(b));
        host.commit();
      }
      s.slots[i].units.push_back(std::move(u));
    }
  }
  for (std::size_t k = 0; k < s.options.adopt.size(); ++k)
    if (!s.adoption_used[k]) throw Error(unmatched_adoption(s.options.adopt[k]));
}

Job::~Job() {
  if (s_->transition && !s_->transition->finished) s_->transition->stop("the job was destroyed", true);
  for (StageSlot& slot : s_->slots)
    if (slot.update) WeightUpdate(s_, slot.update).cancel();
  // The state and a transition refer to each other: break the cycle. A run still in
  // flight keeps both alive until its coroutine ends.
  s_->transition.reset();
}

const JobSpec& Job::spec() const { return s_->spec; }
std::int64_t Job::step() const { return s_->step; }

void Job::set_workspace(std::string_view model_stage, std::uint64_t bytes) {
  const std::string name(s_->stages[s_->index(model_stage)].name());
  auto& ws = s_->options.workspace;
  const auto it = std::find_if(ws.begin(), ws.end(), [&](const auto& e) { return e.first == name; });
  if (it != ws.end())
    it->second = bytes;
  else
    ws.emplace_back(name, bytes);
}

std::span<std::byte> UnitContext::workspace(DeviceId d) const {
  for (const auto& [device, memory] : workspace_)
    if (device == d) return memory;
  return {};
}
const StageState& Job::state(std::string_view model_stage) const { return s_->slots[s_->index(model_stage)].state; }
std::uint64_t Job::cap_violations() const { return s_->cap_violations; }

GlobalPlan Job::plan() const {
  GlobalPlan p;
  for (std::size_t i = 0; i < s_->slots.size(); ++i) {
    const Collection c = s_->collection(i, s_->slots[i].units);
    CollectionSpec spec{c.units.empty() ? Layout{} : c.units[0].layout, c.dp(), c.devices()};
    p.stages.emplace_back(s_->stages[i].name(), spec);
  }
  return p;
}

std::vector<DeviceUse> Job::devices() const {
  std::vector<DeviceUse> out;
  for (const auto& d : s_->devices) {
    const auto i = static_cast<std::size_t>(d->id());
    out.push_back({d->id(), s_->used(d->id()), d->peak() + s_->adopted[i], s_->budget, s_->step_peak[i]});
  }
  return out;
}

MemoryKind Job::memory() const { return s_->options.memory; }
int Job::gpu_of(DeviceId device) const { return s_->options.memory == MemoryKind::cuda ? device % s_->gpus : 0; }

FillCheck Job::verify() const {
  FillCheck all;
  std::set<const LiveUnit*> seen;
  for (std::size_t i = 0; i < s_->slots.size(); ++i)
    for (const auto* list : {&s_->slots[i].units, &s_->slots[i].next})
      for (const UnitPtr& u : *list) {
        if (u->freed || !seen.insert(u.get()).second) continue;
        const HostMirror host(*u, true);
        for (std::size_t b = 0; b < u->buffers.size(); ++b) all.merge(check_buffer(*s_->stages[i].model, u->buffers[b], host.data(b)));
      }
  return all;
}

asio::awaitable<StageLease> Job::enter_stage(std::string model_stage) {
  auto s = s_;  // keeps the state alive across suspension
  const std::size_t i = s->index(model_stage);
  StageSlot& slot = s->slots[i];
  if (slot.claimed) throw Error("model-stage '" + model_stage + "' is already running");
  slot.claimed = true;
  std::vector<UnitPtr> units;
  const bool trains = slot.stage.kind == StageKind::train;
  for (;;) {
    try {
      co_await s->within_staleness(i);  // async generation: params at most max_staleness versions old
    } catch (...) {
      slot.claimed = false;
      throw;
    }
    const auto& tr = s->transition;
    // After a plan change takes effect, a stage runs on exactly its new units.
    const bool awaiting = tr && !tr->finished && tr->effective_step <= s->step && !tr->applied(i);
    bool free = !awaiting && !slot.switch_pending;
    if (free) {
      units = slot.units;
      for (const UnitPtr& u : units) {
        free = free && !(trains && u->readers > 0);  // a weight update still copies its params
        for (DeviceId d : u->emu.gpus) free = free && s->busy[static_cast<std::size_t>(d)] == 0;
      }
    }
    if (free) break;
    try {
      co_await s->changed.wait();
    } catch (...) {
      slot.claimed = false;
      throw;
    }
  }
  // Mark devices busy, hold the units, allocate the workspace.
  slot.running = true;
  StageLease lease;
  lease.s_ = s;
  lease.stage_ = i;
  lease.units_ = units;
  for (const UnitPtr& u : units) {
    ++u->in_use;
    for (DeviceId d : u->emu.gpus) ++s->busy[static_cast<std::size_t>(d)];
  }
  const std::uint64_t ws = [&] {
    for (const auto& [name, bytes] : s->options.workspace)
      if (name == model_stage) return bytes;
    return std::uint64_t{0};
  }();
  lease.ctx_.resize(units.size());
  if (ws > 0)  // a throw here leaves through the lease's destructor
    for (std::size_t k = 0; k < units.size(); ++k)
      for (DeviceId d : units[k]->emu.gpus) {
        lease.workspace_.push_back(s->allocate(d, ws, model_stage + " workspace"));
        lease.ctx_[k].workspace_.emplace_back(d, std::span<std::byte>(lease.workspace_.back().data(), ws));
      }
  for (const UnitPtr& u : units)
    for (DeviceId d : u->emu.gpus) {
      std::uint64_t& peak = s->step_peak[static_cast<std::size_t>(d)];
      peak = std::max(peak, s->used(d));
    }
  for (std::size_t k = 0; k < units.size(); ++k) {
    UnitContext& c = lease.ctx_[k];
    c.stage_ = model_stage;
    c.emu_ = &units[k]->emu;
    c.replica_ = static_cast<int>(k);
    c.state_ = &slot.state;
    c.version_ = units[k]->version;
    c.buffers_ = &units[k]->buffers;
    c.lifetime_ = units[k]->lifetime;
    c.aborts_ = slot.aborts;
    c.aborts_at_entry_ = *slot.aborts;
    for (auto& m : units[k]->memory) c.memory_.emplace_back(m.data(), m.size());
  }
  co_return lease;
}

StageLease::StageLease(StageLease&& o) noexcept { *this = std::move(o); }

StageLease& StageLease::operator=(StageLease&& o) noexcept {
  if (this != &o) {
    if (held()) leave(false);
    s_ = std::move(o.s_);
    o.s_.reset();
    stage_ = o.stage_;
    units_ = std::move(o.units_);
    workspace_ = std::move(o.workspace_);
    ctx_ = std::move(o.ctx_);
  }
  return *this;
}

StageLease::~StageLease() {
  if (held()) leave(false);
}

namespace {

/// What a left stage gives back once the framework's work on it is done.
struct StageRelease {
  std::size_t stage = 0;
  std::vector<UnitPtr> units;
  std::vector<DeviceBuffer> workspace;
};

void release(JobState& s, StageRelease& r) {
  StageSlot& slot = s.slots[r.stage];
  r.workspace.clear();
  for (const UnitPtr& u : r.units) {
    --u->in_use;
    for (DeviceId d : u->emu.gpus) --s.busy[static_cast<std::size_t>(d)];
  }
  r.units.clear();
  slot.running = false;
  slot.leaving = false;
  s.free_retired();
  s.changed.notify();
}

/// Gives the stage's devices back once the framework's work on them is done.
asio::awaitable<void> release_when_done(std::shared_ptr<JobState> s, StageRelease r,
                                        std::vector<std::shared_ptr<DeviceEvent>> events) {
  co_await until_ready(s->ex, std::move(events));
  release(*s, r);
}

}  // namespace

asio::awaitable<void> until_ready(asio::any_io_executor ex, std::vector<std::shared_ptr<DeviceEvent>> events) {
  asio::steady_timer t(ex);
  while (!std::all_of(events.begin(), events.end(), [](const auto& e) { return !e || e->ready(); })) {
    t.expires_after(std::chrono::microseconds(20));
    co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
  }
}

std::vector<DeviceId> JobState::all_devices() const {
  std::vector<DeviceId> all(devices.size());
  std::iota(all.begin(), all.end(), DeviceId{0});
  return all;
}

std::vector<std::shared_ptr<DeviceEvent>> JobState::framework_events(std::span<const FrameworkStream> streams,
                                                                     std::span<const DeviceId> on) const {
  std::vector<std::shared_ptr<DeviceEvent>> events;
  std::set<int> gpus;
  for (DeviceId d : on) {
    Device& dev = *devices[static_cast<std::size_t>(d)];
    if (dev.kind() != MemoryKind::cuda || !gpus.insert(dev.gpu()).second) continue;
    std::uintptr_t stream = 0;
    for (const FrameworkStream& f : streams)
      if (f.gpu == dev.gpu()) stream = f.stream;
    events.push_back(dev.record_external(stream));
  }
  return events;
}

void StageLease::leave(bool completed, std::span<const FrameworkStream> streams) {
  if (!s_) return;
  std::vector<DeviceId> on;
  for (const UnitPtr& u : units_) on.insert(on.end(), u->emu.gpus.begin(), u->emu.gpus.end());
  leave_after(completed, s_->framework_events(streams, on));
}

void StageLease::leave_after(bool completed, std::vector<std::shared_ptr<DeviceEvent>> events) {
  if (!s_) return;
  auto s = std::move(s_);
  s_.reset();
  StageSlot& slot = s->slots[stage_];
  slot.claimed = false;
  if (completed) {
    slot.ran_this_step = true;
    ++slot.runs;
    if (slot.stage.kind == StageKind::train) {
      ++slot.state.update_count;
      ++slot.state.policy_version;
      for (const UnitPtr& u : units_) u->version = slot.state.policy_version;
    }
  }
  StageRelease r{stage_, std::move(units_), std::move(workspace_)};
  units_.clear();
  workspace_.clear();
  ctx_.clear();
  std::erase_if(events, [](const std::shared_ptr<DeviceEvent>& e) { return !e || e->ready(); });
  if (events.empty()) {
    release(*s, r);
    return;
  }
  slot.leaving = true;
  asio::co_spawn(s->ex, release_when_done(s, std::move(r), std::move(events)), asio::detached);
}

asio::awaitable<void> Job::run_stage(std::string model_stage, StageWork work) {
  StageLease lease = co_await enter_stage(std::move(model_stage));
  std::exception_ptr failure;
  try {
    auto ex = co_await asio::this_coro::executor;
    AsyncScope scope(ex);
    for (UnitContext& c : lease.ctx_) scope.spawn(work(c));
    co_await scope.join();
  } catch (...) {
    failure = std::current_exception();
  }
  lease.leave(!failure);
  if (failure) std::rethrow_exception(failure);
}

std::vector<ShardView> shard_views(const std::vector<BufferSpec>& buffers, std::span<const std::span<std::byte>> memory) {
  if (memory.size() != buffers.size()) throw Error("shard_views: a unit's memory is gone (it was freed)");
  std::vector<ShardView> out;
  for (std::size_t b = 0; b < buffers.size(); ++b)
    for (const BufferSpec::Part& p : buffers[b].parts)
      out.push_back({buffers[b].key.device, p.tensor, buffers[b].key.slot, buffers[b].dtype, p.shard,
                     memory[b].data() + static_cast<std::size_t>(p.base) * width(buffers[b].dtype)});
  return out;
}

std::vector<UnitView> Job::units(std::string_view model_stage) const {
  const StageSlot& slot = s_->slots[s_->index(model_stage)];
  auto live = [](const std::vector<UnitPtr>& us) {
    return !us.empty() && std::none_of(us.begin(), us.end(), [](const UnitPtr& u) { return u->freed; });
  };
  // A stage that already ran this step may have had its old units freed by a transition
  // whose new units take effect at the next step: those new units hold its state now.
  const std::vector<UnitPtr>* units = &slot.units;
  if (!live(slot.units)) {
    if (!(slot.switched && live(slot.next)))
      throw Error("model-stage '" + std::string(model_stage) + "' has no complete collection now: a transition is replacing its units; ask after it finishes or after end_step()");
    units = &slot.next;
  }
  std::vector<UnitView> out;
  for (std::size_t r = 0; r < units->size(); ++r) {
    const LiveUnit& u = *(*units)[r];
    std::vector<std::span<std::byte>> mem;
    for (const auto& m : u.memory) mem.emplace_back(m.data(), m.size());
    std::vector<ShardView> views = shard_views(u.buffers, mem);
    for (ShardView& v : views) {  // GPU memory: DLPack exports it as the GPU's (kDLCUDA)
      v.kind = u.memory.empty() ? MemoryKind::host : u.memory.front().kind();
      v.gpu = gpu_of(v.device);
    }
    out.push_back({static_cast<int>(r), u.emu, u.version, std::move(views), u.buffers, mem, u.lifetime});
  }
  return out;
}

namespace {

/// The collection a stage runs on in step `step`.
const std::vector<UnitPtr>& units_in(const JobState& s, std::size_t i, std::int64_t step) {
  const StageSlot& slot = s.slots[i];
  const bool takes_effect = s.transition && slot.switched && s.transition->effective_step <= step;
  return takes_effect ? slot.next : slot.units;
}

}  // namespace

asio::awaitable<void> Job::end_step(std::span<const FrameworkStream> streams) {
  auto s = s_;
  // An async job's generation stages are another stream: they run on across the step's end.
  auto other_stream = [&](const StageSlot& x) { return s->spec.async && x.stage.kind == StageKind::generate; };
  std::vector<DeviceId> fenced;
  for (const StageSlot& slot : s->slots) {
    if (other_stream(slot)) continue;
    if (slot.claimed) throw Error("end_step: model-stage '" + slot.stage.name() + "' is still running");
    for (const UnitPtr& u : slot.units) fenced.insert(fenced.end(), u->emu.gpus.begin(), u->emu.gpus.end());
  }
  if (!s->spec.async) fenced = s->all_devices();
  co_await until_ready(s->ex, s->framework_events(streams, fenced));
  // Stages left while the framework's kernels still ran on them: the sync reads what they wrote.
  while (std::any_of(s->slots.begin(), s->slots.end(), [&](const StageSlot& x) { return x.leaving && !other_stream(x); }))
    co_await s->changed.wait();
  // Weight sync: each generation/inference stage of a trained model gets the training
  // stage's params, unit by unit where they are behind (param slot only).
  for (std::size_t t = 0; t < s->slots.size(); ++t) {
    if (s->stages[t].kind != StageKind::train) continue;
    const std::vector<UnitPtr> sources = units_in(*s, t, s->step + 1);
    for (std::size_t m = 0; m < s->slots.size(); ++m) {
      if (m == t || s->stages[m].role != s->stages[t].role) continue;
      if (s->spec.async && s->stages[m].kind == StageKind::generate) continue;  // weight updates, in flight
      std::vector<UnitPtr> behind;
      for (const UnitPtr& u : units_in(*s, m, s->step + 1))
        if (!u->freed && u->version < s->slots[t].state.policy_version) behind.push_back(u);
      if (behind.empty()) continue;
      for (const UnitPtr& u : sources) ++u->in_use;
      for (const UnitPtr& u : behind) ++u->in_use;
      std::exception_ptr failure;
      const std::vector<std::pair<std::size_t, std::vector<UnitPtr>>> from{{t, sources}};  // GCC 12: not inside co_await
      try {
        co_await s->copy_units(from, m, behind);
      } catch (...) {
        failure = std::current_exception();
      }
      for (const UnitPtr& u : sources) --u->in_use;
      for (const UnitPtr& u : behind) --u->in_use;
      if (failure) std::rethrow_exception(failure);
      for (const UnitPtr& u : behind) u->version = s->slots[t].state.policy_version;
      s->slots[m].state.policy_version = s->slots[t].state.policy_version;
    }
  }
  ++s->step;
  std::fill(s->step_peak.begin(), s->step_peak.end(), 0);
  for (std::size_t i = 0; i < s->slots.size(); ++i) {
    StageSlot& slot = s->slots[i];
    slot.ran_this_step = false;
    slot.state.dataloader_position += s->spec.prompts_per_step;
    slot.state.minibatch_position = 0;
  }
  if (s->transition) s->transition->take_effect();
  s->free_retired();
  s->changed.notify();
}

namespace {

/// An async job changes plan between training steps, with no weight update in flight, to
/// a plan that keeps generation and training apart. A generation run in flight goes on
/// on its old units (the graph frees them when it leaves, as in a sync job); the next
/// run waits for the new ones (enter_stage), which the graph fills from the trainer where
/// they are behind: a whole version each.
void refuse_async_transition(const JobState& s) {
  for (const StageSlot& slot : s.slots) {
    if (slot.stage.kind != StageKind::generate && (slot.claimed || slot.ran_this_step))
      throw Error("begin_transition: '" + slot.stage.name() + (slot.claimed ? "' is running" : "' ran in this step") +
                  "; an async job changes plan between training steps (after end_step())");
    if (slot.update || slot.switch_pending)
      throw Error("begin_transition: a weight update of '" + slot.stage.name() + "' is in flight; finish or cancel it first");
  }
}

}  // namespace

TransitionHandle Job::begin_transition(const GlobalPlan& target, std::span<const FrameworkStream> streams) {
  JobState& s = *s_;
  if (s.spec.async) refuse_async_transition(s);
  if (s.transition && (!s.transition->finished || s.transition->effective_step > s.step))
    throw Error(s.transition->finished
                    ? "the previous transition takes effect at step " + std::to_string(s.transition->effective_step) +
                          ": end the step first"
                    : "a transition is already in flight");
  s.transition.reset();
  // An async job's generation stream runs across steps: only the training stream's step counts.
  const bool mid_step = std::any_of(s.slots.begin(), s.slots.end(), [&](const StageSlot& x) {
    return !(s.spec.async && x.stage.kind == StageKind::generate) && (x.ran_this_step || x.claimed);
  });
  const std::int64_t effective = mid_step ? s.step + 1 : s.step;
  TransitionRequest req;
  req.job = &s.spec;
  for (std::size_t i = 0; i < s.slots.size(); ++i) req.from.push_back(s.collection(i, s.slots[i].units));
  req.to = plan_collections(s.spec, target, s.options.devices);
  if (const std::string why = s.shared_device(req.to); !why.empty()) throw Error("begin_transition: " + why);
  // A generation/inference stage is stale when its training stage will have updated the
  // params by the time the new plan takes effect: its units are then never read.
  req.stale.assign(s.slots.size(), false);
  for (std::size_t t = 0; t < s.slots.size(); ++t) {
    if (s.stages[t].kind != StageKind::train) continue;
    const std::int64_t at_effect =
        s.slots[t].state.policy_version + (effective > s.step && !s.slots[t].ran_this_step ? 1 : 0);
    for (std::size_t m = 0; m < s.slots.size(); ++m)
      if (m != t && s.stages[m].role == s.stages[t].role)
        for (const UnitPtr& u : s.slots[m].units) req.stale[m] = req.stale[m] || u->version < at_effect;
  }
  req.memory.capacity = s.options.capacity;
  req.memory.headroom = s.options.headroom;
  req.memory.workspace = s.options.workspace;
  req.links = s.options.links;
  TransitionGraph graph = compile_transition(req);
  if (!graph.feasibility.ok) throw Error("the transition to the new plan is infeasible: " + graph.feasibility.reason);
  auto run = std::make_shared<TransitionRun>(s_, std::move(graph), effective);
  run->after = s.framework_events(streams, s.all_devices());
  s.transition = run;
  asio::co_spawn(s.ex, run->run(), [run](std::exception_ptr) {});
  return TransitionHandle(run);
}

asio::awaitable<TransitionReport> Job::transition(const GlobalPlan& target, std::span<const FrameworkStream> streams) {
  for (const StageSlot& slot : s_->slots)
    if (!(s_->spec.async && slot.stage.kind == StageKind::generate) && (slot.ran_this_step || slot.claimed))
      throw Error("transition(): model-stage '" + slot.stage.name() +
                  "' already ran in this step; call it between steps, or use begin_transition() and end_step()");
  TransitionHandle h = begin_transition(target, streams);
  co_return co_await h.wait();
}

asio::awaitable<TransitionReport> TransitionHandle::wait() {
  auto run = run_;
  if (!run) throw Error("wait() on an empty transition handle");
  while (!run->finished) co_await run->done.wait();
  co_return run->report;
}

void TransitionHandle::cancel() {
  if (run_ && !run_->finished) run_->stop("cancelled", true);
}

bool TransitionHandle::done() const { return run_ && run_->finished; }

}  // namespace nereus
