// VJP rules of the attention and embedding families against central finite differences, run
// through the real pipeline (graph -> build_backward -> plan -> executor) on the reference
// backend; plus the shape rules of both families and the attention's memory footprint.
//
// Construction as in test_vjp_fd.cpp: the op reads parameters, its output goes through a fixed
// dense "head" to a few logits and cross_entropy with fixed labels; all storage is f32. The
// analytic gradient is read from the persistent grad buffers after one run with seed = 1, the
// numeric one is (L(θ+h) − L(θ−h)) / (2h) per parameter element, h = 1e-2·max(1, |θ|).
// Tolerances (see test_vjp_fd.cpp): relative 1e-2 plus an absolute floor of 5e-4, each test
// asserting its gradients are not all tiny.
//
// Difference from test_vjp_fd.cpp's structure check: a parameter's gradient may also be written
// by embedding_grad (the scatter-add that accumulates straight into the table's gradient), so
// each differentiable use of a parameter must be matched by one grad_accumulate or embedding_grad.
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
  // Values of int32 inputs the builder created, by name (token ids).
  std::map<std::string, std::vector<int32_t>> int_inputs;
  // Value of element i of the parameter at `path`; `dflt` is a N(0, 1) draw.
  std::function<float(const std::string& path, int64_t i, float dflt)> init;
};

using Grads = std::map<std::string, std::vector<float>>;  // analytic, by parameter path

bool writes_grad(const Node& n, ValueId grad) {
  return (n.op == OpKind::grad_accumulate || n.op == OpKind::embedding_grad) && n.in[0] == grad;
}

