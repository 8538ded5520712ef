// The registry of model families: one line per family (nn/models/<family>/), one per Hugging Face
// architecture a family reads and writes. Nothing else lists them; nn/models.h and
// nn/models/hf_arch.h build their tables from these lines.
#pragma once

// The model kinds (model.kind): id and help. A kind `k` is the folder nn/models/k/ defining
//   const ModelFamily& k_family();  // nn/models.h: builder, checks, decoder, its model.* keys
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
