#pragma once
// Online calibration of the cost model: one efficiency per op class, fitted to measured
// stage times. A measurement is a stage's time and the cost model's ideal seconds per op
// class for that stage; the fit minimises relative error over the configurations measured
// so far (each one's mean over its measurements), with every efficiency in [0.02, 1], pulled
// gently toward the conservative prior so that a class seen rarely (or never) stays where
// it started. The prior weighs as much as `prior_weight` configurations in which its class
// took all the time.
#include <array>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "nereus/control/cost_model.hpp"

namespace nereus {

/// One measured stage time with the work the cost model attributes to it.
struct Measurement {
  StageOps work;
  double seconds = 0;
  /// What ran (a model-stage and its layout): measurements of one configuration weigh as
  /// much together as one of another, so that a plan that runs for a thousand steps does
  /// not drown the profile of the others. Empty: a configuration of its own.
  std::string config;
};

/// Mean and largest absolute percentage error of predictions.
struct Fit {
  double mape = 0;
  double max_ape = 0;
  std::size_t n = 0;
};

class Calibrator {
 public:
  explicit Calibrator(std::array<double, kOpClasses> prior = conservative_efficiency(), double prior_weight = 0.05);

  void add(const Measurement& m);
  /// Efficiencies fitted to every measurement added so far.
  std::array<double, kOpClasses> efficiency() const;
  std::size_t measurements() const { return count_; }
  /// How many measurements did work of each class.
  const std::array<std::size_t, kOpClasses>& seen() const { return seen_; }

  /// Error of `efficiency` on `held_out` measurements.
  static Fit fit(const std::array<double, kOpClasses>& efficiency, const std::vector<Measurement>& held_out);

 private:
  std::array<double, kOpClasses> prior_;
  double prior_weight_;
  // Normal equations of min Σ_config mean over its measurements of ((work · x − t) / t)²
  // + w Σ (x_c − 1/prior_c)², x_c = 1/eff_c, accumulated per configuration.
  struct Sums {
    std::array<std::array<double, kOpClasses>, kOpClasses> ata{};
    std::array<double, kOpClasses> atb{};
    double n = 0;
  };
  std::map<std::string, Sums> sums_;
  std::size_t anonymous_ = 0;  // measurements without a config, each a configuration of its own
  std::array<std::size_t, kOpClasses> seen_{};
  std::size_t count_ = 0;
};

}  // namespace nereus
