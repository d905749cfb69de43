// `nereus plan`: what a transition moves (interfaces.md). No bytes move.
#include <fmt/format.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <optional>

#include "commands.hpp"
#include "nereus/core/cluster.hpp"
#include "nereus/base/error.hpp"
#include "nereus/core/safetensors.hpp"
#include "nereus/plan/placement.hpp"
#include "nereus/plan/reshard.hpp"
#include "output.hpp"
#include "transition_plan.hpp"

namespace nereus::cli {

namespace {

struct PlanArgs {
  std::string model, from, to, cluster, weights;
  bool train = false, sync = false, optimize = false, transfers = false, json = false;
  int gpus_per_node = 0;
  int node = -1;
};

/// Runs f, prefixing any error with the flag and spec it came from.
template <class F>
auto in_context(const std::string& flag, const std::string& spec, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    throw Error(flag + " " + spec + ": " + e.what());
  }
}

/// A spec for people: a long device list is cut after 96 characters.
std::string readable(const CollectionSpec& spec) {
  std::string s = to_string(spec);
  if (s.size() <= 140) return s;
  const auto cut = s.rfind(':', s.find(",devices=") + 96);
  return s.substr(0, cut) + ":... (" + std::to_string(spec.devices.size()) + " devices; --json lists all)";
}

void run_plan(const PlanArgs& a) {
  const auto model = load_model(a.model);
  if (!a.weights.empty()) check_checkpoint(*model, read_checkpoint_tensors(a.weights));
  LinkModel links;
  std::int64_t device_count = 0;
  if (!a.cluster.empty()) {
    const ClusterSpec c = load_cluster(a.cluster);
    links = LinkModel::of(c);
    device_count = c.gpus();
  } else {
    links = LinkModel::of(load_cluster("h200-node"));  // bandwidths only; any number of nodes
  }
  if (a.gpus_per_node > 0) links.gpus_per_node = a.gpus_per_node;
  if (a.train && a.sync) throw Error("--train and --sync exclude each other (--sync: train source, generation target)");

  const CollectionSpec from = in_context("--from", a.from, [&] { return parse_collection_spec(a.from); });
  const CollectionSpec to = in_context("--to", a.to, [&] { return parse_collection_spec(a.to); });
  const Collection source = in_context("--from", a.from, [&] {
    auto c = Collection::from_spec(model, "source", from, a.train || a.sync);
    c.validate(device_count);
    return c;
  });
  Collection target = in_context("--to", a.to, [&] {
    auto c = Collection::from_spec(model, "target", to, a.train);
    c.validate(device_count);
    return c;
  });

  const auto t0 = std::chrono::steady_clock::now();
  if (a.optimize) target = optimize_placement(std::span<const Collection>(&source, 1), target, links.gpus_per_node);
  ReshardPlan plan = plan_reshard(source, target, {links});
  const double plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const ReshardSummary& s = plan.summary();
  const std::vector<DeviceId> target_devices = plan.target().devices();

  std::vector<Transfer> transfers;
  if (a.transfers) {
    if (a.node >= 0) {
      std::vector<DeviceId> devs;
      for (int i = 0; i < links.gpus_per_node; ++i) devs.push_back(a.node * links.gpus_per_node + i);
      transfers = plan.transfers_touching(devs);
    } else {
      transfers = plan.transfers();
    }
  }

  if (a.json) {
    nlohmann::json j = {
        {"model", a.model},
        {"from", to_string(from)},
        {"to", to_string(CollectionSpec{to.layout, to.dp, target_devices})},
        {"train", a.train},
        {"sync", a.sync},
        {"optimize_placement", a.optimize},
        {"moved_bytes", s.moved_bytes},
        {"local_bytes", s.local_bytes},
        {"kept_bytes", s.kept_bytes},
        {"target_bytes", s.target_bytes},
        {"lower_bound_bytes", s.lower_bound_bytes},
        {"inter_node_bytes", s.inter_node_bytes},
        {"max_device_send_bytes", s.max_device_send_bytes},
        {"max_device_recv_bytes", s.max_device_recv_bytes},
        {"transfer_count", s.transfer_count},
        {"local_copy_count", s.local_copy_count},
        {"quantized_bytes", s.quantized_bytes},
        {"plan_ms", plan_ms},
        {"estimated_seconds", s.estimated_seconds},
        {"target_devices", target_devices},
    };
    if (a.transfers) {
      auto arr = nlohmann::json::array();
      for (const Transfer& t : transfers) arr.push_back(transfer_json(*model, t));
      j["transfers"] = std::move(arr);
    }
    std::cout << j.dump() << "\n";
    return;
  }

  const ModelConfig& c = model->config();
  std::cout << fmt::format("model        {} ({}, {:.2f} B parameters, {}{})\n", a.model, to_string(c.arch),
                           static_cast<double>(model->parameters()) / 1e9, to_string(c.dtype),
                           a.train ? ", training slots" : (a.sync ? ", weight sync" : ""));
  std::cout << fmt::format("from         {}\n", readable(from));
  std::cout << fmt::format("to           {}{}\n", readable(CollectionSpec{to.layout, to.dp, target_devices}),
                           a.optimize ? "  (placement optimised)" : "");
  const double pct = s.target_bytes ? 100.0 * static_cast<double>(s.moved_bytes) / static_cast<double>(s.target_bytes) : 0;
  std::cout << fmt::format("target       {}\n", human_bytes(s.target_bytes));
  std::cout << fmt::format("moved        {} over links ({:.1f}% of target; lower bound {}), {} between nodes\n",
                           human_bytes(s.moved_bytes), pct, human_bytes(s.lower_bound_bytes),
                           human_bytes(s.inter_node_bytes));
  std::cout << fmt::format("local        {} already on its device ({} kept in place)\n",
                           human_bytes(s.local_bytes), human_bytes(s.kept_bytes));
  std::cout << fmt::format("per device   max send {}, max receive {}\n", human_bytes(s.max_device_send_bytes),
                           human_bytes(s.max_device_recv_bytes));
  std::cout << fmt::format("transfers    {} over links, {} local copies\n", s.transfer_count, s.local_copy_count);
  if (s.quantized_bytes)
    std::cout << fmt::format("fp8          {} of FP8 weights and scales quantized where read\n", human_bytes(s.quantized_bytes));
  std::cout << fmt::format("estimated    {:.3f} s   planned in {:.2f} ms\n", s.estimated_seconds, plan_ms);
  if (a.transfers) {
    std::cout << fmt::format("\n{:>5} {:>5}  {:<10} {:>12}  {:<24} {}\n", "src", "dst", "slot", "bytes", "box", "tensor");
    for (const Transfer& t : transfers)
      std::cout << fmt::format("{:>5} {:>5}  {:<10} {:>12}  {:<24} {}{}\n", t.src, t.dst, to_string(t.slot), t.bytes,
                               t.box.to_string(), model->tensor(t.tensor).name,
                               t.local() ? (t.keep ? "  (kept)" : "  (local copy)") : "");
  }
}

/// `nereus plan`: one collection's reshard, or (--job) a whole job's transition.
void run_plan_command(PlanArgs& args, JobPlanArgs& job) {
  if (!job.job.empty()) {
    if (!args.model.empty() || !args.from.empty() || !args.to.empty())
      throw Error("--job plans a whole job: give --from-plan/--to-plan instead of --model/--from/--to");
    job.cluster = args.cluster;
    job.json = args.json;
    job.gpus_per_node = args.gpus_per_node;
    run_job_plan(job);
    return;
  }
  if (args.model.empty() || args.from.empty() || args.to.empty())
    throw Error("plan needs --model, --from and --to (or --job, --from-plan and --to-plan)");
  run_plan(args);
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  auto job = std::make_shared<JobPlanArgs>();
  CLI::App* cmd = app.add_subcommand("plan",
      "What a transition moves (no bytes move): one model-stage (--model --from --to), or a whole job's plan change "
      "as a transition graph (--job --from-plan --to-plan)");
  cmd->add_option("--model", args->model, "config.json path or preset name");
  cmd->add_option("--from", args->from, "source layout spec tp=T,pp=P[,ep=X[,etp=K]],dp=D[,devices=..][,partition=..][,packing=..][,dtype=fp8]");
  cmd->add_option("--to", args->to, "target layout spec");
  cmd->add_flag("--train", args->train, "every unit carries the training slots (master, exp_avg, exp_avg_sq)");
  cmd->add_flag("--sync", args->sync, "weight sync: training source, generation target (param only)");
  cmd->add_flag("--optimize-placement", args->optimize, "reorder target GPUs to keep the most bytes local");
  cmd->add_flag("--transfers", args->transfers, "list the transfers");
  cmd->add_option("--node", args->node, "with --transfers: only those touching this node's GPUs")->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->add_option("--cluster", args->cluster, "cluster JSON or preset: link bandwidths, GPUs per node, device range (and, "
                  "with --job, GPU memory)");
  cmd->add_option("--gpus-per-node", args->gpus_per_node, "override GPUs per node (default 8)")->check(CLI::PositiveNumber);
  cmd->add_option("--weights", args->weights, "check a .safetensors file or index.json against the model first");
  auto* g = "Job transition graph";
  cmd->add_option("--job", job->job, "job JSON or preset: plan the whole job's transition")->group(g);
  cmd->add_option("--from-plan", job->from_plan, "current global plan: a plan file or its JSON text")->group(g);
  cmd->add_option("--to-plan", job->to_plan, "new global plan: a plan file or its JSON text")->group(g);
  cmd->add_option("--capacity", job->capacity, "memory per GPU (e.g. 80GiB); default the cluster's, else unlimited")->group(g);
  cmd->add_option("--headroom", job->headroom, "share of each GPU kept free (default 0.1)")->group(g);
  cmd->add_option("--workspace", job->workspace, "STAGE=SIZE: working memory a model-stage needs per GPU while it runs")
      ->group(g);
  cmd->add_option("--stale", job->stale, "model-stages whose params a weight sync replaces before the switch")->group(g);
  cmd->add_flag("--nodes", job->nodes, "list every node with its edges (and, with --json, per-GPU memory)")->group(g);
  cmd->callback([args, job] { refusing_input([&] { run_plan_command(*args, *job); }); });  // planning only reads its input
}

}  // namespace nereus::cli
