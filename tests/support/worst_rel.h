// How far two sets of gradients (tensors by name) are apart, for tests that compare two ways of
// computing one step.
#pragma once
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace loom::testing {

// max |a − b| over the largest |b| of each tensor of b, worst over the tensors.
inline double worst_rel(const std::map<std::string, std::vector<float>>& a,
                        const std::map<std::string, std::vector<float>>& b) {
  double worst = 0;
  for (const auto& [name, x] : b) {
    const std::vector<float>& y = a.at(name);
    double scale = 0, diff = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::fabs(x[i])));
      diff = std::max(diff, std::fabs(static_cast<double>(y[i]) - x[i]));
    }
    if (scale > 0) worst = std::max(worst, diff / scale);
  }
  return worst;
}

}  // namespace loom::testing
