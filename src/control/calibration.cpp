#include "nereus/control/calibration.hpp"

#include <algorithm>
#include <cmath>

namespace nereus {

namespace {
constexpr double kMinEfficiency = 0.02;
}  // namespace

Calibrator::Calibrator(std::array<double, kOpClasses> prior, double prior_weight)
    : prior_(prior), prior_weight_(prior_weight) {}

void Calibrator::add(const Measurement& m) {
  if (!(m.seconds > 0)) return;
  std::array<double, kOpClasses> a{};
  for (std::size_t c = 0; c < kOpClasses; ++c) {
    a[c] = m.work.ideal[c] / m.seconds;  // relative: each row predicts 1
    if (m.work.ideal[c] > 0) ++seen_[c];
  }
  Sums& sum = sums_[m.config.empty() ? "\x01" + std::to_string(anonymous_++) : m.config];
  for (std::size_t i = 0; i < kOpClasses; ++i) {
    sum.atb[i] += a[i];
    for (std::size_t j = 0; j < kOpClasses; ++j) sum.ata[i][j] += a[i] * a[j];
  }
  sum.n += 1;
  ++count_;
}

std::array<double, kOpClasses> Calibrator::efficiency() const {
  // Minimise Σ_config mean((work · x − t) / t)² + w Σ (x_c − 1/prior_c)² over x_c = 1/eff_c with each
  // efficiency in [kMinEfficiency, 1]: no kernel beats its peak. The bounds are part of
  // the fit, not a clamp after it: an unbounded solution puts one class above its peak
  // (or below zero) to make up for another's error, and clamping that class afterwards
  // leaves the others fitted to a value it no longer has. Rows are relative (a class's
  // entry is its share of the measured time at efficiency 1), so w is the prior's weight
  // in measurements where one class took all the time: it fades as measurements of a
  // class accumulate, and stays where data is thin. A class never measured keeps its prior.
  //
  // The problem is a small convex quadratic with box bounds; projected Gauss-Seidel
  // (one coordinate at a time, each its exact minimum within its bounds) converges on it
  // since the matrix is positive definite (the ridge term makes it so).
  std::array<std::array<double, kOpClasses>, kOpClasses> q{};
  std::array<double, kOpClasses> r{}, x{}, lo{}, hi{};
  for (const auto& [config, sum] : sums_)
    for (std::size_t i = 0; i < kOpClasses; ++i) {
      r[i] += sum.atb[i] / sum.n;
      for (std::size_t j = 0; j < kOpClasses; ++j) q[i][j] += sum.ata[i][j] / sum.n;
    }
  for (std::size_t i = 0; i < kOpClasses; ++i) {
    q[i][i] += prior_weight_;
    r[i] += prior_weight_ / prior_[i];
    lo[i] = 1.0;
    hi[i] = 1.0 / kMinEfficiency;
    x[i] = std::clamp(1.0 / prior_[i], lo[i], hi[i]);
  }
  for (int sweep = 0; sweep < 500; ++sweep) {
    double moved = 0;
    for (std::size_t i = 0; i < kOpClasses; ++i) {
      double g = r[i];
      for (std::size_t j = 0; j < kOpClasses; ++j)
        if (j != i) g -= q[i][j] * x[j];
      const double next = std::clamp(g / q[i][i], lo[i], hi[i]);
      moved = std::max(moved, std::fabs(next - x[i]) / x[i]);
      x[i] = next;
    }
    if (moved < 1e-10) break;
  }
  std::array<double, kOpClasses> eff = prior_;
  for (std::size_t c = 0; c < kOpClasses; ++c)
    if (seen_[c] > 0) eff[c] = 1.0 / x[c];
  return eff;
}

Fit Calibrator::fit(const std::array<double, kOpClasses>& efficiency, const std::vector<Measurement>& held_out) {
  Fit f;
  for (const Measurement& m : held_out) {
    if (!(m.seconds > 0)) continue;
    const double ape = std::fabs(m.work.seconds(efficiency) - m.seconds) / m.seconds;
    f.mape += ape;
    f.max_ape = std::max(f.max_ape, ape);
    ++f.n;
  }
  if (f.n) f.mape /= static_cast<double>(f.n);
  return f;
}

}  // namespace nereus
