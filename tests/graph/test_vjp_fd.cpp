// Every differentiable op's VJP rule (ops.def grad column `vjp`) against central finite
// differences, run through the real pipeline (graph -> build_backward -> plan -> executor) on every
// registered backend, the reference included: VjpFd runs once per backend ("VjpFd.Silu/cpu",
// support/backend_param.h), and a program with an op the backend lacks is skipped, naming it.
// VjpRules: the graph-level checks that run on no backend.
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
#include "support/op_coverage.h"
#include "support/vjp_check.h"

namespace loom {
namespace {

using testing::check_vjp;
using testing::Options;
using testing::Result;

class VjpFd : public testing::BackendTest {};
INSTANTIATE_TEST_SUITE_P(, VjpFd, testing::all_backends(), testing::backend_name);

// The finite-difference test of every op with a VJP rule (some in test_vjp_fd_attention.cpp),
// and of no other: an op whose ops.def grad column is `vjp` without a row here does not compile.
constexpr testing::OpTestTable kFdCase = testing::op_test_table({
    {OpKind::dense, "VjpFd.DenseWithBiasRank3"},
    {OpKind::layer_norm, "VjpFd.LayerNorm"},
    {OpKind::rms_norm, "VjpFd.RmsNorm"},
    {OpKind::qk_norm, "VjpFd.QkNorm"},
    {OpKind::silu, "VjpFd.Silu"},
    {OpKind::gelu, "VjpFd.Gelu"},
    {OpKind::gelu_erf, "VjpFd.GeluErf"},
    {OpKind::silu_mul, "VjpFd.GatedActivations"},
    {OpKind::gelu_mul, "VjpFd.GatedActivations"},
    {OpKind::scale, "VjpFd.Scale"},
    {OpKind::dropout, "VjpFd.Dropout"},
    {OpKind::reshape, "VjpFd.Reshape"},
    {OpKind::cast, "VjpFd.CastF32"},
    {OpKind::add, "VjpFd.AddBroadcastSuffix"},
    {OpKind::add_low_rank, "VjpFd.AddLowRank"},
    {OpKind::log_softmax, "VjpFd.LogSoftmax"},
    {OpKind::cross_entropy, "VjpFd.CrossEntropy"},
    {OpKind::linear_cross_entropy, "VjpFd.LinearCrossEntropy"},
    {OpKind::embedding, "VjpFdAttention.EmbeddingTable"},
    {OpKind::attention, "VjpFdAttention.QkvParameter"},
    {OpKind::rope, "VjpFdAttention.RopeThenAttention"},
});
#define LOOM_OP(name, ...)                                                            \
  static_assert(testing::has_test(kFdCase, OpKind::name) == op_has_vjp(OpKind::name), \
                "op '" #name "': a row in kFdCase exactly when ops.def gives it a VJP rule");
#include "graph/ops.def"
#undef LOOM_OP

TEST(VjpRules, FdTableCoverage) { EXPECT_EQ(testing::unregistered_tests(kFdCase), ""); }

// The fused head and loss: x [5, 4] and the kernel (untied [4, 7], tied [7, 4]), with and without
// a bias [7] (its cotangent linear_cross_entropy_grad_with_bias's output), in chunks of 3 columns
// (the last one 1 wide), rows 1 and 3 ignored.
TEST_P(VjpFd, LinearCrossEntropy) {
  for (bool tied : {false, true})
    for (bool biased : {false, true}) {
      Options o;
      o.head = false;
      o.int_inputs["labels"] = {6, -1, 0, -1, 3};
      o.loss = [tied, biased](const Scope& s, ValueId x, ValueId labels) {
        std::vector<ValueId> in = {x, s.param(tied ? "embedding" : "kernel", tied ? Shape{7, 4} : Shape{4, 7}, {}),
                                   labels};
        if (biased) in.push_back(s.param("bias", Shape{7}, {}));
        return s.op(OpKind::linear_cross_entropy, in,
                    LinearCrossEntropyAttrs{.compute = DType::f32, .transpose_w = tied, .chunk = 3})[0];
      };
      const Result r = check_vjp([](const Scope& s) { return s.param("x", Shape{5, 4}, {}); }, o);
      if (r.skipped) return;
      for (int64_t k = 0; k < 4; ++k) {  // ignored rows have no gradient
        EXPECT_EQ(r.grad.at("op/x")[static_cast<size_t>(4 + k)], 0.f);
        EXPECT_EQ(r.grad.at("op/x")[static_cast<size_t>(12 + k)], 0.f);
      }
      EXPECT_EQ(r.grad.count("loss/bias"), biased ? 1u : 0u) << "the bias's gradient is checked";
    }
}

// A LoRA update into the middle columns of each head of a packed [.., heads, W] output, with V
// stored [r, N] and [N, r].
TEST_P(VjpFd, AddLowRank) {
  for (bool vt : {false, true})
    check_vjp([vt](const Scope& s) {
      const ValueId y = s.param("y", Shape{3, 2, 6}, {});
      const ValueId u = s.param("u", Shape{3, 3}, {});
      const ValueId v = s.param("v", vt ? Shape{4, 3} : Shape{3, 4}, {});
      return s.op1(OpKind::add_low_rank, {y, u, v},
                   ColumnsAttrs{.offset = 3, .width = 2, .scale = 1.7f, .transpose_v = vt});
    });
}

// A LoRA layer: x's cotangent from the frozen-shaped product and the low-rank adapter's term
// (DenseAttrs::low_rank, added by autodiff with add_low_rank), with x feeding both, the adapter
// alone, an adapter on a parameter, and two adapters on one x (q and k of a packed output).
TEST_P(VjpFd, DenseLowRank) {
  enum Where { beside_base, alone, on_param, two };
  for (Where where : {beside_base, alone, on_param, two})
    check_vjp([where](const Scope& s) {
      const ValueId p = s.param("p", Shape{3, 6}, {});
      const ValueId x = where == on_param ? p : s.op1(OpKind::silu, {p});
      const auto adapter = [&](const Scope& a, ValueId y, int64_t offset) {
        const ValueId xa = a.op1(OpKind::dense, {x, a.param("a", Shape{6, 2}, {})},
                                 DenseAttrs{.compute = DType::f32, .low_rank = true});
        return a.op1(OpKind::add_low_rank, {y, xa, a.param("b", Shape{2, 2}, {})},
                     ColumnsAttrs{.offset = offset, .width = 2, .scale = 0.7f});
      };
      ValueId y = where == alone
                      ? s.op1(OpKind::silu, {s.param("y", Shape{3, 5}, {})})
                      : s.op1(OpKind::dense, {x, s.param("kernel", Shape{6, 5}, {})}, DenseAttrs{DType::f32});
      y = adapter(s / "lora_q", y, 0);
      if (where == two) y = adapter(s / "lora_k", y, 3);
      return y;
    });
}

TEST_P(VjpFd, DenseNoBias) {
  check_vjp([](const Scope& s) {
    const ValueId x = s.param("x", Shape{3, 4}, {});
    const ValueId w = s.param("kernel", Shape{4, 5}, {});
    return s.op1(OpKind::dense, {x, w}, DenseAttrs{DType::f32});
  });
}

TEST_P(VjpFd, DenseTransposedKernel) {
  // Tied embeddings: logits = x · Eᵀ with E stored [N, K].
  check_vjp([](const Scope& s) {
    const ValueId x = s.param("x", Shape{3, 4}, {});
    const ValueId e = s.param("embedding", Shape{5, 4}, {});
    return s.op1(OpKind::dense, {x, e}, DenseAttrs{DType::f32, true});
  });
}

TEST_P(VjpFd, DenseWithBiasRank3) {
  check_vjp([](const Scope& s) {
    const ValueId x = s.param("x", Shape{2, 3, 4}, {});
    const ValueId w = s.param("kernel", Shape{4, 5}, {});
    const ValueId b = s.param("bias", Shape{5}, {});
    return s.op1(OpKind::dense, {x, w, b}, DenseAttrs{DType::f32});
  });
}

TEST_P(VjpFd, DenseRank1Input) {
  check_vjp([](const Scope& s) {
    const ValueId x = s.param("x", Shape{4}, {});
    const ValueId w = s.param("kernel", Shape{4, 6}, {});
    const ValueId b = s.param("bias", Shape{6}, {});
    return s.op1(OpKind::dense, {x, w, b}, DenseAttrs{DType::f32});
  });
}

TEST_P(VjpFd, LayerNorm) {
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

TEST_P(VjpFd, RmsNorm) {
  Options o;
  o.init = [](const std::string& path, int64_t, float d) { return path == "op/scale" ? 1.f + 0.3f * d : d; };
  check_vjp(
      [](const Scope& s) {
        const ValueId x = s.param("x", Shape{3, 6}, {});
        const ValueId scale = s.param("scale", Shape{6}, {});
        return s.op(OpKind::rms_norm, {x, scale}, LayerNormAttrs{1e-6f, DType::f32})[0];
      },
      o);
}

// Two key/value rows of two query heads each: the query heads share q_scale, the key heads
// k_scale; the value part passes its cotangent through. Also with unit_offset (Gemma 3's 1 + scale).
TEST_P(VjpFd, QkNorm) {
  for (const bool unit : {false, true}) {
    Options o;
    o.init = [](const std::string& path, int64_t, float d) { return path.ends_with("_scale") ? 1.f + 0.3f * d : d; };
    check_vjp(
        [unit](const Scope& s) {
          const ValueId x = s.param("qkv", Shape{1, 2, 2, 4 * 3}, {});
          const ValueId q = s.param("q_scale", Shape{3}, {});
          const ValueId k = s.param("k_scale", Shape{3}, {});
          return s.op(OpKind::qk_norm, {x, q, k}, QkNormAttrs{.eps = 1e-6f, .group = 2, .unit_offset = unit})[0];
        },
        o);
  }
}

TEST_P(VjpFd, Silu) {
  Options o;
  o.init = [](const std::string&, int64_t, float d) { return 1.5f * d; };
  check_vjp([](const Scope& s) { return s.op1(OpKind::silu, {s.param("x", Shape{3, 5}, {})}); }, o);
}

TEST_P(VjpFd, Gelu) {
  Options o;
  o.init = [](const std::string&, int64_t, float d) { return 1.5f * d; };
  check_vjp([](const Scope& s) { return s.op1(OpKind::gelu, {s.param("x", Shape{3, 5}, {})}); }, o);
}

TEST_P(VjpFd, GeluErf) {
  Options o;
  o.init = [](const std::string&, int64_t, float d) { return 1.5f * d; };
  check_vjp([](const Scope& s) { return s.op1(OpKind::gelu_erf, {s.param("x", Shape{3, 5}, {})}); }, o);
}

// Both cotangents of the fused SwiGLU and GeGLU gates, gate and up drawn independently.
TEST_P(VjpFd, GatedActivations) {
  for (const OpKind op : {OpKind::silu_mul, OpKind::gelu_mul}) {
    Options o;
    o.init = [](const std::string&, int64_t, float d) { return 1.5f * d; };
    check_vjp(
        [op](const Scope& s) {
          return s.op1(op, {s.param("gate", Shape{3, 5}, {}), s.param("up", Shape{3, 5}, {})});
        },
        o);
  }
}

// Gemma's embedding normaliser: a constant factor, not a power of two.
TEST_P(VjpFd, Scale) {
  check_vjp([](const Scope& s) { return s.op1(OpKind::scale, {s.param("x", Shape{3, 5}, {})}, ScaleAttrs{2.3f}); });
}

// Gemma's RMSNorm (1 + scale), scales near 0 as it starts.
TEST_P(VjpFd, RmsNormUnitOffset) {
  Options o;
  o.init = [](const std::string& path, int64_t, float d) { return path == "op/scale" ? 0.3f * d : d; };
  check_vjp(
      [](const Scope& s) {
        const ValueId x = s.param("x", Shape{3, 6}, {});
        const ValueId scale = s.param("scale", Shape{6}, {});
        return s.op(OpKind::rms_norm, {x, scale}, LayerNormAttrs{1e-6f, DType::f32, true})[0];
      },
      o);
}

TEST_P(VjpFd, Dropout) {
  Options o;
  o.rc = RunCtx{1234, 5, 2};  // fixed run coordinates: the same mask in every evaluation
  const Result r = check_vjp(
      [](const Scope& s) {
        return s.op1(OpKind::dropout, {s.param("x", Shape{4, 6}, {})}, DropoutAttrs{0.3f, 7});
      },
      o);
  // The mask actually drops something (dropped elements have exactly zero gradient both ways).
  int zeros = 0;
  if (r.skipped) return;
  for (float v : r.grad.at("op/x")) zeros += v == 0.f;
  EXPECT_GT(zeros, 0);
  EXPECT_LT(zeros, 24);
}

TEST_P(VjpFd, Reshape) {
  // The reshape reads an activation (an f32 -> f32 cast of the parameter), as in a model.
  check_vjp([](const Scope& s) {
    const ValueId x = s.op1(OpKind::cast, {s.param("x", Shape{2, 6}, {})}, DTypeAttrs{DType::f32});
    return s.op1(OpKind::reshape, {x}, ShapeAttrs{Shape{3, 4}});
  });
}

TEST_P(VjpFd, CastF32) {
  check_vjp([](const Scope& s) {
    return s.op1(OpKind::cast, {s.param("x", Shape{3, 4}, {})}, DTypeAttrs{DType::f32});
  });
}

TEST_P(VjpFd, AddSameShape) {
  check_vjp([](const Scope& s) {
    return s.op1(OpKind::add, {s.param("a", Shape{3, 4}, {}), s.param("b", Shape{3, 4}, {})});
  });
}

TEST_P(VjpFd, AddBroadcastSuffix) {
  check_vjp([](const Scope& s) {
    const ValueId t = s.op1(OpKind::add, {s.param("a", Shape{2, 3, 4}, {}), s.param("b", Shape{3, 4}, {})});
    return s.op1(OpKind::add, {t, s.param("c", Shape{4}, {})});
  });
}

TEST_P(VjpFd, AddSameValueTwice) {
  // One parameter used twice by one node: two uses, two grad_accumulates (checked inside).
  check_vjp([](const Scope& s) {
    const ValueId a = s.param("a", Shape{3, 4}, {});
    return s.op1(OpKind::add, {a, a});
  });
}

TEST_P(VjpFd, LogSoftmax) {
  check_vjp([](const Scope& s) { return s.op1(OpKind::log_softmax, {s.param("x", Shape{3, 5}, {})}); });
}

TEST_P(VjpFd, CrossEntropy) {
  Options o;
  o.head = false;
  check_vjp([](const Scope& s) { return s.param("logits", Shape{4, 5}, {}); }, o);
}

TEST_P(VjpFd, CrossEntropyRank3) {
  Options o;
  o.head = false;
  check_vjp([](const Scope& s) { return s.param("logits", Shape{2, 2, 5}, {}); }, o);
}

TEST_P(VjpFd, SmallMlpChain) {
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
        const ValueId h =
            ln.op(OpKind::layer_norm, {x, ln.param("scale", Shape{4}, {}), ln.param("bias", Shape{4}, {})},
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
TEST(VjpRules, ShapeRulesRejectWhatKernelsCannotIndex) {
  Graph g;
  const ValueId s0 = g.add_input("s0", Shape{}, DType::f32);
  const ValueId c1 = g.add_param("c1", Shape{1}, {});
  EXPECT_THROW(g.add_node(OpKind::layer_norm, {s0, c1, c1}, LayerNormAttrs{}, "t", Phase::forward),
               std::invalid_argument);
  const ValueId x = g.add_input("x", Shape{2, 4}, DType::f32);
  const ValueId scale = g.add_param("scale", Shape{4}, {});
  const ValueId stat = g.add_input("stat", Shape{2}, DType::f32);
  const ValueId bad_stat = g.add_input("bad_stat", Shape{3}, DType::f32);
  EXPECT_NO_THROW(
      g.add_node(OpKind::layer_norm_grad, {x, x, scale, stat, stat}, LayerNormAttrs{}, "t", Phase::backward));
  EXPECT_THROW(
      g.add_node(OpKind::layer_norm_grad, {x, x, scale, bad_stat, stat}, LayerNormAttrs{}, "t", Phase::backward),
      std::invalid_argument);
  EXPECT_THROW(g.add_node(OpKind::layer_norm_grad, {x, x, c1, stat, stat}, LayerNormAttrs{}, "t", Phase::backward),
               std::invalid_argument);
  const ValueId w = g.add_param("w", Shape{3, 1}, {});
  EXPECT_THROW(g.add_node(OpKind::dense_grad_input, {s0, w}, DenseGradAttrs{}, "t", Phase::backward),
               std::invalid_argument);
}

// A reshape whose input is a persistent value (a parameter or a batch input) is a view of that
// buffer: the executor must hand the kernel the root's pointer.
TEST_P(VjpFd, ReshapeOfParameter) {
  check_vjp([](const Scope& s) {
    return s.op1(OpKind::reshape, {s.param("x", Shape{2, 6}, {})}, ShapeAttrs{Shape{3, 4}});
  });
}

}  // namespace
}  // namespace loom
