// Op kinds, their typed attributes, and the static op table generated from ops.def.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <variant>

#include "core/dtype.h"
#include "core/shape.h"

namespace loom {

// The flags column of ops.def (its header says what each means to the planner, autodiff and remat).
enum OpFlags : uint32_t {
  kOpNone = 0,
  kOpWritesInput0 = 1u << 0,
  kOpView = 1u << 1,
  kOpInplace = 1u << 2,
  kOpWritesCache = 1u << 3,  // also writes inputs 1 and 2 in place (persistent inputs: a KV cache)
  kOpWritesGrad = 1u << 4,   // with kOpWritesInput0: input 0 is a parameter's persistent gradient
  kOpDot = 1u << 5,          // a matrix product, JAX's dot_general (remat: dots_saveable)
  // With kOpDot: the product has no batch dimensions (remat: dots_with_no_batch_dims_saveable).
  // A second flag rather than an attribute of the node, because whether the contraction has batch
  // dims is fixed by the op kind (dense never, attention always): it belongs in the table, and
  // each policy stays one flag test. op.cpp checks that it never appears without kOpDot.
  kOpDotNoBatchDims = 1u << 6,
};

// Typed attributes, validated by each op's shape rule when the node is built.
struct NoAttrs {
  bool operator==(const NoAttrs&) const = default;
};
struct DenseAttrs {
  DType compute = DType::f32;  // dtype inputs and kernel are cast to; accumulation is fp32
  bool transpose_w = false;    // the kernel is stored [N, K] (tied embeddings: logits = x · Eᵀ)
  // N is a small rank (a LoRA adapter's x·A): the VJP leaves x's cotangent dy·Wᵀ to autodiff as a
  // low-rank term, which adds it into x's other cotangents (add_low_rank) instead of forming it.
  bool low_rank = false;
  bool operator==(const DenseAttrs&) const = default;
};
struct DenseGradAttrs {
  DType compute = DType::f32;
  DType out_dtype = DType::f32;  // dtype of dx (the dtype of the forward input x)
  bool transpose_w = false;      // as DenseAttrs::transpose_w
  bool operator==(const DenseGradAttrs&) const = default;
};
// dense_grad_weight accumulates straight into the kernel's persistent gradient; like
// grad_accumulate it assigns instead in minibatch 0 when it is the buffer's first writer.
struct DenseGradWeightAttrs {
  DType compute = DType::f32;
  bool transpose_w = false;                // as DenseAttrs::transpose_w: the gradient is [N, K]
  bool assign_in_first_minibatch = false;  // set by mark_first_grad_writes
  // Set by mark_first_grad_writes with assign_in_first_minibatch when a step runs one minibatch per
  // process: the kernel assigns on every run, so its workspace need not serve accumulation too (the
  // CPU kernel's tile buffers: a quarter of a tied head's gradient per thread).
  bool assigns_always = false;
  bool operator==(const DenseGradWeightAttrs&) const = default;
};
struct DTypeAttrs {
  DType dtype = DType::f32;
  bool operator==(const DTypeAttrs&) const = default;
};
struct ReduceAttrs {
  int32_t keep_dims = 1;
  DType dtype = DType::f32;
  bool operator==(const ReduceAttrs&) const = default;
};
struct ShapeAttrs {
  Shape shape;
  bool operator==(const ShapeAttrs&) const = default;
};
struct LayerNormAttrs {
  float eps = 1e-6f;         // Flax's default epsilon
  DType dtype = DType::f32;  // output dtype; statistics are always fp32
  bool unit_offset = false;  // rms_norm: the scale used is 1 + scale (Gemma's RMSNorm)
  bool operator==(const LayerNormAttrs&) const = default;
};
// add_low_rank / take_columns: columns [offset, offset + width) of the last dim, times scale;
// add_low_rank's product in `compute`, its V stored [N, r] when transpose_v.
struct ColumnsAttrs {
  int64_t offset = 0;
  int64_t width = 0;
  float scale = 1.f;
  DType compute = DType::f32;
  bool transpose_v = false;
  bool operator==(const ColumnsAttrs&) const = default;
};
struct DropoutAttrs {
  float rate = 0.f;
  uint32_t stream = 0;  // RNG stream: the forward node's id, shared by its VJP and recompute
  bool operator==(const DropoutAttrs&) const = default;
};

// grad_accumulate: the first writer of a gradient buffer in the schedule (mark_first_grad_writes
// in graph/passes/autodiff.h) stores ct in minibatch 0 instead of adding it, so a step does not have to
// zero that buffer first (one pass over every gradient saved, two on the first minibatch).
struct GradAccumulateAttrs {
  bool assign_in_first_minibatch = false;
  bool operator==(const GradAccumulateAttrs&) const = default;
};

struct AttentionAttrs {
  bool causal = false;               // mask key j > query i (nn.make_causal_mask)
  DType softmax_dtype = DType::f32;  // dtype of the logits and the softmax (the tutorial's softmax_dtype)
  // Query heads per key/value head (grouped-query attention): qkv is [B, T, KV, (group+2)·D], per
  // key/value head its group's queries, then its key, then its value; 1 is multi-head attention's
  // [B, T, H, 3D]. Query head h = j·group + i uses key/value head j, as transformers' repeat_kv.
  int32_t group = 1;
  // Sliding window (needs causal): query i sees keys i − window < j <= i, itself and the
  // window − 1 before it (transformers' sliding_window, Mistral); 0: every key up to i.
  int32_t window = 0;
  // The logits' scale before rounding to qkv's dtype; 0: head_dim^-0.5 (Gemma 3 gives
  // query_pre_attn_scalar^-0.5). attention_scale reads it.
  float scale = 0.f;
  bool operator==(const AttentionAttrs&) const = default;
  // Whether query row i sees key row j.
  bool sees(int64_t i, int64_t j) const { return !(causal && j > i) && !(window > 0 && i - j >= window); }
};

// The scale of the attention logits of heads of width head_dim, in double (the kernels round it
// to qkv's dtype, as JAX and torch cast a Python scalar).
inline double attention_scale(const AttentionAttrs& a, int64_t head_dim) {
  return a.scale > 0.f ? static_cast<double>(a.scale) : std::pow(static_cast<double>(head_dim), -0.5);
}

// rope: rotary position embeddings on the q and k parts of a packed qkv (ops.def).
struct RopeAttrs {
  float theta = 10000.f;  // the base of the frequencies (transformers' rope_theta)
  int32_t group = 1;      // query heads per key/value head: qkv's last dim is (group + 2)·head_dim
  bool inverse = false;   // rotate by −angle (the VJP: the rotation's transpose is its inverse)
  // Llama 3.1's frequency scaling (transformers' rope_type "llama3"); llama3_factor 0: none, the
  // default frequencies. Low frequencies are divided by the factor, high ones kept, the band
  // between blended (rope_inv_freq).
  float llama3_factor = 0.f;
  float low_freq_factor = 1.f, high_freq_factor = 4.f;
  int32_t original_max_position = 8192;  // the context length the model was pretrained at
  bool operator==(const RopeAttrs&) const = default;
};
// scale: x times a constant (Gemma's embedding normaliser sqrt(hidden_size)).
struct ScaleAttrs {
  float factor = 1.f;
  bool operator==(const ScaleAttrs&) const = default;
};
// qk_norm: RMSNorm of each query and key head of a packed qkv (Qwen3's q_norm and k_norm).
struct QkNormAttrs {
  float eps = 1e-6f;         // transformers' rms_norm_eps
  int32_t group = 1;         // query heads per key/value head: qkv's last dim is (group + 2)·head_dim
  bool unit_offset = false;  // the scales used are 1 + q_scale, 1 + k_scale (Gemma 3's q/k norms)
  bool operator==(const QkNormAttrs&) const = default;
};

// linear_cross_entropy and its backward (ops.def): the head's dense attributes, the vocabulary
// columns formed per chunk, and (the backward) whether it assigns the kernel's gradient.
struct LinearCrossEntropyAttrs {
  DType compute = DType::f32;
  bool transpose_w = false;                // the kernel is stored [V, C] (the tied embedding table)
  int64_t chunk = 0;                       // vocabulary columns per chunk of logits, > 0
  bool assign_in_first_minibatch = false;  // set by mark_first_grad_writes (the backward)
  bool operator==(const LinearCrossEntropyAttrs&) const = default;
};

// RoPE's inverse frequency i < head_dim / 2: 1 / theta^(2i / head_dim), then with llama3 scaling
// transformers' _compute_llama3_parameters: wavelen = 2π / f; wavelen > old / low_freq_factor:
// f / factor; wavelen < old / high_freq_factor: f; otherwise, with s = (old / wavelen − low) /
// (high − low), (1 − s)·f / factor + s·f. Every step in float32, as transformers' torch code
// computes it (its Python scalars meet float32 tensors), so both backends share one table.
inline float rope_inv_freq(const RopeAttrs& a, int64_t head_dim, int64_t i) {
  const float f = 1.f / std::pow(a.theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  if (a.llama3_factor == 0.f) return f;
  const auto old = static_cast<double>(a.original_max_position);
  const auto low_wavelen = static_cast<float>(old / a.low_freq_factor);
  const auto high_wavelen = static_cast<float>(old / a.high_freq_factor);
  const float wavelen = static_cast<float>(2 * M_PI) / f;
  if (wavelen > low_wavelen) return f / a.llama3_factor;
  if (wavelen < high_wavelen) return f;
  const float s = (static_cast<float>(old) / wavelen - a.low_freq_factor) /
                  static_cast<float>(double{a.high_freq_factor} - double{a.low_freq_factor});
  return (1.f - s) * f / a.llama3_factor + s * f;
}

// cos and sin of RoPE's angle pos·rope_inv_freq(a, head_dim, i). The angle is computed in float32
// as transformers' LlamaRotaryEmbedding does (its inv_freq and position product are float32); cos
// and sin are taken in double and rounded to float32, so both backends share one table.
struct RopeCosSin {
  float cos, sin;
};
inline RopeCosSin rope_cos_sin(const RopeAttrs& a, int64_t head_dim, int64_t i, int32_t pos) {
  const double angle = static_cast<float>(pos) * rope_inv_freq(a, head_dim, i);
  return {static_cast<float>(std::cos(angle)), static_cast<float>(std::sin(angle))};
}

using Attrs = std::variant<NoAttrs, DenseAttrs, DenseGradAttrs, DenseGradWeightAttrs, DTypeAttrs, ReduceAttrs,
                           ShapeAttrs, LayerNormAttrs, DropoutAttrs, AttentionAttrs, GradAccumulateAttrs, RopeAttrs,
                           ColumnsAttrs, QkNormAttrs, LinearCrossEntropyAttrs, ScaleAttrs>;

enum class OpKind : uint16_t {
#define LOOM_OP(name, min_in, max_in, n_out, attr, flags, grad) name,
#include "graph/ops.def"
#undef LOOM_OP
};

inline constexpr int kNumOps = 0
#define LOOM_OP(name, min_in, max_in, n_out, attr, flags, grad) +1
#include "graph/ops.def"
#undef LOOM_OP
    ;

// Whether op k has a VJP rule (ops.def's grad column is `vjp`), in constant expressions: the
// tests' static_assert that every differentiable op has a finite-difference case reads it.
constexpr bool op_has_vjp(OpKind k) {
#define LOOM_HAS_VJP_vjp true
#define LOOM_HAS_VJP_none false
  constexpr bool kHasVjp[] = {
#define LOOM_OP(name, min_in, max_in, n_out, attr, flags, grad, ...) LOOM_HAS_VJP_##grad,
#include "graph/ops.def"
#undef LOOM_OP
  };
#undef LOOM_HAS_VJP_vjp
#undef LOOM_HAS_VJP_none
  return kHasVjp[static_cast<size_t>(k)];
}

class Graph;
struct Node;
struct VjpCtx;
struct ValueDesc;

// What one execution of a node costs, from its shapes alone (the profiler's achieved GFLOP/s and
// GB/s). flops: floating-point operations, a multiply-add counting 2 (matmuls 2·M·K·N); bytes:
// every input read plus every output written at their dtypes, the traffic of a kernel that
// streams each operand once (gathers and scatters count the rows they touch, views nothing).
struct OpCost {
  int64_t flops = 0;
  int64_t bytes = 0;
};

struct OpInfo {
  const char* name;
  int min_inputs, max_inputs, num_outputs;
  uint32_t flags;
  size_t attr_index;  // index of the attribute struct in Attrs
  // Checks attributes, input shapes and dtypes; returns output descriptions or throws
  // std::invalid_argument naming the op, the scope and the offending shapes.
  void (*infer)(const Graph&, const Node&, ValueDesc* outs);
  // Emits the backward nodes (nullptr where the table says `none`).
  void (*vjp)(VjpCtx&);
  // FLOPs and bytes moved by one execution (cost_<op>, beside the shape rule).
  OpCost (*cost)(const Graph&, const Node&);
};

const OpInfo& op_info(OpKind);
inline const char* op_name(OpKind k) { return op_info(k).name; }
// The cost of one execution of node `n` of `g` (op_info(n.op).cost).
OpCost node_cost(const Graph& g, const Node& n);

template <class T>
constexpr size_t attr_index_of() {
  return Attrs(T{}).index();
}

}  // namespace loom
