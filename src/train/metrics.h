// Metrics as (sum, count) pairs summed over minibatches and steps, as in the tutorials.
#pragma once
#include <cstdint>
#include <map>
#include <string>

namespace loom {

struct Metric {
  double sum = 0;
  int64_t count = 0;
  double mean() const { return count ? sum / static_cast<double>(count) : 0.0; }
};

// Sorted by name, like a flattened JAX pytree (the tutorial prints accuracy before loss).
using Metrics = std::map<std::string, Metric>;

void add_metrics(Metrics& into, const Metrics& m);
// The tutorial's print_metrics: "name: value" with six decimals, under an optional title
// centred in '=' (Python's str.center).
std::string format_metrics(const Metrics& m, const std::string& title = {});

}  // namespace loom
