#pragma once
// What the planning benches share: `--repeat N`, `--smoke`, `--json`, and a median.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace bench {

struct Args {
  int repeat = 31;
  bool json = false;
};

/// Parses the common flags; prints the usage line and exits 2 on anything else.
inline Args parse_args(int argc, char** argv, const char* name) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--smoke")) a.repeat = 3;
    else if (!std::strcmp(argv[i], "--json")) a.json = true;
    else if (!std::strcmp(argv[i], "--repeat") && i + 1 < argc) a.repeat = std::max(1, std::atoi(argv[++i]));
    else {
      fmt::print(stderr, "usage: {} [--repeat N] [--smoke] [--json]\n", name);
      std::exit(2);
    }
  }
  return a;
}

/// The median of `xs` (the upper one of an even count).
inline double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

/// Median wall time of `repeat` calls of f, in milliseconds.
template <class F>
double median_ms(int repeat, F&& f) {
  std::vector<double> ms;
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(std::move(ms));
}

}  // namespace bench
