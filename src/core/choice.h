// Configuration choices: closed sets of names (an optimizer, a schedule, a data source, ...) with
// each name spelled once, in an X-macro list next to the code that acts on it:
//
//   #define LOOM_LOSS_SCALES(X) X(dynamic, "GradScaler's rule") X(static_, "a fixed scale") X(none, "no scaling")
//   LOOM_CHOICE(LossScaleMode, "loss scaling", LOOM_LOSS_SCALES)
//
// LOOM_CHOICE generates `enum class LossScaleMode { dynamic, static_, none }` and its table of
// names and help lines; the functions below then serve every such enum (found by ADL), so the
// configuration parser, the TOML printer, --help-config and the error messages all read the same
// spellings. A trailing '_' on an enumerator (for C++ keywords: static_, auto_) is not part of its
// name. A list may carry more columns after the help (X(id, help, ...)); LOOM_CHOICE ignores them.
//
// Names that are not identifiers ("state+grads") are spelled out: such a list has the name as its
// second column, X(id, name, help, ...), and is declared with LOOM_CHOICE_SPELLED instead.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "core/error.h"

namespace loom {

struct ChoiceInfo {
  std::string_view name;  // as written in TOML and on the command line
  std::string_view help;  // one line for --help-config
};

// The name of enumerator `id`: "static_" -> "static".
constexpr std::string_view choice_spelling(std::string_view id) {
  return id.ends_with('_') ? id.substr(0, id.size() - 1) : id;
}

#define LOOM_CHOICE_ENUMERATOR(id, help, ...) id,
#define LOOM_CHOICE_INFO(id, help, ...) ::loom::ChoiceInfo{::loom::choice_spelling(#id), help},
#define LOOM_CHOICE_SPELLED_ENUMERATOR(id, name, help, ...) id,
#define LOOM_CHOICE_SPELLED_INFO(id, name, help, ...) ::loom::ChoiceInfo{name, help},
#define LOOM_CHOICE_TABLE(Enum, noun, ENUMERATOR, INFO, LIST)                                 \
  enum class Enum : uint8_t { LIST(ENUMERATOR) };                                             \
  inline constexpr ::loom::ChoiceInfo k##Enum##Choices[] = {LIST(INFO)};                      \
  constexpr std::span<const ::loom::ChoiceInfo> choices_of(Enum) { return k##Enum##Choices; } \
  constexpr std::string_view choice_noun(Enum) { return noun; }
#define LOOM_CHOICE(Enum, noun, LIST) LOOM_CHOICE_TABLE(Enum, noun, LOOM_CHOICE_ENUMERATOR, LOOM_CHOICE_INFO, LIST)
#define LOOM_CHOICE_SPELLED(Enum, noun, LIST) \
  LOOM_CHOICE_TABLE(Enum, noun, LOOM_CHOICE_SPELLED_ENUMERATOR, LOOM_CHOICE_SPELLED_INFO, LIST)

template <class E>
concept Choice = std::is_enum_v<E> && requires(E e) {
  choices_of(e);
  choice_noun(e);
};

template <Choice E>
constexpr std::string_view choice_name(E e) {
  return choices_of(e)[static_cast<size_t>(e)].name;
}

template <Choice E>
constexpr std::optional<E> parse_choice(std::string_view text) {
  const auto all = choices_of(E{});
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i].name == text) return static_cast<E>(i);
  return std::nullopt;
}

// "a, b or c" (`last` joins the last two).
std::string join_names(std::span<const std::string_view> names, std::string_view last = " or ");
std::string join_choice_names(std::span<const ChoiceInfo> choices, std::string_view last = " or ");

template <Choice E>
std::string choice_names(std::string_view last = " or ") {
  return join_choice_names(choices_of(E{}), last);
}

// The name in `names` closest to `word` within two edits (insertions, deletions, substitutions,
// or a swap of two neighbours), for "did you mean ...?"; "" when none is that close.
std::string_view closest_name(std::string_view word, std::span<const std::string_view> names);

// "unknown <noun> '<text>'"
std::string unknown_choice(std::string_view noun, std::string_view text);

// The choice named `text`; otherwise UserError(subject, "unknown <noun> '<text>'", "use a, b or c").
template <Choice E>
E parse_choice_or_throw(std::string_view text, const std::string& subject = {}) {
  if (const std::optional<E> e = parse_choice<E>(text)) return *e;
  throw UserError(subject, unknown_choice(choice_noun(E{}), text), "use " + choice_names<E>());
}

// A subset of a choice's values (e.g. the remat regions MLP, Attn, Block), written as "none" or as
// a comma-separated list.
template <Choice E>
class ChoiceSet {
 public:
  using member_type = E;
  constexpr ChoiceSet() = default;
  constexpr ChoiceSet(std::initializer_list<E> members) {
    for (E e : members) add(e);
  }
  constexpr bool has(E e) const { return bits_ & bit(e); }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr void add(E e) { bits_ |= bit(e); }
  constexpr bool operator==(const ChoiceSet&) const = default;

 private:
  static_assert(choices_of(E{}).size() <= 32, "a ChoiceSet is a 32-bit mask");
  static constexpr uint32_t bit(E e) { return uint32_t{1} << static_cast<unsigned>(e); }
  uint32_t bits_ = 0;
};

// "none" for the empty set, else the members' names in declaration order, joined by ','.
template <Choice E>
std::string choice_set_name(ChoiceSet<E> s) {
  std::string out;
  const auto all = choices_of(E{});
  for (size_t i = 0; i < all.size(); ++i)
    if (s.has(static_cast<E>(i))) (out += out.empty() ? "" : ",") += all[i].name;
  return out.empty() ? "none" : out;
}

// "" or "none": the empty set; otherwise comma-separated names, spaces around each ignored.
// UserError(subject, "unknown <noun> 'x'", "use none, or a comma-separated subset of a, b, c").
template <Choice E>
ChoiceSet<E> parse_choice_set(std::string_view text, const std::string& subject = {}) {
  ChoiceSet<E> s;
  if (text.empty() || text == "none") return s;
  for (size_t start = 0; start <= text.size();) {
    size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view item = text.substr(start, end - start);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    const std::optional<E> e = parse_choice<E>(item);
    if (!e)
      throw UserError(subject, unknown_choice(choice_noun(E{}), item),
                      "use none, or a comma-separated subset of " + choice_names<E>(", "));
    s.add(*e);
    start = end + 1;
  }
  return s;
}

}  // namespace loom
