// Test support: tests run once per registered backend (backend/registry.h, backend_devices()).
//
//   class MyOps : public testing::BackendTest {};
//   TEST_P(MyOps, Gelu) {
//     LOOM_REQUIRE_OPS(OpKind::gelu);   // skipped, naming the op, on a backend that lacks it
//     ... testing::under_test() ...     // this instance's backend
//   }
//   INSTANTIATE_TEST_SUITE_P(, MyOps, testing::compared_backends(), testing::backend_name);
//
// Instances are named "MyOps.Gelu/cpu". compared_backends() is every registered backend but the
// reference, the oracle the op tests compare them with; all_backends() includes it (tests that
// check a backend by itself, such as the finite-difference tests). A new backend is tested by
// adding it to the registry.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "graph/op.h"

namespace loom::testing {

namespace detail {
inline Backend*& current_backend() {
  static Backend* be = nullptr;
  return be;
}
}  // namespace detail

// The backend of the parameterised test now running. A global rather than a fixture member so
// that the comparison helpers the tests share (free functions) reach it without a parameter.
inline Backend& under_test() {
  Backend* be = detail::current_backend();
  if (!be) throw std::logic_error("under_test() called outside a BackendTest");
  return *be;
}

class BackendTest : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    be_ = make_backend(GetParam());
    detail::current_backend() = be_.get();
  }
  void TearDown() override { detail::current_backend() = nullptr; }

 private:
  std::unique_ptr<Backend> be_;
};

inline auto all_backends() { return ::testing::ValuesIn(backend_devices().begin(), backend_devices().end()); }

inline auto compared_backends() {
  static const std::vector<Device> devices = [] {
    std::vector<Device> d;
    for (Device dev : backend_devices())
      if (dev != Device::reference) d.push_back(dev);
    return d;
  }();
  return ::testing::ValuesIn(devices);
}

inline std::string backend_name(const ::testing::TestParamInfo<Device>& info) {
  return std::string(choice_name(info.param));
}

// "backend 'x' lacks op a, b" for the ops of `ops` that `be` lacks, each named once; "" when it
// has them all.
inline std::string missing_ops(const Backend& be, const std::vector<OpKind>& ops) {
  std::vector<bool> named(kNumOps);
  std::string names;
  for (OpKind op : ops)
    if (!be.supports_op(op) && !named[static_cast<size_t>(op)]) {
      named[static_cast<size_t>(op)] = true;
      names += (names.empty() ? "" : ", ") + std::string(op_name(op));
    }
  return names.empty() ? "" : "backend '" + std::string(be.name()) + "' lacks op " + names;
}

}  // namespace loom::testing

namespace loom {
// gtest prints a test's parameter with this ("GetParam() = cpu").
inline void PrintTo(Device d, std::ostream* os) { *os << choice_name(d); }
}  // namespace loom

// Skips the running BackendTest, naming the ops, when its backend lacks any of them.
#define LOOM_REQUIRE_OPS(...)                                                                                      \
  if (const std::string loom_missing = ::loom::testing::missing_ops(::loom::testing::under_test(), {__VA_ARGS__}); \
      !loom_missing.empty())                                                                                       \
  GTEST_SKIP() << loom_missing
