// Model knowledge for Hugging Face checkpoints: which loom parameter is which tensor of a
// `transformers` model, with its name, shape and layout there. io/hf.h converts the tensors;
// this file only says what maps to what.
//
// GPT-2 (GPT2LMHeadModel) is loom's transformer with block_order = attn_first, norm = layernorm,
// learned positions, use_bias, tie_embeddings and causal attention. Per layer l
// (loom block_l/... <- transformer.h.l.<...>):
//   attn/pre_norm/{scale,bias}      ln_1.{weight,bias}                    [C]
//   attn/qkv/kernel [C, H, 3D]      attn.c_attn.weight [C, 3C]            columns (3, H, D) -> (H, 3, D)
//   attn/qkv/bias [H, 3D]           attn.c_attn.bias [3C]                 the same permutation
//   attn/output_layer/kernel [H, D, C]  attn.c_proj.weight [C, C]         Conv1D stores [in, out]: as is
//   attn/output_layer/bias          attn.c_proj.bias
//   mlp/pre_norm/{scale,bias}       ln_2.{weight,bias}
//   mlp/input_layer/{kernel,bias}   mlp.c_fc.{weight [C, 4C], bias}
//   mlp/output_layer/{kernel,bias}  mlp.c_proj.{weight [4C, C], bias}
// and embed/embedding <- transformer.wte.weight, pos_emb <- transformer.wpe.weight [n_positions, C],
// post_norm/{scale,bias} <- transformer.ln_f.{weight,bias}; the tied head has no tensor of its
// own (lm_head.weight is wte's). A model without biases (use_bias = false, nanoGPT's bias=False:
// the default main job) is GPT-2 with every bias zero: its bias entries have no loom path.
//
// Llama (LlamaForCausalLM) is loom's transformer with block_order = attn_first, norm = rmsnorm,
// mlp = swiglu, position = rope, no biases and causal attention; KV = num_kv_heads key/value
// heads, G = H / KV query heads per key/value head, F = the MLP width. nn.Linear stores
// [out, in], loom's kernels [in, out]: every matrix is transposed. Per layer l
// (loom block_l/... <- model.layers.l.<...>):
//   attn/pre_norm/scale [C]             input_layernorm.weight
//   attn/qkv/kernel [C, KV, (G+2)·D]    self_attn.q_proj.weight [H·D, C]   slots 0..G-1 of each kv head
//                                       self_attn.k_proj.weight [KV·D, C]  slot G
//                                       self_attn.v_proj.weight [KV·D, C]  slot G+1
//   attn/output_layer/kernel [H, D, C]  self_attn.o_proj.weight [C, H·D]
//   mlp/pre_norm/scale                  post_attention_layernorm.weight
//   mlp/gate_layer/kernel [C, F]        mlp.gate_proj.weight [F, C]
//   mlp/up_layer/kernel [C, F]          mlp.up_proj.weight [F, C]
//   mlp/output_layer/kernel [F, C]      mlp.down_proj.weight [C, F]
// and embed/embedding <- model.embed_tokens.weight, post_norm/scale <- model.norm.weight, an
// untied head's output_layer/kernel [C, V] <- lm_head.weight [V, C]. Query head h = j·G + g uses
// key/value head j (transformers' repeat_kv); rotary embeddings use the same rotate_half layout
// (graph/ops.def, rope), so q and k rows are copied without a permutation.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/shape.h"
#include "nn/config.h"

namespace loom::nn {

enum class HfLayout {
  same,         // the same row-major values
  qkv_columns,  // GPT-2's c_attn: the last axis is (3, H, D) in the file, (H, 3, D) in loom
  transposed,   // nn.Linear's weight: [a, b] in the file is loom's [b, a] (loom's shape flattened to 2-D)
  qkv_rows,     // Llama's q/k/v_proj [KV·slots·D, C]: transposed into slots [slot, slot + slots) of
                // each key/value head of loom's [C, KV, (G+2)·D]; three tensors share one parameter
};

struct HfParam {
  std::string hf_name;  // "transformer.h.0.attn.c_attn.weight"
  Shape hf_shape;       // [C, 3C]
  std::string path;     // "block_0/attn/qkv/kernel"; "" for a bias the model lacks (zero)
  Shape shape;          // [C, H, 3D]
  HfLayout layout = HfLayout::same;
  int64_t slot = 0, slots = 0;  // qkv_rows: the part of each key/value head's (G+2)·D columns
};

struct HfModelMap {
  std::string architecture;  // "GPT2LMHeadModel"
  std::string model_type;    // config.json's "model_type": "gpt2"
  std::string prefix;        // of the base model's tensors ("transformer.", "model."), which files
                             // written from the base model class (GPT2Model) lack
  int64_t heads = 0, head_dim = 0, kv_heads = 0;
  std::vector<HfParam> params;  // every parameter of the model, in the HF file order
};

// The map of `c`'s parameters: GPT-2's for model.norm = layernorm, Llama's for rmsnorm. A model
// that no `transformers` architecture loom knows can hold (the tutorial's mlp_first blocks, an
// untied head with its bias, RMSNorm with a GELU MLP, ...) is a UserError naming the model.* key.
HfModelMap hf_model_map(const ModelConfig& c);

}  // namespace loom::nn
