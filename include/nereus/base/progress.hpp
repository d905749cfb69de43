#pragma once
// A progress line on a terminal for long runs (simulations, benches): done of total, the
// rate and an ETA, redrawn at most 10 times a second on stderr. Silent when stderr is not
// a terminal or when the caller asks for quiet (--quiet, --json), so it never mixes with
// machine-read output.
#include <chrono>
#include <cstdint>
#include <string>

namespace nereus {

class Progress {
 public:
  /// `unit`: "steps", "runs", or "bytes" (shown as B/kB/MB/GB, rate per second).
  Progress(std::string label, double total, std::string unit, bool quiet);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void update(double done);
  /// Clears the line (also done by the destructor).
  void finish();
  bool shown() const { return enabled_; }

 private:
  std::string amount(double x) const;

  std::string label_, unit_;
  double total_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace nereus
