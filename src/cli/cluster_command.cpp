// `nereus cluster status`: what the coordinator knows of the job's nodes.
// `nereus cluster job`: the coordinator loads a job's units onto the daemons, runs the
// controller and the job's global transition graph across them, and reports.
#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "nereus/base/error.hpp"
#ifdef NEREUS_HAVE_CLUSTER
#include "nereus/cluster/auth.hpp"
#include "nereus/cluster/client.hpp"
#include "nereus/cluster/job_service.hpp"
#include "nereus/core/bytes.hpp"
#include "nereus/core/cluster.hpp"
#include "nereus/core/global_plan.hpp"
#include "nereus/core/presets.hpp"
#endif

namespace nereus::cli {

namespace {

struct ClusterArgs {
  std::string coordinator, token_file;
  int timeout_ms = 5000;
  bool json = false;
};

struct JobArgs {
  std::string coordinator, token_file, job, cluster = "h200-node", plan, to, perfetto;
  double response_len = 0, response_len_after = 0, timeout = 300, step_seconds = 0;
  bool no_verify = false, json = false, node_steps = false, overlap = false;
  int kill_node = -1, freeze_node = -1;
  unsigned steps = 1;
  std::string inject_at, transport = "ucx-tag", mode;
  std::int64_t max_staleness = 0;
};

#ifdef NEREUS_HAVE_CLUSTER
using namespace nereus::cluster;

ClusterStatus fetch_status(const ClusterArgs& a) {
  const Endpoint at = parse_endpoint(a.coordinator, "--coordinator");
  const Body ask = StatusRequest{};
  return ask_daemon<ClusterStatus>(at, load_token(a.token_file), ask, Millis(a.timeout_ms));
}

/// A clock figure in ms, or null when the node has not measured its clock yet.
nlohmann::json clock_ms(std::int64_t ns, std::int64_t rtt_ns) {
  return rtt_ns < 0 ? nlohmann::json(nullptr) : nlohmann::json(static_cast<double>(ns) / 1e6);
}

void run_status(const ClusterArgs& a) {
  const ClusterStatus s = fetch_status(a);
  int alive = 0;
  for (const auto& m : s.members) alive += m.alive;
  if (a.json) {
    nlohmann::json members = nlohmann::json::array();
    for (const auto& m : s.members) {
      nlohmann::json devs = nlohmann::json::array();
      for (const auto& d : m.devices) devs.push_back({{"id", d.id}, {"capacity", d.capacity}, {"used", d.used}, {"peak", d.peak}});
      members.push_back({{"rank", m.rank}, {"alive", m.alive}, {"listen", m.listen}, {"pid", m.pid},
                         {"ms_since_heartbeat", m.ms_since_heartbeat}, {"heartbeats", m.heartbeats}, {"joins", m.joins},
                         {"devices", devs}, {"clock_offset_ms", clock_ms(m.clock_offset_ns, m.clock_rtt_ns)},
                         {"clock_rtt_ms", clock_ms(m.clock_rtt_ns, m.clock_rtt_ns)}});
    }
    std::cout << nlohmann::json{{"nodes", s.nodes}, {"alive", alive}, {"members", members}}.dump() << "\n";
    return;
  }
  std::cout << fmt::format("{} of {} nodes alive\n", alive, s.nodes);
  std::cout << fmt::format("{:>4} {:<6} {:<22} {:>8} {:>10} {:>6} {:>8} {:>16}\n", "rank", "state", "listen", "pid", "heartbeat", "joins",
                           "devices", "clock offset");
  for (const auto& m : s.members) {
    const std::string clock = m.clock_rtt_ns < 0 ? "-" : fmt::format("{:+.3f} ms ±{:.3f}", static_cast<double>(m.clock_offset_ns) / 1e6,
                                                                      static_cast<double>(m.clock_rtt_ns) / 2e6);
    std::cout << fmt::format("{:>4} {:<6} {:<22} {:>8} {:>8} ms {:>6} {:>8} {:>16}\n", m.rank, m.alive ? "alive" : "lost", m.listen, m.pid,
                             m.ms_since_heartbeat, m.joins, m.devices.size(), clock);
  }
}

/// A plan argument's JSON text: the text itself, or the file it names.
std::string plan_text(const std::string& arg) { return !arg.empty() && arg.front() == '{' ? arg : read_text_file(arg); }

std::string plan_line(const nlohmann::json& plan) {
  std::string out;
  for (const auto& [stage, spec] : plan.items()) out += fmt::format("    {:<18} {}\n", stage, spec.get<std::string>());
  return out;
}

std::string transition_lines(const nlohmann::json& t) {
  std::string out = fmt::format("  transition: {} in {:.3f} s (planned {:.3f} s): {} builds, {} destroys, {} moved, {} copied\n",
                                t.value("completed", false) ? "completed" : "stopped", t.value("seconds", 0.0),
                                t.value("planned_seconds", 0.0), t.value("builds", 0), t.value("destroys", 0),
                                human_bytes(t.value("moved_bytes", std::uint64_t{0})), human_bytes(t.value("copied_bytes", std::uint64_t{0})));
  if (t.contains("error")) out += fmt::format("    stopped: {}\n", t["error"].get<std::string>());
  return out;
}

int run_job(const JobArgs& a) {
  const Endpoint at = parse_endpoint(a.coordinator, "--coordinator");
  JobRequest r;
  r.job = read_file_or_preset(PresetKind::job, a.job, "job");
  const JobSpec job = with_mode(parse_job(r.job, a.job), a.mode, a.max_staleness);  // bad input fails here, before any daemon is asked
  if (!a.mode.empty() || a.max_staleness > 0) {  // the coordinator reads the job file's fields
    nlohmann::json text = nlohmann::json::parse(r.job);
    text["mode"] = job.async ? "async" : "sync";
    if (job.async) text["max_staleness"] = job.max_staleness;
    else text.erase("max_staleness");
    r.job = text.dump();
  }
  if (job.async && !a.node_steps)
    throw Error("an async job across daemons runs its two streams on the nodes' frameworks: pass --node-steps");
  if (job.async && a.overlap)
    throw Error("--overlap is for sync jobs: an async job changes plan between training steps, once generation drained");
  r.cluster = read_file_or_preset(PresetKind::cluster, a.cluster, "cluster");
  parse_cluster(r.cluster, a.cluster);
  if (!a.plan.empty()) parse_global_plan(job, r.plan = plan_text(a.plan), a.plan);
  if (!a.to.empty()) parse_global_plan(job, r.target = plan_text(a.to), a.to);
  r.response_len = a.response_len;
  r.response_len_after = a.response_len_after;
  r.verify = !a.no_verify;
  r.timeout_seconds = a.timeout;
  r.kill_node = a.kill_node;
  r.freeze_node = a.freeze_node;
  parse_fault_moment(r.inject_at = a.inject_at);
  r.steps = a.steps;
  r.step_seconds = a.step_seconds;
  r.node_steps = a.node_steps;
  r.overlap = a.overlap;
  r.two_sided = a.transport == "ucx-tag";
  r.perfetto = !a.perfetto.empty();
  const Body ask = r;
  // Loading, each step's transition, a recovery and the check: each may take up to the timeout.
  const double limit = a.timeout * (8 + 2.0 * a.steps) + a.steps * a.step_seconds;
  const std::string text = ask_daemon<TransitionResult>(at, load_token(a.token_file), ask, Millis(static_cast<long>(limit * 1000))).json;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw Error("the coordinator's report is not JSON");
  }
  const bool ok = !j.contains("error") && (!j.contains("verified") || j["verified"].get<bool>());
  if (j.contains("perfetto")) {  // written even when the job failed: that is when it helps most
    std::ofstream f(a.perfetto);
    f << j["perfetto"].dump() << "\n";
    if (!f) throw Error("--perfetto: cannot write '" + a.perfetto + "'");
    j.erase("perfetto");
  }
  if (a.json) {
    std::cout << j.dump() << "\n";
  } else {
    std::cout << fmt::format("job over nodes {}, {} devices each\n  first plan:\n{}", j["nodes"].dump(), j.value("devices_per_node", 0),
                             plan_line(j["initial_plan"]));
    for (const auto& step : j.value("steps", nlohmann::json::array())) {
      std::cout << fmt::format("  step {} (responses {:.0f} tokens): ", step.value("step", 0), step.value("response_len", 0.0));
      if (step.contains("staleness"))  // an async job: the version generation ran on
        std::cout << fmt::format("generated on weights v{} (staleness {}); ", step.value("weight_version", 0), step.value("staleness", 0));
      if (step.contains("measured")) {  // --node-steps: what the frameworks measured
        std::string times;
        for (const auto& [stage, seconds] : step["measured"]["stage_seconds"].items())
          times += fmt::format("{}{} {:.3f} s", times.empty() ? "" : ", ", stage, seconds.get<double>());
        const double seen = step["measured"].value("response_len_mean", 0.0);
        std::cout << fmt::format("nodes {} ran it ({}{}); ", step["measured"]["nodes"].dump(), times.empty() ? "no times" : times,
                                 seen > 0 ? fmt::format("; responses {:.0f} tokens as they measured", seen) : "");
      }
      if (step.contains("decision")) {
        const auto& d = step["decision"];
        std::cout << fmt::format("controller {} ({})\n", d.value("admitted", false) ? "admitted" : "kept the plan",
                                 d.value("why", "").empty() ? "no signal drifted" : d.value("why", ""));
      } else {
        std::cout << "the plan --to names\n";
      }
      if (step.contains("weight_sync")) {
        const auto& w = step["weight_sync"];
        std::cout << fmt::format("  weight sync: {} unit{} in {:.3f} s, {} between devices\n", w.value("builds", 0),
                                 w.value("builds", 0) == 1 ? "" : "s", w.value("seconds", 0.0),
                                 human_bytes(w.value("link_bytes", std::uint64_t{0})));
      }
      if (step.contains("transition")) std::cout << transition_lines(step["transition"]);
    }
    for (const auto& u : j.value("weight_updates", nlohmann::json::array()))
      std::cout << fmt::format("  weight update v{}: {} in {:.3f} s, generation paused {:.3f} s, {}\n", u.value("version", 0),
                               human_bytes(u.value("moved_bytes", std::uint64_t{0})), u.value("seconds", 0.0),
                               u.value("paused_seconds", 0.0),
                               u.contains("dropped") ? "dropped: " + u.value("dropped", "") : u.value("switched", false) ? "switched in" : "not switched");
    for (const auto& f : j.value("failures", nlohmann::json::array())) {
      std::cout << fmt::format("  lost nodes {} during {} (noticed after {:.3f} s)\n", f["lost_nodes"].dump(), f.value("phase", ""),
                               f.value("detected_seconds", 0.0));
      if (f.contains("why"))
        for (const auto& [rank, why] : f["why"].items()) std::cout << fmt::format("    node {}: {}\n", rank, why.get<std::string>());
      if (!f.contains("intact_plan")) continue;
      std::cout << fmt::format("  intact units:\n{}", plan_line(f["intact_plan"]));
      std::cout << fmt::format("  recovery: {} ({})\n", f["decision"].value("admitted", false) ? "replanned" : "kept the intact units",
                               f["decision"].value("why", ""));
      if (f.contains("transition")) std::cout << transition_lines(f["transition"]);
    }
    if (j.contains("plan")) std::cout << fmt::format("  plan now:\n{}", plan_line(j["plan"]));
    if (j.contains("verified"))
      std::cout << fmt::format("  verified: {} ({})\n", j["verified"].get<bool>() ? "yes" : "NO", human_bytes(j.value("verified_bytes", std::uint64_t{0})));
    if (j.contains("error")) std::cout << fmt::format("  error: {}\n", j["error"].get<std::string>());
  }
  return ok ? 0 : 1;
}
#else
void run_status(const ClusterArgs&) {
  throw Error("this nereus was built without the control plane (Cap'n Proto and OpenSSL were not found)");
}
int run_job(const JobArgs&) {
  throw Error("this nereus was built without the control plane (Cap'n Proto and OpenSSL were not found)");
}
#endif

}  // namespace

