// The MLP classifier of the Part 1.1 tutorial (seed 004):
//   Dense(hidden) -> LayerNorm -> SiLU -> Dropout -> Dense(classes) -> cast f32 -> log_softmax
// with params in float32 and the compute dtype from the config. With remat, the hidden block
// (Dense_0 through Dropout, the tutorial's remat example on an activation) is recomputed.
#pragma once
#include <cstdint>

#include "nn/model.h"

namespace loom::nn {

struct MlpClassifierSpec {
  DType dtype = DType::f32;
  int64_t num_inputs = 128;
  int64_t hidden_size = 256;
  int64_t num_classes = 100;
  float dropout_rate = 0.f;
  float layer_norm_eps = 1e-6f;
  bool remat = false;  // model.remat = MLP: the hidden block (Dense_0 .. Dropout) is a remat region
};

ModelGraph build_mlp_classifier(const MlpClassifierSpec& spec, int64_t batch, bool train);

}  // namespace loom::nn
