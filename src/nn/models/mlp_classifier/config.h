// The MLP classifier's own slice of ModelConfig (nn/config.h: c.mlp_classifier): its model.* keys
// beyond the shared ones (nn/models/mlp_classifier/keys.cpp).
#pragma once
#include <cstdint>

namespace loom::nn::mlp_classifier {

struct Config {
  int64_t num_classes = 100;  // output classes
};

}  // namespace loom::nn::mlp_classifier
