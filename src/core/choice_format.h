// fmt prints a choice (core/choice.h) by its name: fmt::format("{}", LossScaleMode::static_) is
// "static".
#pragma once
#include <fmt/format.h>

#include <string_view>

#include "core/choice.h"

template <loom::Choice E>
struct fmt::formatter<E, char, void> : fmt::formatter<std::string_view> {
  template <class Context>
  auto format(E e, Context& ctx) const {
    return fmt::formatter<std::string_view>::format(loom::choice_name(e), ctx);
  }
};
