// A C++ framework process as one node of a Nereus cluster (docs/cluster.md, "A framework
// as a node"): the node's daemon runs inside this process; at each step the coordinator
// asks for (`nereus cluster job --node-steps`), it reads every shard of the units on its
// devices in place, times each model-stage, and reports the times, which calibrate the
// coordinator's controller. It ends when the job on this node ends.
//
//   c++ -std=c++20 member.cpp $(pkg-config --cflags --libs nereus) -o member
//   ./member COORDINATOR RANK NODES TOKEN_FILE [DEVICES] [CAPACITY]
#include <nereus/base/error.hpp>
#include <nereus/cluster/auth.hpp>
#include <nereus/cluster/member.hpp>
#include <nereus/core/bytes.hpp>
#include <nereus/runtime/job.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

namespace cluster = nereus::cluster;

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: member COORDINATOR RANK NODES TOKEN_FILE [DEVICES] [CAPACITY]\n");
    return 2;
  }
  try {
    cluster::DaemonOptions o;
    cluster::LaunchArgs launch;
    launch.coordinator = argv[1];
    launch.node_rank = std::atoi(argv[2]);
    launch.nodes = std::atoi(argv[3]);
    o.launch = cluster::resolve_launch(launch, [](const char* k) { return std::getenv(k); });
    o.token = cluster::load_token(argv[4]);
    o.devices = argc > 5 ? std::atoi(argv[5]) : 2;
    o.device_capacity = nereus::parse_capacity(argc > 6 ? argv[6] : "256MiB");
    cluster::Member m(o);
    std::printf("node %d listening on %s\n", *launch.node_rank, m.listening().str().c_str());
    std::fflush(stdout);
    while (auto step = m.next_step()) {
      std::map<std::string, double> seconds;
      double checksum = 0;
      for (const cluster::NodeUnit& u : step->units) {
        const auto t0 = std::chrono::steady_clock::now();
        for (const nereus::ShardView& s : nereus::shard_views(u.buffers, u.memory))
          for (std::uint64_t b = 0; b < s.bytes(); b += 64) checksum += static_cast<double>(s.data[b]);  // the stage's "work"
        seconds[u.model_stage] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      std::printf("step %lld: %zu units here, checksum %.0f\n", static_cast<long long>(step->step), step->units.size(), checksum);
      std::fflush(stdout);
      m.report({{seconds.begin(), seconds.end()}, step->response_len, step->response_len, 0});
    }
    std::printf("the job ended\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "member: error: %s\n", e.what());
    return 1;
  }
}
