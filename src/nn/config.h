// The model's slice of the run configuration (`model.*` keys; train/config.h assembles the slices
// and declares their schema). nn/ builds a model from it alone.
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace loom {

struct ModelConfig {
  std::string kind = "mlp_classifier";  // mlp_classifier | transformer
  DType dtype = DType::f32;             // compute dtype of activations
  int64_t hidden_size = 256;
  int64_t num_classes = 100;  // mlp_classifier
  double dropout_rate = 0.0;
  double layer_norm_eps = 1e-6;  // Flax's LayerNorm default
  // transformer (the Part 1.2 tutorial's keys)
  int64_t num_layers = 2;
  int64_t head_dim = 64;
  int64_t mlp_expansion = 4;
  int64_t vocab_size = 2048;
  int64_t num_outputs = 2048;
  int64_t max_seq_len = 512;
  DType softmax_dtype = DType::f32;
  bool causal_mask = true;
  std::string remat;  // "", "none", or comma-separated MLP, Attn, Block
  std::string remat_policy = "nothing_saveable";
  std::string remat_save_names;           // save_only_these_names: comma-separated scope patterns
  bool scan_layers = false;               // parameter layout only: stacked [num_layers, ...] in files
  std::string block_order = "mlp_first";  // mlp_first (the tutorial) | attn_first (GPT-2)
  bool use_bias = true;
  bool tie_embeddings = false;
  std::string init = "flax";  // flax (the tutorial) | gpt2
  bool embed_dropout = false;
};

}  // namespace loom
