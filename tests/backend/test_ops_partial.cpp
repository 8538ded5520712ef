// Partial backends: a backend that lacks an op says so (supports_op), the executor refuses a
// program with that op by the op's name instead of running anything, and the per-backend op tests
// skip it, naming it, rather than fail. Also the registry the op tests run over.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/reference/reference.h"
#include "runtime/executor.h"
#include "support/backend_param.h"

namespace loom {
namespace {

// The CPU backend's kernels without gelu and gelu_grad: the shape of a backend brought up op by op.
class PartialBackend final : public HostBackend {
 public:
  PartialBackend() : HostBackend(kernels().data(), workspace().data()) {}
  const char* name() const override { return "partial"; }
  bool supports(const Graph&, const Node&) const override { return true; }
  double grad_sq_norm(std::span<const OptimTensor> ts) override { return cpu_.grad_sq_norm(ts); }
  void optimizer_update(std::span<const OptimTensor> ts, const OptimHyper& h) override { cpu_.optimizer_update(ts, h); }

 private:
  static constexpr OpKind kLacks[] = {OpKind::gelu, OpKind::gelu_grad};
  template <class Fn>
  static std::array<Fn, kNumOps> without_lacking(const Fn* table) {
    std::array<Fn, kNumOps> t{};
    std::copy(table, table + kNumOps, t.begin());
    for (OpKind op : kLacks) t[static_cast<size_t>(op)] = nullptr;
    return t;
  }
  static const std::array<KernelFn, kNumOps>& kernels() {
    static const auto t = without_lacking(kCpuKernels);
    return t;
  }
  static const std::array<WorkspaceFn, kNumOps>& workspace() {
    static const auto t = without_lacking(kCpuWorkspace);
    return t;
  }
  CpuBackend cpu_;
};

// x [4, 8] -> silu -> gelu -> y.
struct SiluGelu {
  Graph g;
  ValueId x, y;
  SiluGelu() {
    x = g.add_input("x", Shape{4, 8}, DType::f32);
    const ValueId h = g.node(g.add_node(OpKind::silu, {x}, NoAttrs{}, "act/silu", Phase::forward)).out[0];
    y = g.node(g.add_node(OpKind::gelu, {h}, NoAttrs{}, "act/gelu", Phase::forward)).out[0];
    g.mark_output(y);
  }
};

TEST(PartialBackend, SaysWhichOpsItHas) {
  PartialBackend be;
  EXPECT_FALSE(be.supports_op(OpKind::gelu));
  EXPECT_FALSE(be.supports_op(OpKind::gelu_grad));
  EXPECT_TRUE(be.supports_op(OpKind::silu));
  EXPECT_TRUE(be.supports_op(OpKind::dense));
}

TEST(PartialBackend, ExecutorRefusesTheProgramByTheOpsName) {
  PartialBackend be;
  SiluGelu p;
  // Planning asks for every node's workspace, the lacking one's included: 0, not a call through
  // a missing entry.
  const MemoryPlan plan = plan_program(be, p.g, default_schedule(p.g));
  std::unique_ptr<Executor> ex;
  const Status st = Executor::create(be, p.g, plan, &ex);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(ex, nullptr);
  EXPECT_NE(st.message().find("backend 'partial' does not support op gelu"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("'act/gelu'"), std::string::npos) << st.message();
}

TEST(PartialBackend, RunsTheOpsItHas) {
  PartialBackend be;
  Graph g;
  const ValueId x = g.add_input("x", Shape{4, 8}, DType::f32);
  const ValueId y = g.node(g.add_node(OpKind::silu, {x}, NoAttrs{}, "act/silu", Phase::forward)).out[0];
  g.mark_output(y);
  std::unique_ptr<Executor> ex;
  const Status st = Executor::create(be, g, plan_program(be, g, default_schedule(g)), &ex);
  ASSERT_TRUE(st.is_ok()) << st.message();
  std::vector<float> in(32, 1.f), out(32);
  ex->upload(x, in.data());
  ex->run({});
  ex->download(y, out.data());
  EXPECT_NEAR(out[0], 1.f / (1.f + std::exp(-1.f)), 1e-6f);
}

// A per-backend test of an op its backend lacks reports a skip naming the op, and no failure.
TEST(PartialBackend, OpTestsSkipWhatItLacks) {
  PartialBackend be;
  testing::detail::current_backend() = &be;
  ::testing::TestPartResultArray results;
  {
    const ::testing::ScopedFakeTestPartResultReporter intercept(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    [] { LOOM_REQUIRE_OPS(OpKind::silu, OpKind::gelu, OpKind::gelu_grad, OpKind::gelu); }();
    [] { LOOM_REQUIRE_OPS(OpKind::silu, OpKind::dense); }();
  }
  testing::detail::current_backend() = nullptr;
  ASSERT_EQ(results.size(), 1);
  EXPECT_TRUE(results.GetTestPartResult(0).skipped());
  EXPECT_STREQ(results.GetTestPartResult(0).message(), "backend 'partial' lacks op gelu, gelu_grad");
}

// The op tests run over the registry: every device but auto_ (an alias), each its own backend.
TEST(BackendRegistry, ListsEveryBackend) {
  std::vector<std::string> names;
  for (Device d : backend_devices()) names.emplace_back(make_backend(d)->name());
  EXPECT_EQ(names.size(), choices_of(Device{}).size() - 1);
  for (const char* want : {"cpu", "reference"}) EXPECT_NE(std::find(names.begin(), names.end(), want), names.end());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end()) << "two devices make the same backend";
}

// The reference (the oracle) and the CPU backend have every op; a missing kernel of either is
// also a link error (their tables are generated from graph/ops.def).
TEST(BackendRegistry, ReferenceAndCpuAreComplete) {
  for (Device d : {Device::reference, Device::cpu}) {
    const auto be = make_backend(d);
    for (int op = 0; op < kNumOps; ++op)
      EXPECT_TRUE(be->supports_op(static_cast<OpKind>(op))) << be->name() << " " << op_name(static_cast<OpKind>(op));
  }
}

}  // namespace
}  // namespace loom
