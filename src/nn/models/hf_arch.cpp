#include "nn/models/hf_arch.h"

#include "core/error.h"
#include "nn/models/registry.h"

namespace loom::nn {

#define LOOM_HF_DECLARE(id) const HfArchitecture& id##_architecture();
LOOM_HF_ARCHITECTURES(LOOM_HF_DECLARE)
#undef LOOM_HF_DECLARE

void HfConfigJson::fail(const std::string& key, const std::string& what) const {
  throw UserError(path_, "\"" + key + "\" " + what, "loom imports checkpoints as transformers writes them");
}

const nlohmann::json* HfConfigJson::find(const char* key) const {
  auto it = j_.find(key);
  if (it != j_.end() && !it->is_null()) return &*it;
  if (!defaults_) return nullptr;
  it = defaults_->find(key);
  return it == defaults_->end() || it->is_null() ? nullptr : &*it;
}

int64_t HfConfigJson::integer(const char* key, int64_t dflt) const {
  const nlohmann::json* v = find(key);
  if (!v) return dflt;
  if (!v->is_number_integer() || v->get<int64_t>() < 1) fail(key, "is not a positive integer");
  return v->get<int64_t>();
}

double HfConfigJson::number(const char* key, double dflt) const {
  const nlohmann::json* v = find(key);
  if (!v) return dflt;
  if (!v->is_number() || !(v->get<double>() > 0)) fail(key, "is not a positive number");
  return v->get<double>();
}

bool HfConfigJson::boolean(const char* key, bool dflt) const {
  const nlohmann::json* v = find(key);
  if (!v) return dflt;
  if (!v->is_boolean()) fail(key, "is not true or false");
  return v->get<bool>();
}

std::string HfConfigJson::text(const char* key, const std::string& dflt) const {
  const nlohmann::json* v = find(key);
  if (!v) return dflt;
  if (!v->is_string()) fail(key, "is not a string");
  return v->get<std::string>();
}

void HfNeeds::operator()(bool ok, const char* key, const std::string& problem) const {
  if (!ok) throw UserError(key, problem + ": " + architecture + " cannot hold this model", variant);
}

void HfMapBuilder::operator()(const std::string& hf, Shape hf_shape, std::string path, Shape shape, HfLayout layout,
                              int64_t slot, int64_t slots) const {
  if (!use_bias && path.ends_with("/bias")) path.clear();
  m.params.push_back({.hf_name = (hf == "lm_head.weight" ? "" : m.prefix) + hf,
                      .hf_shape = hf_shape,
                      .path = std::move(path),
                      .shape = shape,
                      .layout = layout,
                      .slot = slot,
                      .slots = slots});
}

void hf_check_decoder(const ModelConfig& c, const HfNeeds& need) {
  need(c.kind == ModelKind::transformer, "model.kind", "is not transformer");
  need(c.block_order == BlockOrder::attn_first, "model.block_order", "is not attn_first");
  need(c.causal_mask, "model.causal_mask", "is false");
}

std::span<const HfArchitecture* const> hf_architectures() {
#define LOOM_HF_ROW(id) &id##_architecture(),
  static const HfArchitecture* const rows[] = {LOOM_HF_ARCHITECTURES(LOOM_HF_ROW)};
#undef LOOM_HF_ROW
  return rows;
}

const HfArchitecture* find_hf_architecture(std::string_view model_type, std::string_view architecture) {
  for (const HfArchitecture* a : hf_architectures()) {
    // config.json names the model by model_type, and by architectures when that is missing.
    const bool by_class = architecture == a->architecture && (model_type.empty() || model_type == a->model_type);
    if (by_class || (architecture.empty() && model_type == a->model_type)) return a;
  }
  return nullptr;
}

std::string_view hf_near_miss(std::string_view model_type) {
  // Llama-family variants whose weights or blocks differ from LlamaForCausalLM's.
  static constexpr std::pair<std::string_view, std::string_view> near[] = {
      {"qwen2", "has biases on q_proj, k_proj and v_proj (and no others), which loom's Llama blocks do not have"},
      {"mistral", "is a Mistral model (sliding-window attention); loom runs LlamaForCausalLM"},
      {"smollm3", "skips rotary embeddings in some layers (NoPE), which loom's Llama blocks do not do"},
  };
  for (const auto& [type, why] : near)
    if (type == model_type) return why;
  return {};
}

const HfArchitecture& hf_architecture_of(const ModelConfig& c) {
  for (const HfArchitecture* a : hf_architectures())
    if (a->claims(c)) return *a;
  return *hf_architectures().front();  // which refuses it, naming the key
}

HfModelMap hf_model_map(const ModelConfig& c) { return hf_architecture_of(c).tensor_map(c); }

}  // namespace loom::nn
