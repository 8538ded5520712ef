// The data's slice of the run configuration and its `data.*` keys (data_keys; train/config.h
// assembles the slices and concatenates the rooms' key tables), and the few facts a data source needs from the rest of the run.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/choice.h"
#include "core/config_key.h"

// The data sources (data.kind). The random ones are the tutorials' fixed batches, drawn once from
// the seed and reused every step.
#define LOOM_DATA_KINDS(X)                                                             \
  X(random_classification, "fixed random features and labels (the Part 1.1 tutorial)") \
  X(random_tokens, "fixed random token sequences (the Part 1.2 tutorial)")             \
  X(tokens, "token files written by `loom prepare` in data.dir")

// Which tokens of chat data are training targets (data.loss_on; data/chat_data.h).
#define LOOM_LOSS_ON(X)                                                                                  \
  X(auto_, "what `loom prepare chat --loss-on` recorded in meta.json (the format's targets by default)") \
  X(all, "every token of every example (padding is never a target)")                                     \
  X(assistant, "the assistant turns (conversational data)")                                              \
  X(completion, "the completion (prompt-completion data)")

namespace loom {

LOOM_CHOICE(DataKind, "data kind", LOOM_DATA_KINDS)
LOOM_CHOICE(LossOn, "loss target", LOOM_LOSS_ON)

// Whether `k` yields token sequences (what a language model trains on).
constexpr bool is_token_data(DataKind k) { return k != DataKind::random_classification; }

struct DataConfig {
  DataKind kind = DataKind::random_classification;
  std::string dir;  // tokens: a directory written by `loom prepare`
  int64_t batch_size = 512;
  int64_t num_inputs = 128;        // random_classification
  int64_t seq_len = 512;           // random_tokens
  int64_t vocab_size = 2048;       // random_tokens: tokens in [1, vocab_size)
  bool packing = false;            // chat data: several examples per row (data/packing.h), else one, padded
  LossOn loss_on = LossOn::auto_;  // tokens: which tokens are targets (chat data; plain data: every token)
};

// What a data source needs from outside `data.*` (train/config.h: data_context(config)).
struct DataContext {
  uint64_t seed = 0;              // batch k is a pure function of (seed, k)
  int64_t num_classes = 100;      // random_classification: labels in [0, num_classes)
  int64_t model_vocab_size = 0;   // tokens: the data's vocabulary must fit the embedding (0 = unchecked)
  int64_t model_num_outputs = 0;  // tokens: ... and the output layer's logits (0 = unchecked)
  std::string model_init_from{};  // tokens: model.init_from, a pretrained vocabulary no key enlarges ("" = none)
  int64_t num_minibatches = 1;    // validation batches are one minibatch (batch_size / num_minibatches)
};

// The data.* keys (core/config_key.h rows), in `loom help config` order.
const std::vector<KeySpec<DataConfig>>& data_keys();
// The checks of data.* alone: a UserError naming the key.
void validate_data(const DataConfig& c);

}  // namespace loom
