#include "core/choice.h"

#include <algorithm>
#include <vector>

namespace loom {

std::string join_names(std::span<const std::string_view> names, std::string_view last) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? last : ", ";
    out += names[i];
  }
  return out;
}

std::string join_choice_names(std::span<const ChoiceInfo> choices, std::string_view last) {
  std::vector<std::string_view> names;
  for (const ChoiceInfo& c : choices) names.push_back(c.name);
  return join_names(names, last);
}

std::string_view closest_name(std::string_view word, std::span<const std::string_view> names) {
  // Damerau-Levenshtein distance (optimal string alignment), rows i-2, i-1 and i.
  auto distance = [](std::string_view a, std::string_view b) {
    std::vector<size_t> prev2(b.size() + 1), prev(b.size() + 1), row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        row[j] = std::min({prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) row[j] = std::min(row[j], prev2[j - 2] + 1);
      }
      std::swap(prev2, prev);
      std::swap(prev, row);
    }
    return prev[b.size()];
  };
  std::string_view best;
  size_t best_d = 3;
  for (std::string_view n : names)
    if (const size_t d = distance(word, n); d < best_d) best_d = d, best = n;
  return best;
}

std::string unknown_choice(std::string_view noun, std::string_view text) {
  return "unknown " + std::string(noun) + " '" + std::string(text) + "'";
}

}  // namespace loom
