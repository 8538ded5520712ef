// Every differentiable op's VJP rule (ops.def grad column `vjp`) against central finite
// differences, run through the real pipeline (graph -> build_backward -> plan -> executor) on the
// reference backend.
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
// Tolerances: the reference accumulates in double, but every value (parameters, activations and L
// itself) is stored as float32, so each evaluation of L carries a relative rounding error of a
// few 2⁻²⁴. Divided by 2ε that leaves ~1e-5..1e-4 of absolute noise in the numeric gradient, and
// the central difference's truncation error is O(ε²·L''') ~ 1e-5. A relative tolerance of 1e-2
// plus an absolute floor of 5e-4 is far above both and far below the gradients checked (each test
// also asserts its gradients are not all tiny, so the floor cannot hide a wrong rule).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/reference/reference.h"
#include "core/rng.h"
#include "graph/autodiff.h"
#include "graph/graph.h"
#include "graph/plan.h"
#include "runtime/executor.h"

namespace loom {
namespace {

constexpr int64_t kHeadClasses = 3;
constexpr double kRelTol = 1e-2;
constexpr double kAbsTol = 5e-4;

struct Options {
  bool head = true;  // false: the builder's output is already the logits fed to cross_entropy
  RunCtx rc{};
  // Value of element i of the parameter at `path`; `dflt` is a N(0, 1) draw.
  std::function<float(const std::string& path, int64_t i, float dflt)> init;
};

struct Result {
  std::map<std::string, std::vector<float>> grad;  // analytic, by parameter path
  double loss = 0;
};

// Builds the graph with `build` (returns the op's output), checks the backward graph's
// structure, then every parameter element's gradient against central differences.
Result check_vjp(const std::function<ValueId(const Scope&)>& build, const Options& opt = {}) {
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
  const ValueId loss = (root / "loss").op1(OpKind::cross_entropy, {logits, labels});
  g.mark_output(loss);
  const ValueId seed = g.add_input("seed", Shape{}, DType::f32);
  const NodeId num_fwd = build_backward(g, loss, seed);

  // Structure of the backward program: no remat, every node after the forward ones is a backward
  // node, and exactly one grad_accumulate per (differentiable forward node, input slot) use of a
  // parameter (all uses here lie on the path to the loss).
  for (NodeId i = 0; i < static_cast<NodeId>(g.nodes().size()); ++i) {
    const Node& n = g.node(i);
    EXPECT_EQ(n.region, -1);
    EXPECT_NE(n.phase, Phase::recompute);
    EXPECT_EQ(n.phase, i < num_fwd ? Phase::forward : Phase::backward) << "node " << i << " " << op_name(n.op);
  }
  for (const Param& p : g.params()) {
    int uses = 0, accumulates = 0;
    for (NodeId i = 0; i < num_fwd; ++i)
      if (op_info(g.node(i).op).vjp)
        for (ValueId v : g.node(i).in) uses += v == p.value;
    for (NodeId i = num_fwd; i < static_cast<NodeId>(g.nodes().size()); ++i) {
      const Node& n = g.node(i);
      if (n.op == OpKind::grad_accumulate && n.in[0] == p.grad) ++accumulates;
      for (ValueId v : n.in) EXPECT_TRUE(v != p.grad || n.op == OpKind::grad_accumulate);
    }
    EXPECT_EQ(accumulates, uses) << g.value(p.value).name << "\n" << g.dump();
  }

  MemoryPlan plan = plan_memory(g, default_schedule(g));
  EXPECT_EQ(verify_plan(g, plan), "");
  ReferenceBackend be;
  std::unique_ptr<Executor> ex;
  const Status st = Executor::create(be, g, plan, &ex);
  EXPECT_TRUE(st.is_ok()) << st.message();
  if (!st.is_ok()) return {};

  // Fixed inputs and parameter values.
  std::vector<int32_t> lab(static_cast<size_t>(label_shape.numel()));
  for (size_t r = 0; r < lab.size(); ++r) lab[r] = static_cast<int32_t>((r * 7 + 1) % static_cast<size_t>(g.value(logits).shape.last()));
  ex->upload(labels, lab.data());
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

TEST(VjpFd, DenseNoBias) {
  check_vjp([](const Scope& s) {
    const ValueId x = s.param("x", Shape{3, 4}, {});
    const ValueId w = s.param("kernel", Shape{4, 5}, {});
    return s.op1(OpKind::dense, {x, w}, DenseAttrs{DType::f32});
  });
}

TEST(VjpFd, DenseTransposedKernel) {
  // Tied embeddings: logits = x · Eᵀ with E stored [N, K].
  check_vjp([](const Scope& s) {
    const ValueId x = s.param("x", Shape{3, 4}, {});
    const ValueId e = s.param("embedding", Shape{5, 4}, {});
    return s.op1(OpKind::dense, {x, e}, DenseAttrs{DType::f32, true});
  });
}

TEST(VjpFd, DenseWithBiasRank3) {
  check_vjp([](const Scope& s) {
    const ValueId x = s.param("x", Shape{2, 3, 4}, {});
    const ValueId w = s.param("kernel", Shape{4, 5}, {});
    const ValueId b = s.param("bias", Shape{5}, {});
    return s.op1(OpKind::dense, {x, w, b}, DenseAttrs{DType::f32});
  });
}

TEST(VjpFd, DenseRank1Input) {
  check_vjp([](const Scope& s) {
    const ValueId x = s.param("x", Shape{4}, {});
    const ValueId w = s.param("kernel", Shape{4, 6}, {});
    const ValueId b = s.param("bias", Shape{6}, {});
    return s.op1(OpKind::dense, {x, w, b}, DenseAttrs{DType::f32});
  });
}

TEST(VjpFd, LayerNorm) {
  Options o;
  o.init = [](const std::string& path, int64_t, float d) {
    if (path == "op/scale") return 1.f + 0.3f * d;
    if (path == "op/bias") return 0.3f * d;
    return d;
  };
  check_vjp(
      [](const Scope& s) {
        const ValueId x = s.param("x", Shape{3, 6}, {});
        const ValueId scale = s.param("scale", Shape{6}, {});
        const ValueId bias = s.param("bias", Shape{6}, {});
        return s.op(OpKind::layer_norm, {x, scale, bias}, LayerNormAttrs{1e-6f, DType::f32})[0];
      },
      o);
}

TEST(VjpFd, Silu) {
  Options o;
  o.init = [](const std::string&, int64_t, float d) { return 1.5f * d; };
  check_vjp([](const Scope& s) { return s.op1(OpKind::silu, {s.param("x", Shape{3, 5}, {})}); }, o);
}

TEST(VjpFd, Gelu) {
  Options o;
  o.init = [](const std::string&, int64_t, float d) { return 1.5f * d; };
  check_vjp([](const Scope& s) { return s.op1(OpKind::gelu, {s.param("x", Shape{3, 5}, {})}); }, o);
}

TEST(VjpFd, Dropout) {
  Options o;
  o.rc = RunCtx{1234, 5, 2};  // fixed run coordinates: the same mask in every evaluation
  const Result r = check_vjp(
      [](const Scope& s) {
        return s.op1(OpKind::dropout, {s.param("x", Shape{4, 6}, {})}, DropoutAttrs{0.3f, 7});
      },
      o);
  // The mask actually drops something (dropped elements have exactly zero gradient both ways).
  int zeros = 0;
  for (float v : r.grad.at("op/x")) zeros += v == 0.f;
  EXPECT_GT(zeros, 0);
  EXPECT_LT(zeros, 24);
}

TEST(VjpFd, Reshape) {
  // The reshape reads an activation (an f32 -> f32 cast of the parameter), as in a model.
  check_vjp([](const Scope& s) {
    const ValueId x = s.op1(OpKind::cast, {s.param("x", Shape{2, 6}, {})}, DTypeAttrs{DType::f32});
    return s.op1(OpKind::reshape, {x}, ShapeAttrs{Shape{3, 4}});
  });
}

TEST(VjpFd, CastF32) {
  check_vjp([](const Scope& s) {
    return s.op1(OpKind::cast, {s.param("x", Shape{3, 4}, {})}, DTypeAttrs{DType::f32});
  });
}

TEST(VjpFd, AddSameShape) {
  check_vjp([](const Scope& s) {
    return s.op1(OpKind::add, {s.param("a", Shape{3, 4}, {}), s.param("b", Shape{3, 4}, {})});
  });
}

TEST(VjpFd, AddBroadcastSuffix) {
  check_vjp([](const Scope& s) {
    const ValueId t = s.op1(OpKind::add, {s.param("a", Shape{2, 3, 4}, {}), s.param("b", Shape{3, 4}, {})});
    return s.op1(OpKind::add, {t, s.param("c", Shape{4}, {})});
  });
}

TEST(VjpFd, AddSameValueTwice) {
  // One parameter used twice by one node: two uses, two grad_accumulates (checked inside).
  check_vjp([](const Scope& s) {
    const ValueId a = s.param("a", Shape{3, 4}, {});
    return s.op1(OpKind::add, {a, a});
  });
}

TEST(VjpFd, LogSoftmax) {
  check_vjp([](const Scope& s) { return s.op1(OpKind::log_softmax, {s.param("x", Shape{3, 5}, {})}); });
}

TEST(VjpFd, CrossEntropy) {
  Options o;
  o.head = false;
  check_vjp([](const Scope& s) { return s.param("logits", Shape{4, 5}, {}); }, o);
}

TEST(VjpFd, CrossEntropyRank3) {
  Options o;
  o.head = false;
  check_vjp([](const Scope& s) { return s.param("logits", Shape{2, 2, 5}, {}); }, o);
}

TEST(VjpFd, SmallMlpChain) {
  // Several rules composed, with an activation that has two consumers (summed with `add`).
  Options o;
  o.rc = RunCtx{7, 1, 0};
  o.init = [](const std::string& path, int64_t, float d) {
    if (path == "op/ln/scale") return 1.f + 0.2f * d;
    if (path.find("kernel") != std::string::npos) return 0.5f * d;
    return d;
  };
  check_vjp(
      [](const Scope& s) {
        const ValueId x = s.param("x", Shape{2, 3, 4}, {});
        const Scope ln = s / "ln";
        const ValueId h = ln.op(OpKind::layer_norm, {x, ln.param("scale", Shape{4}, {}), ln.param("bias", Shape{4}, {})},
                                LayerNormAttrs{1e-6f, DType::f32})[0];
        const Scope d1 = s / "d1";
        ValueId u = d1.op1(OpKind::dense, {h, d1.param("kernel", Shape{4, 8}, {}), d1.param("bias", Shape{8}, {})},
                           DenseAttrs{DType::f32});
        u = s.op1(OpKind::gelu, {u});
        u = s.op1(OpKind::dropout, {u}, DropoutAttrs{0.25f, 11});
        const Scope d2 = s / "d2";
        u = d2.op1(OpKind::dense, {u, d2.param("kernel", Shape{8, 4}, {})}, DenseAttrs{DType::f32});
        u = s.op1(OpKind::add, {u, h});  // residual: h has two consumers
        return s.op1(OpKind::silu, {u});
      },
      o);
}

// Shape rules tightened alongside the reference kernels: they must reject (std::invalid_argument)
// what a kernel could not index safely, instead of accepting it or aborting in Shape.
TEST(VjpFd, ShapeRulesRejectWhatKernelsCannotIndex) {
  Graph g;
  const ValueId s0 = g.add_input("s0", Shape{}, DType::f32);
  const ValueId c1 = g.add_param("c1", Shape{1}, {});
  EXPECT_THROW(g.add_node(OpKind::layer_norm, {s0, c1, c1}, LayerNormAttrs{}, "t", Phase::forward),
               std::invalid_argument);
  const ValueId x = g.add_input("x", Shape{2, 4}, DType::f32);
  const ValueId scale = g.add_param("scale", Shape{4}, {});
  const ValueId stat = g.add_input("stat", Shape{2}, DType::f32);
  const ValueId bad_stat = g.add_input("bad_stat", Shape{3}, DType::f32);
  EXPECT_NO_THROW(g.add_node(OpKind::layer_norm_grad, {x, x, scale, stat, stat}, LayerNormAttrs{}, "t", Phase::backward));
  EXPECT_THROW(g.add_node(OpKind::layer_norm_grad, {x, x, scale, bad_stat, stat}, LayerNormAttrs{}, "t", Phase::backward),
               std::invalid_argument);
  EXPECT_THROW(g.add_node(OpKind::layer_norm_grad, {x, x, c1, stat, stat}, LayerNormAttrs{}, "t", Phase::backward),
               std::invalid_argument);
  const ValueId w = g.add_param("w", Shape{3, 1}, {});
  EXPECT_THROW(g.add_node(OpKind::dense_grad_input, {s0, w}, DenseGradAttrs{}, "t", Phase::backward),
               std::invalid_argument);
}

// A reshape whose input is a persistent value (a parameter or a batch input) is a view of that
// buffer: the executor must hand the kernel the root's pointer.
TEST(VjpFd, ReshapeOfParameter) {
  check_vjp([](const Scope& s) {
    return s.op1(OpKind::reshape, {s.param("x", Shape{2, 6}, {})}, ShapeAttrs{Shape{3, 4}});
  });
}

}  // namespace
}  // namespace loom
