// The MLP classifier's model.* keys (nn/config_keys.h), in `loom help config` order.
#include "nn/config_keys.h"
#include "nn/models/mlp_classifier/mlp_classifier.h"

namespace loom::nn {

using namespace keys;

#define REF(member) LOOM_KEY_REF(ModelConfig, mlp_classifier.member)

std::vector<KeySpec<ModelConfig>> mlp_classifier_keys() {
  std::vector<KeySpec<ModelConfig>> k = {
      hidden_size_key(),
      architecture(integer<ModelConfig>("model.num_classes", "output classes of the classifier", REF(num_classes))),
      dropout_rate_key(),
      layer_norm_eps_key(),
  };
  for (KeySpec<ModelConfig>& r : remat_keys()) k.push_back(std::move(r));
  return k;
}

#undef REF

}  // namespace loom::nn
