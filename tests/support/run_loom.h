// Test support: runs the loom binary as a user would and captures what it prints.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace loom::testing {

struct RunResult {
  int status;       // exit status (-1 if it did not exit normally)
  std::string out;  // stdout and stderr together
};

// `args` is appended to the binary's path in a shell command; `cwd` (if given) is entered first.
// `binary` is the build tree's loom unless given (the CLI tests run the installed one).
inline RunResult run_loom(const std::string& args, const std::string& cwd = {},
                          const std::string& binary = LOOM_BINARY) {
  std::string cmd = cwd.empty() ? std::string() : "cd " + cwd + " && ";
  cmd += binary + " " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  while (size_t n = fread(buf.data(), 1, buf.size(), f)) out.append(buf.data(), n);
  const int st = pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

}  // namespace loom::testing