void add_cluster_command(CLI::App& app) {
  auto a = std::make_shared<ClusterArgs>();
  CLI::App* cmd = app.add_subcommand("cluster", "Talk to running nereusd daemons");
  cmd->require_subcommand(1);
  CLI::App* status = cmd->add_subcommand("status", "The nodes the coordinator knows, alive or lost");
  status->add_option("--coordinator", a->coordinator, "HOST:PORT of the coordinator")->required();
  status->add_option("--token-file", a->token_file, "file with the shared secret; else $NEREUS_TOKEN");
  status->add_option("--timeout-ms", a->timeout_ms, "give up after this long (default 5000)");
  status->add_flag("--json", a->json, "print one JSON object");
  status->callback([a] { run_status(*a); });

  auto j = std::make_shared<JobArgs>();
  CLI::App* job = cmd->add_subcommand("job", "Load a job's units onto the daemons and change its plan as the controller decides");
  job->add_option("--coordinator", j->coordinator, "HOST:PORT of the coordinator")->required();
  job->add_option("--token-file", j->token_file, "file with the shared secret; else $NEREUS_TOKEN");
  job->add_option("--job", j->job, "job file or preset (its models: presets, or paths every node can read)")->required();
  job->add_option("--cluster", j->cluster, "cluster file or preset: the hardware the cost model assumes (default h200-node); "
                                           "nodes, GPUs per node and memory come from the daemons");
  job->add_option("--plan", j->plan, "first plan (file or JSON text, devices numbered over the alive nodes); default: the controller's");
  job->add_option("--to", j->to, "target plan; default: the controller decides");
  job->add_option("--response-len", j->response_len, "mean response length of the first plan's steps (default: half the job's maximum)");
  job->add_option("--response-len-after", j->response_len_after, "mean response length when the controller decides (default: unchanged)");
  job->add_option("--steps", j->steps, "controller steps: each decides for its response length (geometric from --response-len "
                                       "to --response-len-after) and runs the transition it admits (default 1)")
      ->check(CLI::Range(1u, 10000u));
  job->add_option("--step-seconds", j->step_seconds, "wait this long before each step's decision, standing in for the stages' work "
                                                     "(default 0)")
      ->check(CLI::Range(0.0, 3600.0));
  job->add_flag("--node-steps", j->node_steps, "each step runs on the nodes: every node's framework (nereus.Member) runs it on the "
                                                "units it holds and reports its stage times, which calibrate the controller")
      ->excludes("--step-seconds");
  job->add_option("--mode", j->mode, "sync or async (default: the job file's): in an async job generation runs on while "
                                     "training computes, and each training step's weights reach the generation units "
                                     "as a versioned update (docs/cluster.md, \"Async jobs across nodes\"); needs --node-steps");
  job->add_option("--max-staleness", j->max_staleness, "an async job's bound on how many versions generation may run behind "
                                                       "the trainer (default: the job file's, else 1)");
  job->add_flag("--overlap", j->overlap, "with --node-steps: a transition admitted after step k runs while step k+1 computes on "
                                          "the old units (the new plan holds from step k+2); builds that read training state, "
                                          "and destroys, wait for the step's end")
      ->needs("--node-steps");
  job->add_option("--transport", j->transport, "how builds move bytes between host-memory daemons: ucx-tag (tagged messages, "
                                               "the sending nodes taking part; default) or ucx (gets the receiving node runs); "
                                               "GPU daemons use CUDA IPC inside a machine and staged ucx-tag across machines")
      ->check(CLI::IsMember({"ucx", "ucx-tag"}));
  job->add_flag("--no-verify", j->no_verify, "skip checking every unit's bytes against the fill at the end");
  job->add_option("--timeout", j->timeout, "give up a request to a node after this many seconds (default 300)")->check(CLI::PositiveNumber);
  job->add_flag("--json", j->json, "print the report as one JSON object");
  job->add_option("--perfetto", j->perfetto,
                  "write the job's timeline to FILE (Perfetto): the coordinator's phases and graph nodes, every node's transfers moved onto the coordinator's clock");
  job->add_option("--inject-kill-node", j->kill_node)->group("");  // fault injection for tests
  job->add_option("--inject-freeze-node", j->freeze_node)->group("");
  job->add_option("--inject-at", j->inject_at)->group("");  // build (default), load, or MSms after the job opens
  job->callback([j] {
    if (const int rc = run_job(*j); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace nereus::cli
