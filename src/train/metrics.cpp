#include "train/metrics.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace loom {

Metrics& Metrics::operator+=(const Metrics& m) {
  for (const auto& [name, field] : kMetricFields) {
    (this->*field).sum += (m.*field).sum;
    (this->*field).count += (m.*field).count;
  }
  return *this;
}

std::string format_metrics(const Metrics& m, const std::string& title) {
  std::vector<std::string> lines;
  for (const auto& [name, field] : kMetricFields) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "%s: %.6f", name, (m.*field).mean());
    lines.emplace_back(buf);
  }
  std::string out;
  if (!title.empty()) {
    const std::string t = " " + title + " ";
    size_t width = t.size();
    for (const auto& l : lines) width = std::max(width, l.size());
    // CPython's str.center: left = pad/2 + (pad & width & 1), so "== Minibatch 1 ===".
    const size_t pad = width - t.size();
    const size_t left = pad / 2 + (pad & width & 1);
    out += std::string(left, '=') + t + std::string(pad - left, '=') + "\n";
  }
  for (const auto& l : lines) out += l + "\n";
  return out;
}

}  // namespace loom
