// `nereus bench transition --daemons HOST:PORT`: the coordinator runs the transition across
// the running daemons and answers with the same report as the local bench. With --perfetto
// or --plot it also sends every node's transfers of the last run, which it has moved onto
// its own clock with the offsets the heartbeats measured (clock_sync.hpp).
#include "nereus/base/error.hpp"
#include "transition_bench.hpp"
#ifdef NEREUS_HAVE_CLUSTER
#include "nereus/cluster/auth.hpp"
#include "nereus/cluster/client.hpp"
#endif

namespace nereus::bench {

#ifdef NEREUS_HAVE_CLUSTER
int run_on_daemons(const TransitionConfig& in) {
  using namespace nereus::cluster;
  TransitionConfig c = in;
  if (c.procs != 1) throw Error("--procs and --daemons exclude each other (the daemons' nodes are the processes)");
  const Prepared p = prepare(c);  // bad flags and layouts fail here, before any daemon is asked
  const Endpoint at = parse_endpoint(c.daemons, "--daemons");
  const std::string token = load_token(c.token_file);
  TransitionSpec spec{c.model,    c.from,         c.to,       c.train,       c.sync,        c.repeat,
                      c.verify,   c.dump_dir,     c.capacity, c.copy_threads, c.per_link,    c.chunk_bytes,
                      c.gpus_per_node, c.timeout_seconds, c.kill_node, wants_timings(c),
                      c.two_sided,     c.rounds,          c.cuda,      c.ipc,           c.nccl};
  // The whole run: every phase may take up to the timeout.
  const Body ask = spec;
  const std::string text =
      ask_daemon<TransitionResult>(at, token, ask, Millis(static_cast<long>(c.timeout_seconds * 1000 * 8))).json;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw Error("the coordinator's report is not JSON");
  }
  c.procs = j.value("procs", 1);
  std::map<int, int> machines;
  if (j.contains("machines"))
    for (const auto& [rank, m] : j["machines"].items()) machines[std::stoi(rank)] = m.get<int>();
  const TransferLabels labels = transfer_labels(c, p, j.value("devices_per_node", 1), std::move(machines));
  if (j.contains("timings")) {  // every node's transfers, already on the coordinator's clock
    std::map<int, json> timings;
    for (const auto& [rank, list] : j["timings"].items()) timings[std::stoi(rank)] = list;
    j.erase("timings");
    write_transfer_outputs(c, labels, timings);
  }
  return report(c, p, std::move(j));
}
#else
int run_on_daemons(const TransitionConfig&) {
  throw Error("this nereus was built without the control plane (Cap'n Proto and OpenSSL were not found)");
}
#endif

}  // namespace nereus::bench
