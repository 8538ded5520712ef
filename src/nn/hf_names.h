// Model knowledge for Hugging Face checkpoints: which loom parameter is which tensor of a
// `transformers` model, with its name, shape and layout there. io/hf.h converts the tensors;
// this file only says what maps to what.
//
// GPT-2 (GPT2LMHeadModel) is loom's transformer with block_order = attn_first, use_bias,
// tie_embeddings and causal attention. Per layer l (loom block_l/... <- transformer.h.l.<...>):
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
};

struct HfParam {
  std::string hf_name;  // "transformer.h.0.attn.c_attn.weight"
  Shape hf_shape;       // [C, 3C]
  std::string path;     // "block_0/attn/qkv/kernel"; "" for a bias the model lacks (zero)
  Shape shape;          // [C, H, 3D]
  HfLayout layout = HfLayout::same;
};

struct HfModelMap {
  std::string architecture;  // "GPT2LMHeadModel"
  std::string model_type;    // config.json's "model_type": "gpt2"
  int64_t heads = 0, head_dim = 0;
  std::vector<HfParam> params;  // every parameter of the model, in the HF file order
};

// The map of `c`'s parameters. A model that no `transformers` architecture loom knows can hold
// (the tutorial's mlp_first blocks, an untied head with its bias, ...) is a UserError naming the
// model.* key.
HfModelMap hf_model_map(const ModelConfig& c);

}  // namespace loom::nn
