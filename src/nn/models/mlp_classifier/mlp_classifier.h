// The MLP classifier of the Part 1.1 tutorial (seed 004):
//   Dense(hidden) -> LayerNorm -> SiLU -> Dropout -> Dense(classes) -> cast f32 -> log_softmax
// with params in float32 and the compute dtype from the config. With remat (model.remat = MLP),
// the hidden block (Dense_0 through Dropout, the tutorial's remat example on an activation) is
// recomputed.
#pragma once
#include <cstdint>

#include <vector>

#include "core/config_key.h"
#include "nn/config.h"
#include "nn/model.h"

namespace loom::nn {

// The model of `c` (model.kind = mlp_classifier) for `in.batch` examples of `in.num_inputs` features.
ModelGraph build_mlp_classifier(const ModelConfig& c, const ModelInput& in, bool train);
// Its model.* keys (one remat region, MLP; at least one class): UserError naming the key.
void validate_mlp_classifier(const ModelConfig& c);

// Its model.* keys (models/mlp_classifier/keys.cpp; ModelKindInfo::keys).
std::vector<KeySpec<ModelConfig>> mlp_classifier_keys();

}  // namespace loom::nn
