#include "nereus/control/calibration.hpp"

#include <algorithm>
#include <cmath>

namespace nereus {

Calibrator::Calibrator(std::array<double, kOpClasses> prior, double prior_weight)
    : prior_(prior), prior_weight_(prior_weight) {}

void Calibrator::add(const Measurement& m) {
  if (!(m.seconds > 0)) return;
  std::array<double, kOpClasses> a{};
  for (std::size_t c = 0; c < kOpClasses; ++c) {
    a[c] = m.work.ideal[c] / m.seconds;  // relative: each row predicts 1
    if (m.work.ideal[c] > 0) ++seen_[c];
  }
  for (std::size_t i = 0; i < kOpClasses; ++i) {
    atb_[i] += a[i];
    for (std::size_t j = 0; j < kOpClasses; ++j) ata_[i][j] += a[i] * a[j];
  }
  ++count_;
}

std::array<double, kOpClasses> Calibrator::efficiency() const {
  // Solve (AᵀA + wI) x = Aᵀb + w x0 by Gaussian elimination with partial pivoting; the
  // ridge term keeps it well posed when classes never appear or always appear together.
  // Rows are relative (a class's row entry is its share of the measured time at
  // efficiency 1), so w is the prior's weight in measurements where one class took all
  // the time: it fades as measurements of a class accumulate, and stays where data is thin.
  std::array<std::array<double, kOpClasses + 1>, kOpClasses> m{};
  for (std::size_t i = 0; i < kOpClasses; ++i) {
    const double w = prior_weight_;
    for (std::size_t j = 0; j < kOpClasses; ++j) m[i][j] = ata_[i][j] + (i == j ? w : 0);
    m[i][kOpClasses] = atb_[i] + w / prior_[i];
  }
  for (std::size_t col = 0; col < kOpClasses; ++col) {
    std::size_t piv = col;
    for (std::size_t r = col + 1; r < kOpClasses; ++r)
      if (std::fabs(m[r][col]) > std::fabs(m[piv][col])) piv = r;
    std::swap(m[col], m[piv]);
    for (std::size_t r = 0; r < kOpClasses; ++r) {
      if (r == col || m[col][col] == 0) continue;
      const double f = m[r][col] / m[col][col];
      for (std::size_t k = col; k <= kOpClasses; ++k) m[r][k] -= f * m[col][k];
    }
  }
  std::array<double, kOpClasses> eff = prior_;
  for (std::size_t c = 0; c < kOpClasses; ++c) {
    if (seen_[c] == 0 || m[c][c] == 0) continue;  // never measured: keep the prior
    const double x = m[c][kOpClasses] / m[c][c];
    eff[c] = x > 0 ? std::clamp(1.0 / x, 0.02, 1.0) : prior_[c];
  }
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
