// Test support: a temporary directory removed at the end of its scope, whole-file reads and
// writes, and the message of an expected UserError.
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "core/error.h"

namespace loom::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "loom_test_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // The directory, or `name` inside it.
  std::string path(const std::string& name = {}) const { return name.empty() ? dir_.string() : (dir_ / name).string(); }

 private:
  std::filesystem::path dir_;
};

inline std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + p);
  std::ostringstream s;  // in blocks: test code is unoptimised (tests/CMakeLists.txt)
  s << f.rdbuf();
  return s.str();
}

inline void write_file(const std::string& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
  if (!f) throw std::runtime_error("cannot write " + p);
}

// The message of the UserError `f()` must throw ("" and a test failure when it does not).
template <class F>
std::string user_error(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return {};
}

// tests/golden/hf/<rel>: the fixtures of tools/make_hf_fixtures.sh.
inline std::string hf_golden(const std::string& rel) { return std::string(LOOM_SOURCE_DIR "/tests/golden/hf/") + rel; }

}  // namespace loom::testing
