// VJP rules of the attention and embedding families against central finite differences, run
// through the real pipeline (graph -> build_backward -> plan -> executor) on every registered
// backend (VjpFdAttention runs once per backend, support/backend_param.h); plus (VjpRulesAttention)
// the backward graph's structure, the shape rules of both families and the attention's memory
// footprint.
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
#include "support/vjp_check.h"

namespace loom {
namespace {

using testing::check_vjp;
using testing::Options;
using testing::Result;

class VjpFdAttention : public testing::BackendTest {};
INSTANTIATE_TEST_SUITE_P(, VjpFdAttention, testing::all_backends(), testing::backend_name);

TEST_P(VjpFdAttention, QkvParameter) {
  for (bool causal : {false, true})
    check_vjp([causal](const Scope& s) {
      const ValueId qkv = s.param("qkv", Shape{2, 4, 2, 12}, {});  // B=2, T=4, H=2, D=4
      return s.op(OpKind::attention, {qkv}, AttentionAttrs{causal, DType::f32}).at(0);
    });
}

// Sliding windows (of one key, and shorter than the sequence), multi-head and grouped-query.
TEST_P(VjpFdAttention, SlidingWindow) {
  for (int32_t window : {1, 2})
    for (int32_t group : {1, 2})
      check_vjp([window, group](const Scope& s) {
        const ValueId qkv = s.param("qkv", Shape{2, 5, 2, (group + 2) * 4}, {});  // B=2, T=5, KV=2, D=4
        return s.op(OpKind::attention, {qkv}, AttentionAttrs{true, DType::f32, group, window}).at(0);
      });
}

// attrs.scale replacing D^-0.5 (Gemma 3's query_pre_attn_scalar^-0.5), with a window and groups:
// the backward's dq carries the same scale.
TEST_P(VjpFdAttention, Scale) {
  check_vjp([](const Scope& s) {
    const ValueId qkv = s.param("qkv", Shape{2, 5, 2, 4 * 4}, {});  // B=2, T=5, KV=2, G=2, D=4
    return s.op(OpKind::attention, {qkv}, AttentionAttrs{.causal = true, .group = 2, .window = 2, .scale = 0.9f}).at(0);
  });
}

// D = 3: the scale 3^-0.5 is not a power of two; T = 5 odd.
TEST_P(VjpFdAttention, OddHeadDim) {
  check_vjp([](const Scope& s) {
    const ValueId qkv = s.param("qkv", Shape{1, 5, 1, 9}, {});
    return s.op(OpKind::attention, {qkv}, AttentionAttrs{true, DType::f32}).at(0);
  });
}

// As in the model: dense -> reshape view -> attention, with a peaked softmax (larger logits).
TEST_P(VjpFdAttention, AfterDenseAndReshape) {
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

// rope (a rotation of q and k by position) then attention, as in a model with model.position =
// rope: positions out of order and large (big angles); multi-head and grouped-query (2 key/value
// heads of 2 query heads each); with and without llama3 frequency scaling.
TEST_P(VjpFdAttention, RopeThenAttention) {
  for (int32_t group : {1, 2})
    for (bool llama3 : {false, true}) {
      Options o;
      o.int_inputs["positions"] = {7, 0, 1000, 3};
      check_vjp(
          [group, llama3](const Scope& s) {
            const ValueId pos = s.graph().add_input("positions", Shape{4}, DType::i32);
            const ValueId qkv = s.param("qkv", Shape{2, 4, 2, (group + 2) * 4}, {});  // B=2, T=4, KV=2, D=4
            RopeAttrs a{.theta = 100.f, .group = group};
            if (llama3) {
              a.llama3_factor = 4.f;
              a.original_max_position = 16;
            }
            const ValueId roped = s.op1(OpKind::rope, {qkv, pos}, a);
            return s.op(OpKind::attention, {roped}, AttentionAttrs{true, DType::f32, group}).at(0);
          },
          o);
    }
}

// Packed examples (attention's positions input): row 0 holds examples of 2, 3 and 1 tokens, row 1
// one of 6; then per-token rope at the same positions before it, as a packed Llama-style row.
TEST_P(VjpFdAttention, PackedExamples) {
  for (int32_t group : {1, 2})
    for (bool rope : {false, true}) {
      Options o;
      o.int_inputs["positions"] = {0, 1, 0, 1, 2, 0, 0, 1, 2, 3, 4, 5};
      check_vjp(
          [group, rope](const Scope& s) {
            const ValueId pos = s.graph().add_input("positions", Shape{2, 6}, DType::i32);
            ValueId qkv = s.param("qkv", Shape{2, 6, 2, (group + 2) * 4}, {});  // B=2, T=6, KV=2, D=4
            if (rope) qkv = s.op1(OpKind::rope, {qkv, pos}, RopeAttrs{.theta = 100.f, .group = group});
            return s.op(OpKind::attention, {qkv, pos}, AttentionAttrs{true, DType::f32, group}).at(0);
          },
          o);
    }
}

// Grouped-query attention alone, full and causal: dk and dv sum over each group's query heads.
TEST_P(VjpFdAttention, GroupedQuery) {
  for (bool causal : {false, true})
    check_vjp([causal](const Scope& s) {
      const ValueId qkv = s.param("qkv", Shape{1, 5, 1, 5 * 4}, {});  // one key/value head, 3 queries, D = 4
      return s.op(OpKind::attention, {qkv}, AttentionAttrs{causal, DType::f32, 3}).at(0);
    });
}

// lse is a statistic: a cotangent reaching only lse emits nothing for qkv.
TEST(VjpRulesAttention, LseCotangentIsIgnored) {
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

// The cost rules count the (query, key) pairs a mask leaves, here counted one by one through
// AttentionAttrs::sees: full, causal, and windows shorter and longer than the sequence (4·B·H·D
// FLOPs per pair forward, 10 backward).
TEST(VjpRulesAttention, CostCountsTheUnmaskedPairs) {
  constexpr int64_t B = 2, T = 37, KV = 2, G = 2, D = 8;
  for (const AttentionAttrs at : {AttentionAttrs{false, DType::f32, G}, AttentionAttrs{true, DType::f32, G},
                                  AttentionAttrs{true, DType::f32, G, 1}, AttentionAttrs{true, DType::f32, G, 5},
                                  AttentionAttrs{true, DType::f32, G, 64}}) {
    Graph g;
    Scope root(g);
    const ValueId qkv = root.param("qkv", Shape{B, T, KV, (G + 2) * D}, {});
    const auto outs = root.op(OpKind::attention, {qkv}, at);
    const ValueId dout = g.add_input("dout", Shape{B, T, KV * G, D}, DType::f32);
    root.op(OpKind::attention_grad, {qkv, outs.at(1), dout}, at);
    int64_t pairs = 0;
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j) pairs += at.sees(i, j);
    const int64_t unit = B * KV * G * D * pairs;
    EXPECT_EQ(node_cost(g, g.node(0)).flops, 4 * unit) << at.window;
    EXPECT_EQ(node_cost(g, g.node(1)).flops, 10 * unit) << at.window;
  }
}

// The plan never holds a [.., T, T] buffer: only out and lse are saved, the backward recomputes.
TEST(VjpRulesAttention, PlanHasNoTxTBuffer) {
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

TEST_P(VjpFdAttention, EmbeddingTable) {
  Options o;
  o.int_inputs["ids"] = {1, 4, 1, 0, 4, 4};  // repeated ids; rows 2, 3 and 5 unused
  const auto gr = check_vjp(
      [](const Scope& s) {
        const ValueId ids = s.graph().add_input("ids", Shape{2, 3}, DType::i32);
        const ValueId table = s.param("embedding", Shape{6, 4}, {});
        return s.op1(OpKind::embedding, {ids, table}, DTypeAttrs{DType::f32});
      },
      o);
  if (gr.skipped) return;
  const std::vector<float>& t = gr.grad.at("op/embedding");
  for (int64_t row : {2, 3, 5})
    for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(t[static_cast<size_t>(row * 4 + c)], 0.f) << row;
}

// The table used twice (two embedding nodes, as token and position embeddings would share
// nothing but the mechanism): both scatter-adds land in the one gradient buffer.
TEST_P(VjpFdAttention, EmbeddingTableTwoUses) {
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

TEST(VjpRulesAttention, EmbeddingOfNonParameterTableThrows) {
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

TEST(VjpRulesAttention, ShapeRules) {
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
  EXPECT_THROW(
      add(OpKind::embedding_grad, {g.grad_of(table), ids, g.add_input("dy5", Shape{4, 7, 5}, DType::f32)}, NoAttrs{}),
      std::invalid_argument);
}

}  // namespace
}  // namespace loom
