// Test support: checks an op's VJP rule against central finite differences through the real
// pipeline (graph -> build_backward -> plan -> executor) on the backend of the running BackendTest
// (support/backend_param.h: the tests run once per registered backend, the reference included).
// A program with an op that backend lacks is skipped, naming the op (Result::skipped).
//
// Construction: the op under test reads parameters (add_param values may feed any op), its output
// goes through a fixed "head" dense(out, W_head) to a few logits and then cross_entropy with fixed
// labels, giving a scalar f32 loss L built only from ops in the table. The head mixes every output
// element into every logit, so an error in any element of the op's cotangent shows (cross_entropy
// alone is blind to a per-row constant, since softmax − onehot sums to zero over a row). The
// analytic gradient is read from the persistent grad buffers after one run with seed = 1; the
// numeric one is (L(θ+h⁺) − L(θ−h⁻)) / (h⁺ + h⁻) per parameter element, with h± the actual f32
// steps of ε = 1e-2·max(1, |θ|).
//
// Tolerances: every value (parameters, activations and L itself) is stored as float32 on every
// backend (the reference accumulates in double, the CPU in float over sums of a few dozen terms
// here), so each evaluation of L carries a relative rounding error of a few 2⁻²⁴. Divided by 2ε that leaves ~1e-5..1e-4
// of absolute noise in the numeric gradient, and the central difference's truncation error is O(ε²·L''') ~ 1e-5. A
// relative tolerance of 1e-2 plus an absolute floor of 5e-4 is far above both and far below the gradients checked (each
// test also asserts its gradients are not all tiny, so the floor cannot hide a wrong rule).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/rng.h"
#include "graph/graph.h"
#include "graph/passes/autodiff.h"
#include "graph/passes/plan.h"
#include "runtime/executor.h"
#include "support/backend_param.h"

