#include "core/config_key.h"

#include <charconv>
#include <cstdio>
#include <vector>

#include "core/error.h"

namespace loom {

void check_key(bool ok, const std::string& key, const std::string& problem, const std::string& hint) {
  if (!ok) throw UserError(key, problem, hint);
}

std::string toml_quote(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string fmt_double(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, ec == std::errc() ? end : buf);
  if (s.find_first_of(".eE") == std::string::npos && s.find("inf") == std::string::npos && s != "nan") s += ".0";
  return s;
}

int64_t parse_int(const std::string& s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) throw std::invalid_argument("not an integer");
  return v;
}

double parse_number(const std::string& s) {
  size_t used = 0;
  double v;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    throw std::invalid_argument("not a number");
  }
  if (used != s.size()) throw std::invalid_argument("not a number");
  if (!std::isfinite(v)) throw std::invalid_argument("infinities and NaN are not allowed");
  return v;
}

DType parse_dtype(const std::string& s) {
  auto d = dtype_from_name(s);
  if (!d) throw std::invalid_argument("not a dtype");
  if (!dtype_is_float(*d)) throw std::invalid_argument(s + " is not a floating-point dtype");
  return *d;
}

std::string float_dtype_names() {
  std::vector<std::string_view> names;
  for (int i = 0; i < kNumDTypes; ++i)
    if (dtype_is_float(static_cast<DType>(i))) names.push_back(dtype_name(static_cast<DType>(i)));
  return join_names(names, ", ");
}

}  // namespace loom
