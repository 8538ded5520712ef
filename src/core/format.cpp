#include "core/format.h"

#include <fmt/format.h>

namespace loom {

std::string format_bytes(int64_t b) {
  const double v = static_cast<double>(b);
  if (b < 1024) return fmt::format("{} B", b);
  if (b < 1024 * 1024) return fmt::format("{:.1f} KiB", v / 1024);
  if (b < 1024LL * 1024 * 1024) return fmt::format("{:.1f} MiB", v / (1024.0 * 1024));
  return fmt::format("{:.2f} GiB", v / (1024.0 * 1024 * 1024));
}

std::string format_count(int64_t n) {
  const std::string s = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && s[i - 1] != '-' && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

}  // namespace loom