namespace loom::testing {

inline constexpr int64_t kHeadClasses = 3;
inline constexpr double kRelTol = 1e-2;
inline constexpr double kAbsTol = 5e-4;

struct Options {
  bool head = true;  // false: the builder's output is already the logits fed to cross_entropy
  // The scalar loss of the builder's output and the labels (with head = false); unset: cross_entropy.
  std::function<ValueId(const Scope& s, ValueId out, ValueId labels)> loss;
  RunCtx rc{};
  // Values of int32 inputs the builder created, by name (token ids), or of "labels".
  std::map<std::string, std::vector<int32_t>> int_inputs;
  // Value of element i of the parameter at `path`; `dflt` is a N(0, 1) draw.
  std::function<float(const std::string& path, int64_t i, float dflt)> init;
};

struct Result {
  std::map<std::string, std::vector<float>> grad;  // analytic, by parameter path
  double loss = 0;
  bool skipped = false;  // the backend lacks an op of the program: nothing was checked
};

// A node that writes a parameter's gradient in place: grad_accumulate, dense_grad_weight, or
// embedding_grad's scatter-add (the kOpWritesGrad ops).
inline bool writes_grad(const Node& n, ValueId grad) {
  return (op_info(n.op).flags & kOpWritesGrad) && n.in[0] == grad;
}

// Builds the graph with `build` (returns the op's output), checks the backward graph's
// structure, then every parameter element's gradient against central differences.
inline Result check_vjp(const std::function<ValueId(const Scope&)>& build, const Options& opt = {}) {
  Graph g;
  Scope root(g);
  ValueId logits = build(root / "op");
  if (opt.head) {
    const Value& out = g.value(logits);
    EXPECT_EQ(out.dtype, DType::f32);
    const ValueId w = (root / "head").param("kernel", Shape{out.shape.last(), kHeadClasses}, {});
    logits = (root / "head").op1(OpKind::dense, {logits, w}, DenseAttrs{DType::f32});
  }
  const Shape label_shape = g.value(logits).shape.drop_last();
  const ValueId labels = g.add_input("labels", label_shape, DType::i32);
  const ValueId loss =
      opt.loss ? opt.loss(root / "loss", logits, labels) : (root / "loss").op1(OpKind::cross_entropy, {logits, labels});
  g.mark_output(loss);
  const ValueId seed = g.add_input("seed", Shape{}, DType::f32);
  const NodeId num_fwd = build_backward(g, loss, seed);

  // Structure of the backward program: no remat, every node after the forward ones is a backward
  // node, and exactly one gradient write (a kOpWritesGrad op: see writes_grad) per (differentiable
  // forward node, input slot) use of a parameter (all uses here lie on the path to the loss).
  for (NodeId i = 0; i < static_cast<NodeId>(g.nodes().size()); ++i) {
    const Node& n = g.node(i);
    EXPECT_EQ(n.region, -1);
    EXPECT_NE(n.phase, Phase::recompute);
    EXPECT_EQ(n.phase, i < num_fwd ? Phase::forward : Phase::backward) << "node " << i << " " << op_name(n.op);
  }
  for (const Param& p : g.params()) {
    int uses = 0, writes = 0;
    for (NodeId i = 0; i < num_fwd; ++i)
      if (op_info(g.node(i).op).vjp)
        for (ValueId v : g.node(i).in) uses += v == p.value;
    for (NodeId i = num_fwd; i < static_cast<NodeId>(g.nodes().size()); ++i) {
      const Node& n = g.node(i);
      writes += writes_grad(n, p.grad);
      for (size_t k = 0; k < n.in.size(); ++k) EXPECT_TRUE(n.in[k] != p.grad || (k == 0 && writes_grad(n, p.grad)));
    }
    EXPECT_EQ(writes, uses) << g.value(p.value).name << "\n" << g.dump();
  }

  Backend& be = under_test();
  std::vector<OpKind> ops;
  for (const Node& n : g.nodes()) ops.push_back(n.op);
  if (const std::string lacks = missing_ops(be, ops); !lacks.empty()) {
    [&] { GTEST_SKIP() << lacks; }();  // marks the test skipped; the caller sees Result::skipped
    Result skipped;
    skipped.skipped = true;
    return skipped;
  }
  MemoryPlan plan = plan_program(be, g, default_schedule(g));
  EXPECT_EQ(verify_plan(g, plan), "");
  std::unique_ptr<Executor> ex;
  const Status st = Executor::create(be, g, plan, &ex);
  EXPECT_TRUE(st.is_ok()) << st.message();
  if (!st.is_ok()) return {};

  // Fixed inputs and parameter values.
  std::vector<int32_t> lab(static_cast<size_t>(label_shape.numel()));
  for (size_t r = 0; r < lab.size(); ++r)
    lab[r] = static_cast<int32_t>((r * 7 + 1) % static_cast<size_t>(g.value(logits).shape.last()));
  for (const auto& [name, vals] : opt.int_inputs) {
    const ValueId v = g.input_by_name(name);
    EXPECT_NE(v, kNoValue) << name;
    EXPECT_EQ(static_cast<int64_t>(vals.size()), g.value(v).shape.numel()) << name;
    ex->upload(v, vals.data());
  }
  if (!opt.int_inputs.count("labels")) ex->upload(labels, lab.data());  // else uploaded above
  const float one = 1.f;
  ex->upload(seed, &one);
  std::vector<std::vector<float>> theta;
  for (size_t k = 0; k < g.params().size(); ++k) {
    const Value& pv = g.value(g.params()[k].value);
    const PhiloxKey key = rng_key(2024, k, 0, 0);
    std::vector<float> v(static_cast<size_t>(pv.shape.numel()));
    for (size_t i = 0; i < v.size(); ++i) {
      const float d = rng_normal(key, i);
      v[i] = opt.init ? opt.init(pv.name, static_cast<int64_t>(i), d) : d;
    }
    ex->upload(g.params()[k].value, v.data());
    theta.push_back(std::move(v));
  }

  Result res;
  ex->run(opt.rc);
  float l0 = 0;
  ex->download(loss, &l0);
  res.loss = l0;
  EXPECT_TRUE(std::isfinite(l0));
  for (const Param& p : g.params()) {
    std::vector<float> gr(static_cast<size_t>(g.value(p.grad).shape.numel()));
    ex->download(p.grad, gr.data());
    res.grad[g.value(p.value).name] = gr;
  }

  // Forward-only evaluations of L (the default schedule runs the forward nodes first).
  auto eval = [&](size_t k) {
    ex->upload(g.params()[k].value, theta[k].data());
    ex->run_steps(opt.rc, 0, static_cast<size_t>(num_fwd));
    float l = 0;
    ex->download(loss, &l);
    return static_cast<double>(l);
  };
  for (size_t k = 0; k < g.params().size(); ++k) {
    const std::string& name = g.value(g.params()[k].value).name;
    const std::vector<float>& an = res.grad[name];
    double max_an = 0;
    for (size_t i = 0; i < theta[k].size(); ++i) {
      const float t0 = theta[k][i];
      const float eps = 1e-2f * std::max(1.f, std::fabs(t0));
      const float tp = t0 + eps, tm = t0 - eps;
      theta[k][i] = tp;
      const double lp = eval(k);
      theta[k][i] = tm;
      const double lm = eval(k);
      theta[k][i] = t0;
      const double fd = (lp - lm) / (static_cast<double>(tp) - static_cast<double>(tm));
      const double a = an[i];
      max_an = std::max(max_an, std::fabs(a));
      EXPECT_LE(std::fabs(fd - a), kRelTol * std::max(std::fabs(fd), std::fabs(a)) + kAbsTol)
          << name << "[" << i << "]: analytic " << a << " vs finite difference " << fd;
    }
    eval(k);  // restore
    EXPECT_GT(max_an, 20 * kAbsTol) << name << ": gradients too small for the check to mean anything";
  }
  return res;
}

}  // namespace loom::testing
