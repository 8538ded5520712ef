// The model kinds as one table: a row per entry of LOOM_MODEL_KINDS (nn/config.h) with its
// builder, its validation and what the rest of loom needs to know about it. Nothing outside nn/
// tests a kind by name; it reads the row (model_kind(c.kind).language_model, ...).
//
// Adding a model kind `k`: a line in LOOM_MODEL_KINDS, and nn/k.{h,cpp} with
//   ModelGraph build_k(const ModelConfig& c, const ModelInput& in, bool train);
//   void validate_k(const ModelConfig& c);  // UserError naming the model.* key
// included by nn/models.cpp (docs/ARCHITECTURE.md, "Adding a model kind").
#pragma once
#include <cstdint>
#include <string_view>

#include "nn/config.h"
#include "nn/model.h"

namespace loom::nn {

struct ModelKindInfo {
  std::string_view name;
  // Trains on token data (data.kind random_tokens or tokens) with a loss per token, reads
  // data.seq_len <= model.max_seq_len tokens per sequence, and reports tokens/s; otherwise it
  // classifies random_classification examples.
  bool language_model;
  ModelGraph (*build)(const ModelConfig& c, const ModelInput& in, bool train);
  void (*validate)(const ModelConfig& c);
  // The one-token program with KV caches that `loom sample` runs (nn/transformer.h,
  // build_transformer_decoder); nullptr when the kind cannot generate text.
  ModelGraph (*build_decoder)(const ModelConfig& c, int64_t batch, int64_t max_len);
  // Its batched prefill over the same caches (build_transformer_prefill); nullptr with no decoder.
  ModelGraph (*build_prefill)(const ModelConfig& c, int64_t batch, int64_t len, int64_t max_len);
};

const ModelKindInfo& model_kind(ModelKind k);

// The model of `c` for one minibatch (train: dropout on).
ModelGraph build_model(const ModelConfig& c, const ModelInput& in, bool train);

}  // namespace loom::nn