Grads check_vjp(const std::function<ValueId(const Scope&)>& build, const Options& opt = {}) {
  Graph g;
  Scope root(g);
  ValueId logits = build(root / "op");
  {
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

  for (NodeId i = num_fwd; i < static_cast<NodeId>(g.nodes().size()); ++i)
    EXPECT_EQ(g.node(i).phase, Phase::backward);
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

  MemoryPlan plan = plan_memory(g, default_schedule(g));
  EXPECT_EQ(verify_plan(g, plan), "");
  ReferenceBackend be;
  std::unique_ptr<Executor> ex;
  const Status st = Executor::create(be, g, plan, &ex);
  EXPECT_TRUE(st.is_ok()) << st.message();
  if (!st.is_ok()) return {};

  std::vector<int32_t> lab(static_cast<size_t>(label_shape.numel()));
  for (size_t r = 0; r < lab.size(); ++r) lab[r] = static_cast<int32_t>((r * 7 + 1) % kHeadClasses);
  ex->upload(labels, lab.data());
  for (const auto& [name, vals] : opt.int_inputs) {
    const ValueId v = g.input_by_name(name);
    EXPECT_NE(v, kNoValue) << name;
    EXPECT_EQ(static_cast<int64_t>(vals.size()), g.value(v).shape.numel()) << name;
    ex->upload(v, vals.data());
  }
  const float one = 1.f;
  ex->upload(seed, &one);
  std::vector<std::vector<float>> theta;
  for (size_t k = 0; k < g.params().size(); ++k) {
    const Value& pv = g.value(g.params()[k].value);
    const PhiloxKey key = rng_key(2025, k, 0, 0);
    std::vector<float> v(static_cast<size_t>(pv.shape.numel()));
    for (size_t i = 0; i < v.size(); ++i) {
      const float d = rng_normal(key, i);
      v[i] = opt.init ? opt.init(pv.name, static_cast<int64_t>(i), d) : d;
    }
    ex->upload(g.params()[k].value, v.data());
    theta.push_back(std::move(v));
  }

  Grads res;
  ex->run({});
  float l0 = 0;
  ex->download(loss, &l0);
  EXPECT_TRUE(std::isfinite(l0));
  for (const Param& p : g.params()) {
    std::vector<float> gr(static_cast<size_t>(g.value(p.grad).shape.numel()));
    ex->download(p.grad, gr.data());
    res[g.value(p.value).name] = gr;
  }

  auto eval = [&](size_t k) {
    ex->upload(g.params()[k].value, theta[k].data());
    ex->run_steps({}, 0, static_cast<size_t>(num_fwd));
    float l = 0;
    ex->download(loss, &l);
    return static_cast<double>(l);
  };
  for (size_t k = 0; k < g.params().size(); ++k) {
    const std::string& name = g.value(g.params()[k].value).name;
    const std::vector<float>& an = res[name];
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
    eval(k);
    EXPECT_GT(max_an, 20 * kAbsTol) << name << ": gradients too small for the check to mean anything";
  }
  return res;
}

// ---- attention -----------------------------------------------------------------------------

TEST(VjpFdAttention, QkvParameter) {
  for (bool causal : {false, true})
    check_vjp([causal](const Scope& s) {
      const ValueId qkv = s.param("qkv", Shape{2, 4, 2, 12}, {});  // B=2, T=4, H=2, D=4
      return s.op(OpKind::attention, {qkv}, AttentionAttrs{causal, DType::f32}).at(0);
    });
}

// D = 3: the scale 3^-0.5 is not a power of two; T = 5 odd.
TEST(VjpFdAttention, OddHeadDim) {
  check_vjp([](const Scope& s) {
    const ValueId qkv = s.param("qkv", Shape{1, 5, 1, 9}, {});
    return s.op(OpKind::attention, {qkv}, AttentionAttrs{true, DType::f32}).at(0);
  });
}

// As in the model: dense -> reshape view -> attention, with a peaked softmax (larger logits).
TEST(VjpFdAttention, AfterDenseAndReshape) {
  Options o;
  o.init = [](const std::string& path, int64_t, float d) { return path == "op/qkv/kernel" ? 1.5f * d : d; };
  check_vjp(
      [](const Scope& s) {
        const ValueId x = s.param("x", Shape{2, 3, 4}, {});
        const Scope q = s / "qkv";
        ValueId h = q.op1(OpKind::dense, {x, q.param("kernel", Shape{4, 12}, {}), q.param("bias", Shape{12}, {})},
                          DenseAttrs{DType::f32});
        h = q.op1(OpKind::reshape, {h}, ShapeAttrs{Shape{2, 3, 2, 6}});
        return s.op(OpKind::attention, {h}, AttentionAttrs{true, DType::f32}).at(0);
      },
      o);
}

// lse is a statistic: a cotangent reaching only lse emits nothing for qkv.
TEST(VjpFdAttention, LseCotangentIsIgnored) {
  Graph g;
  Scope root(g);
  const ValueId qkv = root.param("qkv", Shape{1, 4, 2, 6}, {});
  const auto outs = root.op(OpKind::attention, {qkv}, AttentionAttrs{false, DType::f32});
  const ValueId w = root.param("w", Shape{4, 3}, {});
  const ValueId logits = root.op1(OpKind::dense, {outs.at(1), w}, DenseAttrs{DType::f32});  // from lse [1, 2, 4]
  const ValueId labels = g.add_input("labels", Shape{1, 2}, DType::i32);
  const ValueId loss = root.op1(OpKind::cross_entropy, {logits, labels});
  const ValueId seed = g.add_input("seed", Shape{}, DType::f32);
  const NodeId num_fwd = build_backward(g, loss, seed);
  for (NodeId i = num_fwd; i < static_cast<NodeId>(g.nodes().size()); ++i) {
    const Node& n = g.node(i);
    EXPECT_NE(n.op, OpKind::attention_grad);
    if (n.op == OpKind::grad_accumulate) {
      EXPECT_NE(n.in[0], g.grad_of(qkv));
    }
  }
}

// The plan never holds a [.., T, T] buffer: only out and lse are saved, the backward recomputes.
TEST(VjpFdAttention, PlanHasNoTxTBuffer) {
  constexpr int64_t B = 2, T = 64, H = 2, D = 8;
  for (bool causal : {false, true}) {
    Graph g;
    Scope root(g);
    const ValueId qkv = root.param("qkv", Shape{B, T, H, 3 * D}, {});
    const ValueId out = root.op(OpKind::attention, {qkv}, AttentionAttrs{causal, DType::f32}).at(0);
    const ValueId w = root.param("head", Shape{D, 3}, {});
    const ValueId logits = root.op1(OpKind::dense, {out, w}, DenseAttrs{DType::f32});
    const ValueId labels = g.add_input("labels", Shape{B, T, H}, DType::i32);
    const ValueId loss = root.op1(OpKind::cross_entropy, {logits, labels});
    g.mark_output(loss);
    const ValueId seed = g.add_input("seed", Shape{}, DType::f32);
    build_backward(g, loss, seed);
    bool has_grad = false;
    for (const Node& n : g.nodes()) has_grad = has_grad || n.op == OpKind::attention_grad;
    EXPECT_TRUE(has_grad);
    const MemoryPlan plan = plan_memory(g, default_schedule(g));
    EXPECT_EQ(verify_plan(g, plan), "");
    ASSERT_FALSE(plan.buffers.empty());
    for (const BufferInfo& b : plan.buffers) {
      const Shape& s = g.value(b.value).shape;
      for (int i = 0; i + 1 < s.rank; ++i)
        EXPECT_FALSE(s[i] == T && s[i + 1] == T) << "buffer of value %" << b.value << " " << s.str();
      EXPECT_LT(s.numel(), B * H * T * T) << s.str();
    }
    // Far below one f32 copy of the weights (B·H·T² floats = 64 KiB here).
    EXPECT_LT(plan.arena_bytes, B * H * T * T * 4) << plan.arena_bytes;
  }
}

// ---- embedding -----------------------------------------------------------------------------

TEST(VjpFdAttention, EmbeddingTable) {
  Options o;
  o.int_inputs["ids"] = {1, 4, 1, 0, 4, 4};  // repeated ids; rows 2, 3 and 5 unused
  const Grads gr = check_vjp(
      [](const Scope& s) {
        const ValueId ids = s.graph().add_input("ids", Shape{2, 3}, DType::i32);
        const ValueId table = s.param("embedding", Shape{6, 4}, {});
        return s.op1(OpKind::embedding, {ids, table}, DTypeAttrs{DType::f32});
      },
      o);
  const std::vector<float>& t = gr.at("op/embedding");
  for (int64_t row : {2, 3, 5})
    for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(t[static_cast<size_t>(row * 4 + c)], 0.f) << row;
}

// The table used twice (two embedding nodes, as token and position embeddings would share
// nothing but the mechanism): both scatter-adds land in the one gradient buffer.
TEST(VjpFdAttention, EmbeddingTableTwoUses) {
  Options o;
  o.int_inputs["a"] = {0, 2, 2};
  o.int_inputs["b"] = {2, 1, 0};
  check_vjp(
      [](const Scope& s) {
        Graph& g = s.graph();
        const ValueId table = s.param("embedding", Shape{3, 5}, {});
        const ValueId x = s.op1(OpKind::embedding, {g.add_input("a", Shape{3}, DType::i32), table}, DTypeAttrs{});
        const ValueId y = s.op1(OpKind::embedding, {g.add_input("b", Shape{3}, DType::i32), table}, DTypeAttrs{});
        return s.op1(OpKind::gelu, {s.op1(OpKind::add, {x, y})});
      },
      o);
}

TEST(VjpFdAttention, EmbeddingOfNonParameterTableThrows) {
  Graph g;
  Scope root(g);
  const Scope s = root / "embed";
  const ValueId ids = g.add_input("ids", Shape{3}, DType::i32);
  const ValueId table = s.op1(OpKind::cast, {s.param("table", Shape{5, 4}, {})}, DTypeAttrs{DType::f32});
  const ValueId x = s.op1(OpKind::embedding, {ids, table}, DTypeAttrs{DType::f32});
  const ValueId w = root.param("w", Shape{4, 3}, {});
  const ValueId logits = root.op1(OpKind::dense, {x, w}, DenseAttrs{DType::f32});
  const ValueId loss = root.op1(OpKind::cross_entropy, {logits, g.add_input("labels", Shape{3}, DType::i32)});
  const ValueId seed = g.add_input("seed", Shape{}, DType::f32);
  try {
    build_backward(g, loss, seed);
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'embed'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("parameter"), std::string::npos) << e.what();
  }
}

