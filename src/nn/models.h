// The model kinds as one table: a row per line of LOOM_MODEL_KINDS (nn/models/registry.h), each
// defined in its family's folder (nn/models/<kind>/) with its builder, its validation and what the
// rest of loom needs to know about it. Nothing outside nn/ tests a kind by name; it reads the row
// (model_kind(c.kind).language_model, ...).
//
// Adding a model kind `k`: its entry in nn/models/registry.h, and nn/models/k/ defining
//   const ModelKindInfo& k_family();  // its row (name: filled from the registry line)
// and its fields, nn::k::Config in k/config.h (ModelConfig::k).
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/config_key.h"
#include "nn/config.h"
#include "nn/model.h"

namespace loom::nn {

struct ModelKindInfo {
  std::string_view name;  // the registry line's (model_kind fills it; a family leaves it empty)
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
  // Its model.* keys in `loom help config` order, the shared rows (nn/config_keys.h) included: a
  // key applies to a configuration whose family lists it.
  std::vector<KeySpec<ModelConfig>> (*keys)();
};

const ModelKindInfo& model_kind(ModelKind k);

// The model of `c` for one minibatch (train: dropout on).
ModelGraph build_model(const ModelConfig& c, const ModelInput& in, bool train);

}  // namespace loom::nn
