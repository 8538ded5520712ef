// Test support: per-op coverage tables keyed by OpKind.
//
// A test file lists, for each op it covers, the gtest ("Suite.Name") that exercises it:
//
//   constexpr OpTestTable kFdCase = op_test_table({{OpKind::dense, "VjpFd.DenseWithBiasRank3"}, ...});
//
// op_test_table builds, at compile time, an array indexed by OpKind (nullptr where no row names
// the op; two rows for one op do not compile), so the file can static_assert a row for every op
// it must cover, generated from ops.def: adding an op without its test case stops the test binary
// from compiling, with a message naming the op. unregistered_tests checks at run time that every
// test a table names is registered in this binary, so a renamed or deleted test cannot leave a
// row pointing at nothing. A parameterised test ("Prefix/Suite.Name/param", support/backend_param.h)
// is named by its "Suite.Name".
#pragma once
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <initializer_list>
#include <string>

#include "graph/op.h"

namespace loom::testing {

struct OpTestRow {
  OpKind op;
  const char* test;  // "Suite.Name" of a TEST in this binary
};
using OpTestTable = std::array<const char*, kNumOps>;

consteval OpTestTable op_test_table(std::initializer_list<OpTestRow> rows) {
  OpTestTable t{};
  for (const OpTestRow& r : rows) {
    const size_t i = static_cast<size_t>(r.op);
    if (t[i] != nullptr) throw "two rows name the same op";  // not a constant expression: a compile error
    t[i] = r.test;
  }
  return t;
}

constexpr bool has_test(const OpTestTable& t, OpKind op) { return t[static_cast<size_t>(op)] != nullptr; }

// A test suite's name without its instantiation prefix ("Prefix/Suite" -> "Suite").
inline std::string unparameterised(const std::string& suite) { return suite.substr(suite.rfind('/') + 1); }
// A test's name without its parameter's ("Name/cpu" -> "Name").
inline std::string unparameterised_test(const std::string& test) { return test.substr(0, test.find('/')); }

// The tests `t` names that this binary does not register, one per line ("" when there are none).
inline std::string unregistered_tests(const OpTestTable& t) {
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  std::string missing;
  for (int op = 0; op < kNumOps; ++op) {
    const char* want = t[static_cast<size_t>(op)];
    if (want == nullptr) continue;
    bool found = false;
    for (int s = 0; s < u.total_test_suite_count() && !found; ++s) {
      const ::testing::TestSuite& suite = *u.GetTestSuite(s);
      for (int k = 0; k < suite.total_test_count() && !found; ++k)
        found = unparameterised(suite.name()) + "." + unparameterised_test(suite.GetTestInfo(k)->name()) == want;
    }
    if (!found) missing += std::string(op_name(static_cast<OpKind>(op))) + ": " + want + "\n";
  }
  return missing;
}

}  // namespace loom::testing
