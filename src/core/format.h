// How reports and messages spell numbers: one formatter per kind of number, so `loom params`,
// `loom memory`, `loom profile`, `loom train` (its model.remat = auto line and budget errors, from
// train/) and the end of a run write them alike.
#pragma once
#include <cstdint>
#include <string>

namespace loom {

// Bytes in binary units: "512 B", "41.2 KiB", "3.4 MiB", "3.91 GiB".
std::string format_bytes(int64_t bytes);
// A count with thousands separators: "155,877,376".
std::string format_count(int64_t n);
// A scope path: "(root)" for the model's root scope (ops outside any layer).
inline std::string scope_label(const std::string& scope) { return scope.empty() ? "(root)" : scope; }

}  // namespace loom
