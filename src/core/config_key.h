// Configuration keys as table rows. Each room declares the keys of its slice of the run
// configuration (nn: model.*, optim: optimizer.*, data: data.*, train: the rest) as a table of
// KeySpec<Slice>; train/config.cpp lifts the tables onto the whole configuration, concatenates
// them and does the parsing, overrides, messages and `loom help config` for every key alike.
//
// A row says where its value lives in the slice (a member reference), how it reads from TOML and
// from text, how it prints (as TOML), its help and, when it means something only for some
// configurations, when it applies. A room checks its own keys beside its table (check_key); the
// checks that read more than one room's slice stay in train/config.cpp.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "core/choice.h"
#include "core/dtype.h"

namespace loom {

// A value as the TOML file holds it (monostate: a table, an array or a date, which no key takes).
using KeyValue = std::variant<std::monostate, int64_t, double, bool, std::string>;

// A fact outside the key's own slice that decides whether it applies.
enum class KeyNeeds : uint8_t {
  nothing,
  float16_compute,  // model.dtype = float16 (loss scaling)
};

template <class Slice>
struct KeySpec {
  const char* key;
  const char* type;      // the `loom help config` column: int, number, string, size, dtype, bool, choice
  std::string expected;  // what a value must be, for messages: "an integer"
  const char* help;
  std::span<const ChoiceInfo> choices = {};                  // a choice key's names (help)
  std::function<void(Slice&, const KeyValue&)> set_value;    // throws std::invalid_argument or UserError
  std::function<void(Slice&, const std::string&)> set_text;  // the same, from an override's text
  std::function<std::string(const Slice&)> get;              // as TOML
  // Whether the key means anything for this configuration (nullptr: always, given `needs`). The
  // saved config.toml leaves out the keys that do not (num_classes for a language model,
  // momentum for Adam), so it lists only what shaped the run.
  std::function<bool(const Slice&)> applies = nullptr;
  KeyNeeds needs = KeyNeeds::nothing;
  // A file or directory (nullptr: not a path): resolved when read, relative to the config file
  // that sets it or, on the command line, to the current directory.
  std::function<std::string&(Slice&)> path = nullptr;
  std::function<void(Slice& dst, const Slice& src)> copy;  // dst's value = src's
  // Shapes the model's parameters or changes what they compute (a model.* row): a loom checkpoint
  // given as model.init_from decides it, and a configuration may not contradict it
  // (train/model_source.h).
  bool architecture = false;
};

// A room's check of its own keys: a UserError naming `key` unless `ok` (validate_config adds the
// file name).
void check_key(bool ok, const std::string& key, const std::string& problem, const std::string& hint);

// Text helpers of the rows (core/config_key.cpp).
// Shortest text that reads back as the same double (std::to_chars), so "0.9" stays "0.9".
std::string fmt_double(double v);
// A TOML basic string holding exactly `s`: quotes, backslashes and control characters escaped, so
// any accepted value (a path with a quote in it) reads back from config.toml and state.json.
std::string toml_quote(std::string_view s);
int64_t parse_int(const std::string& s);    // std::invalid_argument when not an integer
double parse_number(const std::string& s);  // finite
DType parse_dtype(const std::string& s);    // a floating-point dtype
std::string float_dtype_names();            // "float32, bfloat16, float16"

namespace keys {

// The member `ref(slice)` refers to, copied from another slice.
template <class Slice, class Get>
auto copier(Get ref) {
  return [ref](Slice& dst, const Slice& src) { ref(dst) = ref(const_cast<Slice&>(src)); };
}

template <class Slice, class Get>
KeySpec<Slice> integer(const char* key, const char* help, Get ref) {
  using T = std::remove_reference_t<decltype(ref(std::declval<Slice&>()))>;
  return {.key = key,
          .type = "int",
          .expected = "an integer",
          .help = help,
          .set_value =
              [ref](Slice& c, const KeyValue& v) {
                if (!std::holds_alternative<int64_t>(v)) throw std::invalid_argument("not an integer");
                ref(c) = static_cast<T>(std::get<int64_t>(v));
              },
          .set_text = [ref](Slice& c, const std::string& s) { ref(c) = static_cast<T>(parse_int(s)); },
          .get = [ref](const Slice& c) { return std::to_string(ref(const_cast<Slice&>(c))); },
          .copy = copier<Slice>(ref)};
}

template <class Slice, class Get>
KeySpec<Slice> number(const char* key, const char* help, Get ref) {
  return {.key = key,
          .type = "number",
          .expected = "a number",
          .help = help,
          .set_value =
              [ref](Slice& c, const KeyValue& v) {
                double d;
                if (const auto* i = std::get_if<int64_t>(&v))
                  d = static_cast<double>(*i);
                else if (const auto* x = std::get_if<double>(&v))
                  d = *x;
                else
                  throw std::invalid_argument("not a number");
                // TOML has inf and nan; no loom setting means them, and they would not survive a checkpoint.
                if (!std::isfinite(d)) throw std::invalid_argument("not a finite number");
                ref(c) = d;
              },
          .set_text = [ref](Slice& c, const std::string& s) { ref(c) = parse_number(s); },
          .get = [ref](const Slice& c) { return fmt_double(ref(const_cast<Slice&>(c))); },
          .copy = copier<Slice>(ref)};
}

template <class Slice, class Get>
KeySpec<Slice> boolean(const char* key, const char* help, Get ref) {
  return {.key = key,
          .type = "bool",
          .expected = "true or false",
          .help = help,
          .set_value =
              [ref](Slice& c, const KeyValue& v) {
                if (!std::holds_alternative<bool>(v)) throw std::invalid_argument("not a boolean");
                ref(c) = std::get<bool>(v);
              },
          .set_text =
              [ref](Slice& c, const std::string& s) {
                if (s == "true" || s == "1")
                  ref(c) = true;
                else if (s == "false" || s == "0")
                  ref(c) = false;
                else
                  throw std::invalid_argument("not a boolean");
              },
          .get = [ref](const Slice& c) { return std::string(ref(const_cast<Slice&>(c)) ? "true" : "false"); },
          .copy = copier<Slice>(ref)};
}

// A key written as a TOML string: `parse` turns the text into the member's value, `print` back.
template <class Slice, class Get, class Parse, class Print>
KeySpec<Slice> text(const char* key, const char* type, std::string expected, const char* help, Get ref, Parse parse,
                    Print print) {
  return {.key = key,
          .type = type,
          .expected = std::move(expected),
          .help = help,
          .set_value =
              [ref, parse](Slice& c, const KeyValue& v) {
                if (!std::holds_alternative<std::string>(v)) throw std::invalid_argument("not a string");
                ref(c) = parse(std::get<std::string>(v));
              },
          .set_text = [ref, parse](Slice& c, const std::string& s) { ref(c) = parse(s); },
          .get = [ref, print](const Slice& c) { return toml_quote(print(ref(const_cast<Slice&>(c)))); },
          .copy = copier<Slice>(ref)};
}

template <class Slice, class Get>
KeySpec<Slice> string(const char* key, const char* help, Get ref) {
  auto same = [](const std::string& s) { return s; };
  return text<Slice>(key, "string", "a string", help, ref, same, same);
}

// A size in bytes kept as its text (train/fit.h, parse_bytes, checks it): a TOML string ("20GiB")
// or integer (21474836480).
template <class Slice, class Get>
KeySpec<Slice> size(const char* key, const char* help, Get ref) {
  KeySpec<Slice> k = string<Slice>(key, help, ref);
  k.type = "size";
  k.expected = "bytes: an integer, or a string such as \"20GiB\"";
  k.set_value = [ref](Slice& c, const KeyValue& v) {
    if (std::holds_alternative<int64_t>(v))
      ref(c) = std::to_string(std::get<int64_t>(v));
    else if (std::holds_alternative<std::string>(v))
      ref(c) = std::get<std::string>(v);
    else
      throw std::invalid_argument("not a size");
  };
  return k;
}

template <class Slice, class Get>
KeySpec<Slice> path(const char* key, const char* help, Get ref) {
  KeySpec<Slice> k = string<Slice>(key, help, ref);
  k.path = [ref](Slice& c) -> std::string& { return ref(c); };
  return k;
}

template <class Slice, class Get>
KeySpec<Slice> dtype(const char* key, const char* help, Get ref) {
  return text<Slice>(key, "dtype", "a dtype name (" + float_dtype_names() + ")", help, ref, parse_dtype, dtype_name);
}

// One of the names of choice E (core/choice.h).
template <class Slice, class Get>
KeySpec<Slice> choice(const char* key, const char* help, Get ref) {
  using E = std::remove_reference_t<decltype(ref(std::declval<Slice&>()))>;
  KeySpec<Slice> k = text<Slice>(
      key, "choice", "one of " + choice_names<E>(), help, ref,
      [](const std::string& s) { return parse_choice_or_throw<E>(s); }, [](E e) { return choice_name(e); });
  k.choices = choices_of(E{});
  return k;
}

// A subset of choice E's names: "none" or comma-separated (ChoiceSet).
template <class Slice, class Get>
KeySpec<Slice> choice_set(const char* key, const char* help, Get ref) {
  using E = typename std::remove_reference_t<decltype(ref(std::declval<Slice&>()))>::member_type;
  KeySpec<Slice> k = text<Slice>(
      key, "choices", "none or a comma-separated subset of " + choice_names<E>(", "), help, ref,
      [](const std::string& s) { return parse_choice_set<E>(s); }, [](ChoiceSet<E> s) { return choice_set_name(s); });
  k.choices = choices_of(E{});
  return k;
}

// `k` with its condition.
template <class Slice>
KeySpec<Slice> only_if(KeySpec<Slice> k, bool (*applies)(const Slice&)) {
  k.applies = applies;
  return k;
}

// `k`, marked as an architecture key.
template <class Slice>
KeySpec<Slice> architecture(KeySpec<Slice> k) {
  k.architecture = true;
  return k;
}

// `k`, applying only when the fact `needs` holds.
template <class Slice>
KeySpec<Slice> only_if(KeySpec<Slice> k, KeyNeeds needs) {
  k.needs = needs;
  return k;
}

}  // namespace keys

// A member reference of slice type S, for the rows: LOOM_KEY_REF(OptimizerConfig, b1).
#define LOOM_KEY_REF(S, member) \
  [](S & c) -> auto& { return c.member; }

}  // namespace loom
