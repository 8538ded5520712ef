// Three error channels (docs/ARCHITECTURE.md, "Errors"):
//   1. LOOM_ASSERT   — a broken invariant is a bug in loom: print file:line and abort.
//   2. UserError     — bad input from a person (config key, flag, file): names the thing and the fix.
//   3. Status        — a resource failure (allocation, disk full): returned, the caller decides.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>

namespace loom {

[[noreturn]] void assert_fail(const char* file, int line, const char* expr, const std::string& msg);

#define LOOM_ASSERT(cond, ...)                                                                    \
  do {                                                                                            \
    if (!(cond)) ::loom::assert_fail(__FILE__, __LINE__, #cond, ::loom::assert_msg(__VA_ARGS__)); \
  } while (0)

inline std::string assert_msg() { return {}; }
inline std::string assert_msg(std::string m) { return m; }

// A mistake in something the user gave us. `what()` is "<subject>: <problem>" and `hint()` says
// how to fix it; the CLI prints both and exits with status 2.
class UserError : public std::runtime_error {
 public:
  UserError(std::string subject, std::string problem, std::string hint = {})
      : std::runtime_error(subject.empty() ? problem : subject + ": " + problem),
        subject_(std::move(subject)),
        hint_(std::move(hint)) {}
  const std::string& subject() const { return subject_; }
  const std::string& hint() const { return hint_; }

 private:
  std::string subject_;
  std::string hint_;
};

// Resource failures are values, not exceptions: a failed arena allocation must let the caller
// report "needs N bytes, M available" instead of unwinding through a half-built program.
class Status {
 public:
  static Status ok() { return Status(); }
  static Status error(std::string msg) { return Status(std::move(msg)); }
  bool is_ok() const { return msg_.empty(); }
  explicit operator bool() const { return is_ok(); }
  const std::string& message() const { return msg_; }

 private:
  Status() = default;
  explicit Status(std::string msg) : msg_(msg.empty() ? "unknown error" : std::move(msg)) {}
  std::string msg_;
};

}  // namespace loom