// ---- shape rules -----------------------------------------------------------------------------

TEST(VjpFdAttention, ShapeRules) {
  Graph g;
  auto add = [&](OpKind op, std::vector<ValueId> in, Attrs at) {
    return g.add_node(op, std::move(in), std::move(at), "t", Phase::forward);
  };
  const AttentionAttrs at{true, DType::f32};
  const ValueId qkv = g.add_input("qkv", Shape{2, 5, 3, 12}, DType::bf16);
  const NodeId n = add(OpKind::attention, {qkv}, at);
  EXPECT_EQ(g.value(g.node(n).out[0]).shape, (Shape{2, 5, 3, 4}));
  EXPECT_EQ(g.value(g.node(n).out[0]).dtype, DType::bf16);
  EXPECT_EQ(g.value(g.node(n).out[1]).shape, (Shape{2, 3, 5}));
  EXPECT_EQ(g.value(g.node(n).out[1]).dtype, DType::f32);
  EXPECT_THROW(add(OpKind::attention, {g.add_input("r3", Shape{5, 3, 12}, DType::f32)}, at), std::invalid_argument);
  EXPECT_THROW(add(OpKind::attention, {g.add_input("odd", Shape{2, 5, 3, 10}, DType::f32)}, at), std::invalid_argument);
  EXPECT_THROW(add(OpKind::attention, {g.add_input("zero", Shape{2, 5, 3, 0}, DType::f32)}, at), std::invalid_argument);
  EXPECT_THROW(add(OpKind::attention, {g.add_input("int", Shape{2, 5, 3, 12}, DType::i32)}, at), std::invalid_argument);
  EXPECT_THROW(add(OpKind::attention, {qkv}, AttentionAttrs{false, DType::i32}), std::invalid_argument);
  EXPECT_THROW(add(OpKind::attention, {qkv}, DTypeAttrs{}), std::invalid_argument);

  const ValueId lse = g.node(n).out[1], out = g.node(n).out[0];
  const NodeId gn = add(OpKind::attention_grad, {qkv, lse, out}, at);
  EXPECT_EQ(g.value(g.node(gn).out[0]).shape, (Shape{2, 5, 3, 12}));
  EXPECT_EQ(g.value(g.node(gn).out[0]).dtype, DType::bf16);
  const ValueId out32 = g.add_input("out32", Shape{2, 5, 3, 4}, DType::f32);
  EXPECT_THROW(add(OpKind::attention_grad, {qkv, lse, out32}, at), std::invalid_argument);
  EXPECT_THROW(add(OpKind::attention_grad, {qkv, out, out}, at), std::invalid_argument);
  const ValueId lse_t = g.add_input("lse_t", Shape{2, 5, 3}, DType::f32);  // [B, T, H]: wrong order
  EXPECT_THROW(add(OpKind::attention_grad, {qkv, lse_t, out}, at), std::invalid_argument);

  const ValueId ids = g.add_input("ids", Shape{4, 7}, DType::i32);
  const ValueId table = g.add_param("table", Shape{10, 6}, {});
  const NodeId e = add(OpKind::embedding, {ids, table}, DTypeAttrs{DType::f16});
  EXPECT_EQ(g.value(g.node(e).out[0]).shape, (Shape{4, 7, 6}));
  EXPECT_EQ(g.value(g.node(e).out[0]).dtype, DType::f16);
  EXPECT_THROW(add(OpKind::embedding, {g.add_input("fids", Shape{4}, DType::f32), table}, DTypeAttrs{}),
               std::invalid_argument);
  EXPECT_THROW(add(OpKind::embedding, {ids, g.add_param("t1", Shape{10}, {})}, DTypeAttrs{}), std::invalid_argument);
  EXPECT_THROW(add(OpKind::embedding, {ids, table}, DTypeAttrs{DType::i32}), std::invalid_argument);
  EXPECT_THROW(add(OpKind::embedding, {g.add_input("r6", Shape{1, 1, 1, 1, 1, 1}, DType::i32), table}, DTypeAttrs{}),
               std::invalid_argument);

  const ValueId dy = g.add_input("dy", Shape{4, 7, 6}, DType::bf16);
  const NodeId eg = add(OpKind::embedding_grad, {g.grad_of(table), ids, dy}, NoAttrs{});
  EXPECT_TRUE(g.node(eg).out.empty());
  EXPECT_THROW(add(OpKind::embedding_grad, {table, ids, dy}, NoAttrs{}), std::invalid_argument);  // not a grad
  EXPECT_THROW(add(OpKind::embedding_grad, {g.grad_of(table), ids, g.add_input("dy5", Shape{4, 7, 5}, DType::f32)},
                   NoAttrs{}),
               std::invalid_argument);
}

}  // namespace
}  // namespace loom
