#include "core/error.h"

namespace loom {

void assert_fail(const char* file, int line, const char* expr, const std::string& msg) {
  std::fprintf(stderr, "loom: internal error at %s:%d: assertion `%s` failed%s%s\n", file, line, expr,
               msg.empty() ? "" : ": ", msg.c_str());
  std::fprintf(stderr, "This is a bug in loom, not in your input; please report it.\n");
  std::abort();
}

}  // namespace loom
