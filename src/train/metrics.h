// Metrics as (sum, count) pairs summed over minibatches and steps, as in the tutorials.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <utility>

namespace loom {

struct Metric {
  double sum = 0;
  int64_t count = 0;
  double mean() const { return count ? sum / static_cast<double>(count) : 0.0; }
};

// Every number a step or an evaluation measures, one field each.
struct Metrics {
  Metric accuracy, loss;
  Metrics& operator+=(const Metrics& m);
  bool empty() const { return loss.count == 0 && accuracy.count == 0; }
};

// The fields with their printed names, sorted by name like a flattened JAX pytree (the tutorial
// prints accuracy before loss).
inline constexpr std::array<std::pair<const char*, Metric Metrics::*>, 2> kMetricFields{{
    {"accuracy", &Metrics::accuracy},
    {"loss", &Metrics::loss},
}};

// The tutorial's print_metrics: "name: value" with six decimals, under an optional title
// centred in '=' (Python's str.center).
std::string format_metrics(const Metrics& m, const std::string& title = {});

}  // namespace loom
