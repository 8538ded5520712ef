#include "core/error.h"

#include <cerrno>
#include <cstring>

#include "core/write_error.h"

namespace loom {

void assert_fail(const char* file, int line, const char* expr, const std::string& msg) {
  std::fprintf(stderr, "loom: internal error at %s:%d: assertion `%s` failed%s%s\n", file, line, expr,
               msg.empty() ? "" : ": ", msg.c_str());
  std::fprintf(stderr, "This is a bug in loom, not in your input; please report it.\n");
  std::abort();
}

void fail_write(const std::string& path, const std::string& what, int err) {
  if (err == ENOSPC || err == EDQUOT)
    throw UserError(path, what + ": " + std::strerror(err),
                    "its file system is full (or over its quota): free space there, or write to another one");
  if (err == EFBIG)
    throw UserError(path, what + ": " + std::strerror(err),
                    "it outgrew the file-size limit (`ulimit -f`) or its file system's largest file: raise the "
                    "limit, or write to another file system");
  throw std::runtime_error(path + ": " + (err ? what + ": " + std::strerror(err) : what));
}

}  // namespace loom
