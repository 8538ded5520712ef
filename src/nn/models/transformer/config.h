// The transformer family's own slice of ModelConfig (nn/config.h: c.transformer): its model.* keys
// (nn/models/transformer/keys.cpp) and the choices they take. Every Hugging Face architecture of
// the family (nn/models/hf_arch.h) reads and writes these fields.
#pragma once
#include <cstdint>

#include "core/choice.h"
#include "core/dtype.h"

#define LOOM_BLOCK_ORDERS(X)                                 \
  X(mlp_first, "the tutorial: x + mlp(x), then x + attn(x)") \
  X(attn_first, "GPT-2: x + attn(x), then x + mlp(x)")

// The normalisation layers of a transformer (model.norm; both take model.layer_norm_eps).
#define LOOM_NORMS(X)                                                        \
  X(layernorm, "LayerNorm: centred, scale and bias (the tutorial, GPT-2)")   \
  X(rmsnorm, "RMSNorm: root mean square, scale only (Llama's LlamaRMSNorm)") \
  X(gemma_rmsnorm, "RMSNorm scaled by 1 + scale, scales starting at 0 (Gemma's RMSNorm)")

// The MLP of a transformer block (model.mlp), of width model.intermediate_size.
#define LOOM_MLPS(X)                                                                        \
  X(gelu_tanh, "Dense -> tanh-approximate GELU -> Dense (the tutorial, GPT-2's gelu_new)")  \
  X(gelu, "Dense -> exact (erf) GELU -> Dense (transformers' \"gelu\", PyTorch's default)") \
  X(swiglu, "down(silu(gate(x)) * up(x)) (transformers' LlamaMLP)")                         \
  X(geglu, "down(gelu_tanh(gate(x)) * up(x)) (transformers' GemmaMLP, gelu_pytorch_tanh)")
// Where a transformer's token positions enter (model.position).
#define LOOM_POSITIONS(X)                                                              \
  X(learned, "a learned position table added to the embeddings (the tutorial, GPT-2)") \
  X(rope, "rotary embeddings of q and k in every attention, no table (Llama; model.rope_theta)")

// RoPE's frequency scaling (model.rope_scaling; transformers' rope_parameters.rope_type).
#define LOOM_ROPE_SCALINGS(X)                                                            \
  X(none, "the default frequencies 1 / rope_theta^(2i / head_dim)")                      \
  X(llama3,                                                                              \
    "Llama 3.1's: low frequencies / rope_factor, high kept, blended between (rope_low_/" \
    "rope_high_freq_factor, rope_original_max_position)")

#define LOOM_INITS(X)                                            \
  X(flax, "the tutorial's Flax defaults (lecun_normal kernels)") \
  X(gpt2, "normal(0.02), residual projections / sqrt(2·layers)")

namespace loom {

LOOM_CHOICE(BlockOrder, "block order", LOOM_BLOCK_ORDERS)
LOOM_CHOICE(NormKind, "norm", LOOM_NORMS)
LOOM_CHOICE(MlpKind, "mlp", LOOM_MLPS)
LOOM_CHOICE(PositionKind, "position", LOOM_POSITIONS)
LOOM_CHOICE(RopeScaling, "rope scaling", LOOM_ROPE_SCALINGS)
LOOM_CHOICE(InitScheme, "init", LOOM_INITS)

}  // namespace loom

namespace loom::nn::transformer {

// The Part 1.2 tutorial's keys first, then what the Hugging Face architectures add.
struct Config {
  int64_t num_layers = 2;
  int64_t head_dim = 64;
  int64_t mlp_expansion = 4;
  int64_t vocab_size = 2048;
  int64_t num_outputs = 2048;
  int64_t max_seq_len = 512;
  DType softmax_dtype = DType::f32;
  bool causal_mask = true;
  bool scan_layers = false;  // parameter layout only: stacked [num_layers, ...] in files
  BlockOrder block_order = BlockOrder::mlp_first;
  NormKind norm = NormKind::layernorm;
  MlpKind mlp = MlpKind::gelu_tanh;
  int64_t intermediate_size = 0;  // the MLP's hidden width; 0: nn::mlp_width's default
  PositionKind position = PositionKind::learned;
  double rope_theta = 10000;  // RoPE's frequency base (transformers' rope_theta)
  // RoPE's frequency scaling and llama3's parameters (transformers' rope_parameters: factor,
  // low_freq_factor, high_freq_factor, original_max_position_embeddings); Llama 3.1's values.
  RopeScaling rope_scaling = RopeScaling::none;
  double rope_factor = 8, rope_low_freq_factor = 1, rope_high_freq_factor = 4;
  int64_t rope_original_max_position = 8192;
  int64_t num_kv_heads = 0;  // key/value heads (grouped-query attention); 0 = num_heads
  int64_t num_heads = 0;     // attention heads; 0 = hidden_size / head_dim (nn::num_heads)
  bool qk_norm = false;      // RMSNorm of each query and key head before rope (Qwen3's q_norm, k_norm)
  bool post_norms = false;   // a norm on each branch's output before its residual add (Gemma)
  bool use_bias = true;
  bool qkv_bias = false;       // biases on the q/k/v projection even without use_bias (Qwen2)
  int64_t sliding_window = 0;  // attention sees the last sliding_window keys (itself included); 0: all
  // Gemma 3's local/global layers: 0, every layer local; N, layer l global (full attention,
  // rope_theta) when (l + 1) % N == 0, the others local (sliding_window, rope_local_theta).
  // nn::layer_attention reads them.
  int64_t sliding_window_pattern = 0;
  double rope_local_theta = 0;       // RoPE base of the local layers; 0: rope_theta
  double query_pre_attn_scalar = 0;  // attention scale query_pre_attn_scalar^-0.5; 0: head_dim^-0.5
  bool scale_embeddings = false;     // token embeddings · sqrt(hidden_size) (Gemma), not the tied head
  bool tie_embeddings = false;
  // Vocabulary columns per chunk of the fused head and loss (linear_cross_entropy), which never
  // holds [tokens, V] logits; 0: the unfused dense head and the loss ops on its logits.
  int64_t head_chunk = 0;
  InitScheme init = InitScheme::flax;
  bool embed_dropout = false;
};

}  // namespace loom::nn::transformer
