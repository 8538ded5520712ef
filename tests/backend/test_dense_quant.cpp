// dense and dense_grad_input with a quantized kernel (lora.base_dtype = int8 | nf4, core/quant.h):
//   - the reference backend's results with the quantized kernel are bit for bit its results with
//     a float32 kernel holding the dequantized values (it dequantizes exactly, then rounds once);
//   - the CPU kernels (widened tile by tile, backend/cpu/dense_quant.cpp) agree with the reference
//     within the dense tests' tolerance (NMSE 1e-10 for float32, 1e-4 for bfloat16), with and
//     without a bias, for shapes with several column tiles and a last short one;
//   - the CPU workspace is far smaller than the widened kernel (it grows with K or N, not K · N).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/registry.h"
#include "core/quant.h"
#include "core/rng.h"
#include "graph/passes/plan.h"
#include "io/param_io.h"
#include "runtime/executor.h"

namespace loom {
namespace {

struct Case {
  DType fmt;  // the kernel's storage: i8, nf4, or f32 (the dequantized values)
  DType c;    // compute dtype
  int64_t M, K, N;
  bool bias;
};

struct Result {
  std::vector<float> y, dx;
  int64_t workspace = 0;
};

// Runs y = dense(x, W (+ b)) and dx = dense_grad_input(dy, W) on `device` with W stored as
// c.fmt, from the float32 values `w` (quantized by upload_param, or taken as they are).
Result run(const std::string& device, const Case& c, const std::vector<float>& w, uint64_t seed) {
  Graph g;
  const ValueId x = g.add_input("x", Shape{c.M, c.K}, c.c);
  const ValueId dy = g.add_input("dy", Shape{c.M, c.N}, c.c);
  const ValueId wp = g.add_param("w", Shape{c.K, c.N}, {}, /*trainable=*/false);
  if (c.fmt != DType::f32) g.set_param_dtype(wp, c.fmt);
  std::vector<ValueId> ins = {x, wp};
  if (c.bias) ins.push_back(g.add_input("b", Shape{c.N}, DType::f32));
  const ValueId y = g.node(g.add_node(OpKind::dense, ins, DenseAttrs{c.c}, "d", Phase::forward)).out.at(0);
  const ValueId dx =
      g.node(g.add_node(OpKind::dense_grad_input, {dy, wp}, DenseGradAttrs{c.c, c.c}, "g", Phase::forward)).out.at(0);
  g.mark_output(y);
  g.mark_output(dx);
  auto be = make_backend(device);
  const std::vector<NodeId> sched = default_schedule(g);
  MemoryPlan plan = plan_program(*be, g, sched);
  Result r;
  for (NodeId n : sched) r.workspace = std::max(r.workspace, be->workspace_bytes(g, g.node(n), 1));
  std::unique_ptr<Executor> ex;
  const Status s = Executor::create(*be, g, std::move(plan), &ex);
  EXPECT_TRUE(s) << s.message();
  const PhiloxKey key = rng_key(seed, 0, 0, 0);
  uint64_t k = 0;
  const auto fill = [&](ValueId v) {
    const Value& val = g.value(v);
    std::vector<float> f(static_cast<size_t>(val.shape.numel()));
    for (float& e : f) e = rng_normal(key, k++);
    std::vector<unsigned char> bytes(static_cast<size_t>(val.bytes()));
    convert(f.data(), DType::f32, bytes.data(), val.dtype, f.size());
    ex->upload(v, bytes.data());
  };
  fill(x);
  fill(dy);
  if (c.bias) fill(ins[2]);
  upload_param(*ex, wp, w.data());
  ex->run(RunCtx{});
  for (auto [v, out] : {std::pair{y, &r.y}, std::pair{dx, &r.dx}}) {
    const Value& val = g.value(v);
    std::vector<unsigned char> bytes(static_cast<size_t>(val.bytes()));
    ex->download(v, bytes.data());
    out->resize(static_cast<size_t>(val.shape.numel()));
    convert(bytes.data(), val.dtype, out->data(), DType::f32, out->size());
  }
  return r;
}

std::vector<float> kernel(int64_t K, int64_t N, uint64_t seed) {
  std::vector<float> w(static_cast<size_t>(K * N));
  const PhiloxKey key = rng_key(seed, 1, 0, 0);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * rng_normal(key, i);
  return w;
}

// The quantized kernel's values as float32 [K, N] (upload then read back: io/param_io.h).
std::vector<float> dequantized(DType fmt, const std::vector<float>& w, int64_t K, int64_t N) {
  std::vector<unsigned char> q(static_cast<size_t>(quant_bytes(fmt, Shape{K, N})));
  quantize_kernel(fmt, w.data(), K, N, q.data());
  std::vector<float> wt(w.size()), out(w.size());
  dequantize_tile(fmt, q.data(), K, N, 0, N, 0, K, wt.data(), K);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) out[static_cast<size_t>(k * N + n)] = wt[static_cast<size_t>(n * K + k)];
  return out;
}

double nmse(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return num / den;
}

const char* dn(DType d) { return dtype_name(d); }

TEST(DenseQuant, ReferenceEqualsTheDequantizedFloatKernelAndCpuAgrees) {
  uint64_t seed = 1;
  for (DType fmt : {DType::i8, DType::nf4})
    for (DType c : {DType::f32, DType::bf16})
      for (bool bias : {false, true})
        for (const auto& [M, K, N] : std::vector<std::array<int64_t, 3>>{{5, 64, 130}, {33, 130, 7}, {1, 40, 200}}) {
          const std::string what = std::string(dn(fmt)) + " c=" + dn(c) + (bias ? " bias " : " ") + std::to_string(M) +
                                   "x" + std::to_string(K) + "x" + std::to_string(N);
          const std::vector<float> w = kernel(K, N, ++seed);
          const Case q{fmt, c, M, K, N, bias}, f{DType::f32, c, M, K, N, bias};
          const Result ref_q = run("reference", q, w, seed),
                       ref_f = run("reference", f, dequantized(fmt, w, K, N), seed);
          EXPECT_EQ(ref_q.y, ref_f.y) << what;
          EXPECT_EQ(ref_q.dx, ref_f.dx) << what;
          const Result cpu = run("cpu", q, w, seed);
          const double tol = c == DType::f32 ? 1e-10 : 1e-4;
          EXPECT_LE(nmse(cpu.y, ref_q.y), tol) << what;
          EXPECT_LE(nmse(cpu.dx, ref_q.dx), tol) << what;
        }
}

TEST(DenseQuant, CpuWorkspaceIsTilesNotTheWidenedKernel) {
  const int64_t M = 8, K = 1024, N = 4096;
  const Result r = run("cpu", Case{DType::nf4, DType::bf16, M, K, N, false}, kernel(K, N, 3), 3);
  EXPECT_GT(r.workspace, 0);
  EXPECT_LT(r.workspace, K * N * 4 / 8) << "an eighth of the float32 kernel at most";
}

}  // namespace
}  // namespace loom
