// The MLP classifier's own slice of ModelConfig (nn/config.h): its model.* keys beyond the shared
// ones (nn/models/mlp_classifier/keys.cpp).
#pragma once
#include <cstdint>

namespace loom {

struct MlpClassifierConfig {
  int64_t num_classes = 100;  // output classes
};

}  // namespace loom
