#pragma once
// Benches of the job runtime: coordination of plan changes across model-stages on a
// nearly full pool (`nereus bench coordination`), and how much of a transition stays
// exposed when it runs beside stage work (`nereus bench overlap`).
#include <chrono>
#include <functional>
#include <string>

#include "nereus/base/asio.hpp"

namespace nereus::bench {

struct CoordinationConfig {
  std::string type = "sm-cs";  ///< sm-cs | cm-ss | cm-cs
  int trials = 100;
  int devices = 8;
  std::uint64_t seed = 1;
  double slack = 0.02;          ///< capacity above the smallest that admits the transition
  double timeout_seconds = 30;  ///< a trial still running after this counts as a deadlock
  bool json = false;
  std::string perfetto;         ///< write the first 20 trials as a Perfetto timeline (a process each)
};

struct OverlapConfig {
  int repeat = 5;
  double stage_seconds = 0;  ///< CPU work of the running stage; 0: about twice the transition
  bool json = false;
  bool smoke = false;        ///< tiny models: checks it works, figures mean little
  std::string perfetto;      ///< write the last "together" run of each case as a Perfetto timeline
};

int run_coordination_bench(const CoordinationConfig& c);
int run_overlap_bench(const OverlapConfig& c);

/// Runs `work` on `io` until it completes or `timeout` passes; true when it completed.
bool drive(asio::io_context& io, asio::awaitable<void> work, std::chrono::duration<double> timeout,
           std::exception_ptr& error);

}  // namespace nereus::bench
