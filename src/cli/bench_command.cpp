// `nereus bench transition`: move real bytes for a transition and time it.
#include <memory>

#include "../bench/job_bench.hpp"
#include "../bench/transition_bench.hpp"
#include "commands.hpp"
#include "nereus/base/error.hpp"

namespace nereus::cli {

void add_bench_command(CLI::App& app, const std::vector<std::string>& argv) {
  CLI::App* bench = app.add_subcommand("bench", "Microbenchmarks that move real bytes");
  bench->require_subcommand(1);
  auto c = std::make_shared<bench::TransitionConfig>();
  CLI::App* t = bench->add_subcommand("transition", "Fill source shards, run a transition R times, time and verify it");
  t->add_option("--model", c->model, "config.json path or preset name")->required();
  t->add_option("--from", c->from, "source layout spec")->required();
  t->add_option("--to", c->to, "target layout spec")->required();
  t->add_flag("--train", c->train, "every unit carries the training slots");
  t->add_flag("--sync", c->sync, "weight sync: training source, generation target (param only)");
  t->add_option("--transport", c->transport, "local | ucx (one-sided gets) | ucx-tag (tagged send/recv) | auto (per link: local copies inside a process, UCX gets "
                 "across; with --memory cuda, CUDA IPC gets across) | cuda (units in GPU memory: copies, CUDA IPC gets across "
                 "processes) | nccl (units in GPU memory; every link between processes, or in one process every link, an NCCL message "
                 "in grouped rounds); default local, with --daemons ucx")
      ->check(CLI::IsMember({"local", "ucx", "ucx-tag", "auto", "cuda", "nccl"}));
  t->add_option("--memory", c->memory, "host | cuda: where the units live (GPU d mod the GPUs present); default host")
      ->check(CLI::IsMember({"host", "cuda"}));
  t->add_option("--procs", c->procs, "worker processes (devices split evenly); > 1 needs --transport ucx, ucx-tag, auto, cuda or nccl")
      ->check(CLI::PositiveNumber);
  t->add_option("--nodes", c->nodes,
                 "machines to emulate on this one (worker r on machine r*nodes/procs): CUDA IPC inside each, --across between")
      ->check(CLI::PositiveNumber);
  t->add_option("--across", c->across, "ucx | nccl: what links between machines take beside CUDA IPC (default ucx: tagged "
                                       "messages, GPU memory staged through host memory)")
      ->check(CLI::IsMember({"ucx", "nccl"}));
  t->add_flag("--rounds", c->rounds,
              "two-sided links in rounds, each round's messages posted together (as NCCL needs; nccl always does)");
  t->add_option("--repeat", c->repeat, "runs to time (default 3)")->check(CLI::PositiveNumber);
  t->add_flag("--verify", c->verify, "check every destination (and source) byte against the fill");
  t->add_option("--dump", c->dump_dir, "write destination shards and manifest.json to DIR");
  t->add_option("--perfetto", c->perfetto, "write the last run's transfers as a Perfetto timeline to FILE (per device, per link)");
  t->add_option("--plot", c->plot, "write the last run's GB/s per link over time as an SVG to FILE");
  t->add_flag("--json", c->json, "print one JSON object; no progress line");
  t->add_flag("--quiet", c->quiet, "no progress line on the terminal");
  t->add_option("--capacity", c->capacity, "memory cap per device (e.g. 2GiB); default: what it holds");
  t->add_option("--copy-threads", c->copy_threads, "copy threads per process (default 2)")->check(CLI::PositiveNumber);
  t->add_option("--per-link", c->per_link, "transfers in flight per device pair (default 2)")->check(CLI::PositiveNumber);
  t->add_option("--chunk-bytes", c->chunk_bytes, "largest posted descriptor list (default 64 MiB)")->check(CLI::PositiveNumber);
  t->add_option("--gpus-per-node", c->gpus_per_node, "for sender choice (default 8)")->check(CLI::PositiveNumber);
  t->add_option("--timeout", c->timeout_seconds, "give up a phase after this many seconds (default 300)")
      ->check(CLI::PositiveNumber);
  t->add_option("--daemons", c->daemons, "HOST:PORT of a nereusd coordinator: run across the running daemons");
  t->add_option("--token-file", c->token_file, "with --daemons: the shared secret (else $NEREUS_TOKEN)");
  t->add_flag("--ucx-peer-errors", c->ucx_peer_errors,
              "UCX detects failed peers itself (excludes its shared-memory transports)");
  // Internal: how the parent starts its workers, and fault injection for tests.
  t->add_option("--worker-rank", c->worker_rank)->group("");
  t->add_option("--control-fd", c->control_fd)->group("");
  t->add_option("--inject-kill-worker", c->kill_worker)->group("");
  t->add_option("--inject-kill-node", c->kill_node)->group("");
  t->callback([c, t, &argv] {
    if (!c->daemons.empty() && t->get_option("--transport")->count() == 0) c->transport = "ucx";  // nodes are processes
    c->two_sided = c->transport == "ucx-tag";
    c->nccl = c->transport == "nccl" || c->across == "nccl";
    c->cuda = c->transport == "cuda" || c->transport == "nccl" || c->memory == "cuda";
    c->ipc = c->cuda && (c->transport == "cuda" || c->transport == "auto");
    const int rc = bench::run_transition_bench(*c, argv);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });

  auto k = std::make_shared<bench::CoordinationConfig>();
  CLI::App* co = bench->add_subcommand("coordination",
      "Plan changes of two model-stages on a shared, nearly full pool under random timing: reach the new plan, "
      "no deadlock, no cap violation, bytes verified");
  co->add_option("--type", k->type, "sm-cs (same model, cross stage) | cm-ss (cross model, same stage) | cm-cs")
      ->check(CLI::IsMember({"sm-cs", "cm-ss", "cm-cs"}));
  co->add_option("--trials", k->trials, "trials (default 100)")->check(CLI::PositiveNumber);
  co->add_option("--devices", k->devices, "host devices in the pool (default 8)")->check(CLI::Range(2, 64));
  co->add_option("--seed", k->seed, "random seed (default 1)");
  co->add_option("--slack", k->slack, "capacity above the smallest that admits the transition (default 0.02)")
      ->check(CLI::Range(0.0, 10.0));
  co->add_option("--timeout", k->timeout_seconds, "seconds before a trial counts as deadlocked (default 30)")
      ->check(CLI::PositiveNumber);
  co->add_option("--perfetto", k->perfetto, "write the first 20 trials as a Perfetto timeline to FILE (stages, transition, nodes)");
  co->add_flag("--json", k->json, "print one JSON object");
  co->callback([k] {
    const int rc = bench::run_coordination_bench(*k);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });

  auto ov = std::make_shared<bench::OverlapConfig>();
  CLI::App* o = bench->add_subcommand("overlap",
      "A transition beside CPU stage work on other devices: exposed time against the transition alone");
  o->add_option("--repeat", ov->repeat, "repetitions (default 5)")->check(CLI::PositiveNumber);
  o->add_option("--stage-seconds", ov->stage_seconds, "length of the stage work (default: twice the transition)")
      ->check(CLI::NonNegativeNumber);
  o->add_flag("--smoke", ov->smoke, "tiny models: checks that it works; the figures mean little");
  o->add_flag("--json", ov->json, "print one JSON object");
  o->add_option("--perfetto", ov->perfetto, "write each case's last run of both together as a Perfetto timeline to FILE");
  o->callback([ov] {
    const int rc = bench::run_overlap_bench(*ov);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace nereus::cli
