// A file loom could not write, as an error that says whose doing it is (core/error.h).
#pragma once
#include <string>

namespace loom {

// Throws for a write of `path` that failed with errno `err` (`what`: the step, e.g. "cannot write
// it"). A full disk (ENOSPC, EDQUOT) or a file past the size limit (EFBIG: `ulimit -f`, whose
// SIGXFSZ the CLI ignores) is the environment's doing, not a bug: a UserError naming the file,
// whose hint says how to make room (callers that catch it add what they kept and how to go on).
// Any other failure (err 0: unknown, as from a stream) is a std::runtime_error naming the file.
[[noreturn]] void fail_write(const std::string& path, const std::string& what, int err);

}  // namespace loom
