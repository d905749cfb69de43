#include "nereus/base/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace nereus {

Progress::Progress(std::string label, double total, std::string unit, bool quiet)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), enabled_(!quiet && total > 0 && ::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()), last_(start_ - std::chrono::seconds(1)) {}

Progress::~Progress() { finish(); }

std::string Progress::amount(double x) const {
  char buf[64];
  if (unit_ != "bytes") {
    std::snprintf(buf, sizeof buf, "%.0f", x);
    return buf;
  }
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int k = 0;
  while (x >= 1000 && k < 4) x /= 1000, ++k;
  std::snprintf(buf, sizeof buf, k == 0 ? "%.0f %s" : "%.2f %s", x, units[k]);
  return buf;
}

void Progress::update(double done) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ < std::chrono::milliseconds(100) && done < total_) return;
  last_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? done / elapsed : 0;
  const double frac = std::clamp(done / total_, 0.0, 1.0);
  const int width = 24, filled = static_cast<int>(frac * width);
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.resize(width, '-');
  char eta[32] = "";
  if (rate > 0 && done < total_) std::snprintf(eta, sizeof eta, ", ETA %.0f s", (total_ - done) / rate);
  const std::string per = unit_ == "bytes" ? amount(rate) + "/s" : amount(rate) + " " + unit_ + "/s";
  const std::string of = amount(total_) + (unit_ == "bytes" ? "" : " " + unit_);
  std::fprintf(stderr, "\r%s [%s] %3.0f%% %s of %s, %s%s\x1b[K", label_.c_str(), bar.c_str(), 100 * frac, amount(done).c_str(),
               of.c_str(), per.c_str(), eta);
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::finish() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r\x1b[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace nereus
