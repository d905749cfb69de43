// A job across daemons from its first request to its check: drive_job opens it and runs
// its life (job_life.hpp: a sync job's steps; job_async.cpp: an async job's streams).
#include "job_life.hpp"

namespace nereus::cluster {

using detail::JobDriver;
using detail::JobLife;
using detail::Pool;
using detail::plan_json;
using detail::pool_of;
using json = nlohmann::json;

asio::awaitable<TransitionOutcome> drive_job(const JobRequest& r, const std::vector<NodeAddress>& nodes, int per,
                                            std::uint64_t capacity, const std::string& token,
                                            std::function<bool(int)> membership,
                                            std::function<std::vector<NodeAddress>()> roster) {
  parse_fault_moment(r.inject_at);
  if (!(r.step_seconds >= 0 && r.step_seconds <= 3600)) throw Error("step seconds must be between 0 and 3600");
  if (r.steps > 10000) throw Error("at most 10000 steps");
  JobDriver d(co_await asio::this_coro::executor, r, per, token, std::move(membership));
  const JobSpec& job = d.job();
  ClusterSpec hw = parse_cluster(r.cluster, "the cluster");
  hw.nodes = static_cast<int>(nodes.size());
  hw.gpus_per_node = per;
  hw.gpu_memory_gib = static_cast<double>(capacity) / static_cast<double>(1ull << 30);
  std::vector<int> ranks;
  for (const NodeAddress& n : nodes) ranks.push_back(n.rank);
  const Pool pool = pool_of(ranks, per);
  const double len = r.response_len > 0 ? r.response_len : static_cast<double>(job.max_response_len) / 2;
  const double after = r.response_len_after > 0 ? r.response_len_after : len;
  Controller ctl(job, hw);
  const Signals first{0, static_cast<int>(pool.devices.size()), len, len, 1};
  GlobalPlan initial;
  try {
    initial = ctl.initial(first);
  } catch (const Error& e) {
    throw Error("the daemons' " + std::to_string(pool.devices.size()) + " devices of " + human_bytes(capacity) + ": " + e.what() +
                " (start the daemons with more --devices, or pass --plan)");
  }
  if (!r.plan.empty()) initial = pool.to_indices(parse_global_plan(job, r.plan, "the plan"));
  std::optional<GlobalPlan> forced;  // global device ids
  if (!r.target.empty()) forced = pool.to_devices(pool.to_indices(parse_global_plan(job, r.target, "the target plan")));
  // A daemon's unit builds bind the planned transfers as they are; quantizing where read
  // needs FP8 staging on the sending nodes, which the build protocol does not carry yet.
  for (const GlobalPlan* p : {&initial, forced ? &*forced : nullptr})
    if (p)
      for (const auto& [name, spec] : p->stages)
        if (spec.layout.fp8)
          throw Error("model-stage '" + name + "': dtype=fp8 in a daemon job's plan is not supported yet (embedded jobs hold "
                      "FP8 units, and `nereus bench transition --daemons` moves them)");
  plan_collections(job, initial, static_cast<std::int64_t>(pool.devices.size()));  // checks, before any node is touched
  if (job.async) {
    if (!r.node_steps) throw Error("an async job across daemons runs its two streams on the nodes' frameworks: pass --node-steps");
    if (r.overlap) throw Error("--overlap is for sync jobs: an async job changes plan between training steps, once generation drained");
    for (const GlobalPlan* p : {&initial, forced ? &*forced : nullptr})
      if (p)
        if (const std::string shared = streams_sharing_gpu(job, *p); !shared.empty())
          throw Error(std::string(p == &initial ? "the plan" : "the target plan") + ": " + shared +
                      ": an async job runs generation and training on GPUs apart");
  }

  json out{{"nodes", ranks}, {"devices_per_node", per}, {"initial_plan", plan_json(pool.to_devices(initial))}};
  std::optional<detail::JobTimeline> timeline;
  if (r.perfetto) {
    timeline.emplace(nodes, per);
    d.set_timeline(&*timeline);
  }
  JobLife life(d, ctl, r, per, pool, len, after, timeline ? &*timeline : nullptr, std::move(roster), out);
  std::string error;
  try {
    co_await life.run(nodes, initial, forced);
  } catch (const std::exception& e) {
    error = e.what();
  }
  life.report();
  co_await d.close();
  if (!error.empty()) out["error"] = error;
  if (timeline) out["perfetto"] = timeline->json();
  const bool failed = out.contains("error") || out.contains("failures") || (out.contains("verified") && !out["verified"].get<bool>());
  co_return TransitionOutcome{out.dump(), failed};
}

}  // namespace nereus::cluster
