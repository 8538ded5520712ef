// The model.* keys (core/config_key.h rows over ModelConfig). Each family lists its keys
// (ModelKindInfo::keys, in its folder nn/models/<family>/), sharing the rows below; model_keys()
// is model.kind and model.dtype, the families' lists merged, then model.init_from. The checks of
// the model slice live here too (validate_model), each family's own in its folder.
#pragma once
#include <vector>

#include "core/config_key.h"
#include "nn/config.h"

namespace loom {

// Rows more than one family lists.
KeySpec<ModelConfig> hidden_size_key();
KeySpec<ModelConfig> dropout_rate_key();
KeySpec<ModelConfig> layer_norm_eps_key();
std::vector<KeySpec<ModelConfig>> remat_keys();  // model.remat, remat_policy, remat_save_names

// The lora.* keys (nn/lora.cpp): the LoraConfig is part of the model slice, as it changes the model.
std::vector<KeySpec<ModelConfig>> lora_keys();
// lora.*'s checks that every family shares (a family checks the rest in its validate).
void validate_lora(const ModelConfig& c);

// Every model.* key in `loom help config` order; a family's own key applies only to it. The rows
// marked `architecture` are the keys a loom checkpoint given as model.init_from decides.
const std::vector<KeySpec<ModelConfig>>& model_keys();

// The checks of the model slice (model.* and lora.*): the shared rows', then the family's own
// (ModelKindInfo::validate). A UserError naming the key.
void validate_model(const ModelConfig& c);

}  // namespace loom
