#include "nn/config_keys.h"

#include <algorithm>

#include "nn/models.h"

namespace loom {

using namespace keys;

#define REF(member) LOOM_KEY_REF(ModelConfig, member)

KeySpec<ModelConfig> hidden_size_key() {
  return architecture(integer<ModelConfig>("model.hidden_size", "hidden width", REF(hidden_size)));
}
KeySpec<ModelConfig> dropout_rate_key() {
  return number<ModelConfig>("model.dropout_rate", "dropout rate in [0, 1)", REF(dropout_rate));
}
KeySpec<ModelConfig> layer_norm_eps_key() {
  return architecture(
      number<ModelConfig>("model.layer_norm_eps", "LayerNorm epsilon (Flax default 1e-6)", REF(layer_norm_eps)));
}
std::vector<KeySpec<ModelConfig>> remat_keys() {
  return {
      choice_set<ModelConfig>("model.remat", "remat regions: recomputed in the backward instead of kept", REF(remat)),
      choice<ModelConfig>("model.remat_policy", "what a remat region saves", REF(remat_policy)),
      string<ModelConfig>("model.remat_save_names",
                          "save_only_these_names: comma-separated scope patterns, e.g. */attn/qkv",
                          REF(remat_save_names)),
  };
}

namespace {

// The families' key lists merged into one, each list's order kept: a row new to the merge goes
// right after the row its family lists before it (so the classifier's num_classes follows
// hidden_size, and the transformer's block keys sit between layer_norm_eps and the remat keys
// it lists after them). A row applies when the configured family lists it.
std::vector<KeySpec<ModelConfig>> merged_family_keys() {
  constexpr size_t kinds = choices_of(ModelKind{}).size();
  std::vector<KeySpec<ModelConfig>> out;
  std::vector<std::vector<bool>> listed;  // listed[row][kind]
  for (size_t k = 0; k < kinds; ++k) {
    size_t at = 0;  // where the family's next new row goes
    for (KeySpec<ModelConfig>& row : nn::model_kind(static_cast<ModelKind>(k)).keys()) {
      auto it = std::find_if(out.begin(), out.end(),
                             [&](const KeySpec<ModelConfig>& r) { return std::string_view(r.key) == row.key; });
      if (it == out.end()) {
        listed.insert(listed.begin() + static_cast<std::ptrdiff_t>(at), std::vector<bool>(kinds, false));
        it = out.insert(out.begin() + static_cast<std::ptrdiff_t>(at), std::move(row));
      }
      const auto i = static_cast<size_t>(it - out.begin());
      listed[i][k] = true;
      at = i + 1;
    }
  }
  for (size_t i = 0; i < out.size(); ++i)
    if (std::find(listed[i].begin(), listed[i].end(), false) != listed[i].end())
      out[i].applies = [by = listed[i]](const ModelConfig& c) { return bool(by[static_cast<size_t>(c.kind)]); };
  return out;
}

}  // namespace

const std::vector<KeySpec<ModelConfig>>& model_keys() {
  static const std::vector<KeySpec<ModelConfig>> rows = [] {
    std::vector<KeySpec<ModelConfig>> all = {
        architecture(choice<ModelConfig>("model.kind", "model family", REF(kind))),
        dtype<ModelConfig>("model.dtype", "compute dtype of activations; params and optimizer state stay float32",
                           REF(dtype)),
    };
    for (KeySpec<ModelConfig>& k : merged_family_keys()) all.push_back(std::move(k));
    all.push_back(
        path<ModelConfig>("model.init_from",
                          "start from this model's parameters, taking its architecture: a Hugging Face directory "
                          "(config.json, model.safetensors) or a loom run or checkpoint (\"\" = random init)",
                          REF(init_from)));
    return all;
  }();
  return rows;
}

#undef REF

void validate_model(const ModelConfig& c) {
  validate_lora(c);
  check_key(c.hidden_size >= 1, "model.hidden_size", "must be >= 1", "e.g. 256");
  check_key(c.dropout_rate >= 0 && c.dropout_rate < 1, "model.dropout_rate", "must be in [0, 1)", "e.g. 0.1");
  check_key(c.layer_norm_eps > 0, "model.layer_norm_eps", "must be positive", "Flax uses 1e-6");
  nn::model_kind(c.kind).validate(c);
  check_key(!c.remat.has(RematRegion::auto_) || c.remat == ChoiceSet<RematRegion>{RematRegion::auto_}, "model.remat",
            "auto chooses the regions itself", "write model.remat=auto alone");
  check_key(c.remat_policy != RematPolicyKind::save_only_these_names || !c.remat_save_names.empty(),
            "model.remat_save_names", "save_only_these_names needs at least one pattern",
            "e.g. model.remat_save_names=*/attn/qkv");
}

}  // namespace loom
