// The model's slice of the run configuration (its `model.*` keys: nn/config_keys.h; train/config.h
// assembles the slices and concatenates the rooms' key tables). nn/ builds a model from it alone (nn/models.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/choice.h"
#include "core/dtype.h"
#include "graph/passes/remat.h"
#include "nn/lora.h"
#include "nn/models/registry.h"

// The remat regions (model.remat): a Transformer's `MLP` is block_l/mlp, `Attn` block_l/attn,
// `Block` block_l; the MLP classifier's `MLP` is its hidden block. `auto` (alone) lets
// train/fit.h choose regions and policy per layer, and the minibatch count, to fit
// train.memory_budget; the builders then read ModelConfig::remat_layers.
#define LOOM_REMAT_REGIONS(X)                                 \
  X(MLP, "the MLP block of each layer (pre_norm .. dropout)") \
  X(Attn, "the attention block of each layer")                \
  X(Block, "each whole Transformer block")                    \
  X(auto_, "chosen per layer to fit train.memory_budget with the least recompute (alone)")

namespace loom {

LOOM_CHOICE(ModelKind, "model kind", LOOM_MODEL_KINDS)
LOOM_CHOICE(RematRegion, "remat region", LOOM_REMAT_REGIONS)

// One layer's remat: the regions it recomputes and their policy.
struct LayerRemat {
  ChoiceSet<RematRegion> regions;
  RematPolicyKind policy = RematPolicyKind::nothing_saveable;
  bool operator==(const LayerRemat&) const = default;
};

struct ModelConfig {
  ModelKind kind = ModelKind::mlp_classifier;
  DType dtype = DType::f32;  // compute dtype of activations
  int64_t hidden_size = 256;
  double dropout_rate = 0.0;
  double layer_norm_eps = 1e-6;  // Flax's LayerNorm default
  ChoiceSet<RematRegion> remat;  // empty: no remat
  RematPolicyKind remat_policy = RematPolicyKind::nothing_saveable;
  std::string remat_save_names;  // save_only_these_names: comma-separated scope patterns
  // Not a key: model.remat = auto's choice per layer (train/fit.h); empty: remat and remat_policy
  // apply to every layer.
  std::vector<LayerRemat> remat_layers;
  // Where the parameters start from (train/model_source.h): "" = drawn by `init`; otherwise a
  // Hugging Face model directory or a loom run or checkpoint directory, whose architecture keys
  // this configuration takes.
  std::string init_from;
  LoraConfig lora;  // the lora.* keys: adapters on the dense layers, the rest frozen (nn/lora.h)
  // Each family's own keys: a member per kind of LOOM_MODEL_KINDS named after it (c.transformer),
  // its struct nn::<kind>::Config (nn/models/<kind>/config.h). A family reads its struct and the
  // fields above, which every family shares; the other families' structs keep their defaults.
#define LOOM_MODEL_KIND_MEMBER(id, help) nn::id::Config id;
  LOOM_MODEL_KINDS(LOOM_MODEL_KIND_MEMBER)
#undef LOOM_MODEL_KIND_MEMBER
};

// A model.* key that a starting point (model.init_from) decides, and where its value comes from.
struct ArchKey {
  std::string key;     // "model.hidden_size"
  std::string origin;  // "n_embd = 768 in gpt2/config.json", for messages
  // An architecture key, which a loom config may not contradict; false: a default of the source
  // (model.embed_dropout for GPT-2) that a loom config may change.
  bool fixed = true;
};

// What a model reads from outside `model.*`: the shape of one minibatch (train/config.h:
// model_input(config, minibatch) fills it from data.*).
struct ModelInput {
  int64_t batch = 1;       // examples (sequences) per minibatch
  int64_t num_inputs = 0;  // features per example: a classifier's input width (data.num_inputs)
  int64_t seq_len = 0;     // tokens per sequence: a language model's (data.seq_len)
  // Rows of whole examples (chat data, packed or padded): a [batch, seq_len] input "positions"
  // gives each token's position in its example, which restart the position embeddings and keep
  // attention within an example. false: one sequence per row, positions 0..seq_len-1.
  bool packed = false;
};

}  // namespace loom
