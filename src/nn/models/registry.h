// The registry of model families: one entry per family (nn/models/<family>/), one line per Hugging
// Face architecture a family reads and writes. Nothing else lists them; nn/config.h, nn/models.h and
// nn/models/hf_arch.h build their members and tables from these entries.
#pragma once

// The model kinds (model.kind): id and help. A kind `k` is the folder nn/models/k/ defining
//   struct nn::k::Config;             // k/config.h: its own fields, the member ModelConfig::k
//   const ModelKindInfo& k_family();  // nn/models.h: builder, checks, decoder, its model.* keys
// Its entry is its X line and the include of its config.h above the lines (the preprocessor cannot
// generate an include from an X line; a kind without it fails to compile at ModelConfig::k).
#include "nn/models/mlp_classifier/config.h"
#include "nn/models/transformer/config.h"

#define LOOM_MODEL_KINDS(X)                                                                 \
  X(mlp_classifier, "the Part 1.1 tutorial's MLP classifier on random_classification data") \
  X(transformer, "the Part 1.2 tutorial's Transformer language model (and GPT-2's variant)")

// The Hugging Face architectures, in the order they claim a loom model on export. An architecture
// `a` is the folder nn/models/a/ defining
//   const HfArchitecture& a_architecture();  // nn/models/hf_arch.h
#define LOOM_HF_ARCHITECTURES(X) \
  X(gpt2)                        \
  X(qwen2)                       \
  X(mistral)                     \
  X(qwen3)                       \
  X(gemma3)                      \
  X(llama)
