#include "core/choice.h"

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

std::string unknown_choice(std::string_view noun, std::string_view text) {
  return "unknown " + std::string(noun) + " '" + std::string(text) + "'";
}

}  // namespace loom
