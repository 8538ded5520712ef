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

bool HfConfigJson::present(const char* key) const { return j_.contains(key); }

void HfConfigJson::note_absent(const char* key, int64_t value) const {
  if (!absent_ || present(key)) return;
  for (const auto& [k, v] : *absent_)
    if (k == key) return;
  absent_->emplace_back(key, std::to_string(value));
}

int64_t HfConfigJson::integer(const char* key, int64_t dflt) const {
  const nlohmann::json* v = find(key);
  if (v && (!v->is_number_integer() || v->get<int64_t>() < 1)) fail(key, "is not a positive integer");
  const int64_t out = v ? v->get<int64_t>() : dflt;
  if (out >= 1) note_absent(key, out);  // below 1: the caller's "not given", no config class's value
  return out;
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
  need(c.transformer.block_order == BlockOrder::attn_first, "model.block_order", "is not attn_first");
  need(c.transformer.causal_mask, "model.causal_mask", "is false");
  // Gemma 3's options, which only Gemma3ForCausalLM holds (it checks a copy without them).
  const char* gemma = " (only Gemma3ForCausalLM has it)";
  need(c.transformer.sliding_window_pattern == 0, "model.sliding_window_pattern", std::string("is not 0") + gemma);
  need(c.transformer.rope_local_theta == 0, "model.rope_local_theta", std::string("is not 0") + gemma);
  need(c.transformer.query_pre_attn_scalar == 0, "model.query_pre_attn_scalar", std::string("is not 0") + gemma);
  need(!c.transformer.scale_embeddings, "model.scale_embeddings", std::string("is true") + gemma);
}

std::vector<ArchKey> hf_read_decoder(const std::string& architecture, const HfDecoderSizes& s, ModelConfig& m) {
  m.kind = ModelKind::transformer;
  m.hidden_size = s.hidden_size;
  m.layer_norm_eps = s.norm_eps;
  transformer::Config& t = m.transformer;
  t.num_layers = s.num_layers;
  t.head_dim = s.head_dim;
  t.num_heads = s.num_heads;
  t.num_kv_heads = s.num_kv_heads;
  t.intermediate_size = s.intermediate_size;
  t.vocab_size = t.num_outputs = s.vocab_size;
  t.max_seq_len = s.max_positions;
  t.tie_embeddings = s.tie_embeddings;
  t.block_order = BlockOrder::attn_first;
  t.position = PositionKind::rope;
  t.use_bias = false;
  t.qkv_bias = s.qkv_bias;
  t.causal_mask = true;
  t.embed_dropout = false;
  t.init = InitScheme::gpt2;
  const std::string& a = architecture;
  const auto n = [](auto v) { return nlohmann::json(v).dump(); };
  return {
      {.key = "model.kind", .origin = a},
      {.key = "model.hidden_size", .origin = "hidden_size = " + n(s.hidden_size)},
      {.key = "model.num_layers", .origin = "num_hidden_layers = " + n(s.num_layers)},
      {.key = "model.head_dim", .origin = "head_dim = " + n(s.head_dim)},
      {.key = "model.num_heads", .origin = "num_attention_heads = " + n(s.num_heads)},
      {.key = "model.num_kv_heads", .origin = "num_key_value_heads = " + n(s.num_kv_heads)},
      {.key = "model.intermediate_size", .origin = "intermediate_size = " + n(s.intermediate_size)},
      {.key = "model.vocab_size", .origin = "vocab_size = " + n(s.vocab_size)},
      {.key = "model.num_outputs", .origin = "vocab_size = " + n(s.vocab_size)},
      {.key = "model.max_seq_len", .origin = "max_position_embeddings = " + n(s.max_positions)},
      {.key = "model.layer_norm_eps", .origin = "rms_norm_eps = " + n(s.norm_eps)},
      {.key = "model.tie_embeddings", .origin = "tie_word_embeddings = " + n(s.tie_embeddings)},
      {.key = "model.block_order", .origin = a + " (attention before MLP)"},
      {.key = "model.position", .origin = a + " (rotary embeddings)"},
      {.key = "model.use_bias", .origin = a + (s.qkv_bias ? " (biases on q, k and v only)" : " (no biases)")},
      {.key = "model.qkv_bias", .origin = a + (s.qkv_bias ? " (biases on q, k and v)" : " (no biases)")},
      {.key = "model.causal_mask", .origin = a + " (causal)"},
      {.key = "model.embed_dropout", .origin = a + " (no embedding dropout)", .fixed = false},
      {.key = "model.init", .origin = a, .fixed = false},
  };
}

void hf_read_rope(const HfConfigJson& j, int64_t max_positions, ModelConfig& m, std::vector<ArchKey>& keys) {
  // transformers 5 takes rope_scaling when it is a non-empty object, else rope_parameters; a
  // rope_theta inside it wins over the top-level one (4.x's spelling).
  const char* key = "rope_parameters";
  const nlohmann::json* r = j.find("rope_scaling");
  if (r && r->is_object() && !r->empty())
    key = "rope_scaling";
  else
    r = j.find(key);
  if (r && !r->is_object()) j.fail(key, "is not an object or null");
  const nlohmann::json none = nlohmann::json::object();
  const nlohmann::json& rope = r ? *r : none;
  const auto number = [&](const char* name, bool required, double dflt) {
    const auto it = rope.find(name);
    if (it == rope.end() || it->is_null()) {
      if (required) j.fail(std::string(key) + "." + name, "is missing; rope_type \"llama3\" needs it");
      return dflt;
    }
    if (!it->is_number() || !(it->get<double>() > 0)) j.fail(std::string(key) + "." + name, "is not a positive number");
    return it->get<double>();
  };
  m.transformer.rope_theta = number("rope_theta", false, j.number("rope_theta", 10000));
  const nlohmann::json type = rope.value("rope_type", rope.value("type", nlohmann::json("default")));
  const auto n = [](const nlohmann::json& v) { return v.dump(); };
  keys.push_back({.key = "model.rope_theta", .origin = "rope_theta = " + n(m.transformer.rope_theta)});
  if (type == "default") {
    m.transformer.rope_scaling = RopeScaling::none;
    keys.push_back({.key = "model.rope_scaling", .origin = std::string(key) + ".rope_type = \"default\""});
    return;
  }
  if (type != "llama3")
    j.fail(std::string(key) + ".rope_type",
           "is " + type.dump() + "; loom runs the rope types \"default\" and \"llama3\" (Llama 3.1+) only");
  m.transformer.rope_scaling = RopeScaling::llama3;
  m.transformer.rope_factor = number("factor", true, 0);
  m.transformer.rope_low_freq_factor = number("low_freq_factor", true, 0);
  m.transformer.rope_high_freq_factor = number("high_freq_factor", true, 0);
  if (m.transformer.rope_high_freq_factor <= m.transformer.rope_low_freq_factor)
    j.fail(std::string(key) + ".high_freq_factor", "is not above low_freq_factor; llama3 blends between them");
  // A top-level original_max_position_embeddings wins, as transformers 5 gives it priority.
  const char* omp = "original_max_position_embeddings";
  const std::string omp_key = j.find(omp) ? omp : std::string(key) + "." + omp;
  int64_t original = j.integer(omp, -1);
  if (original < 0) {
    const auto it = rope.find(omp);
    if (it != rope.end() && !it->is_null() && (!it->is_number_integer() || it->get<int64_t>() < 1))
      j.fail(omp_key, "is not a positive integer");
    original = it != rope.end() && !it->is_null() ? it->get<int64_t>() : max_positions;
  }
  m.transformer.rope_original_max_position = original;
  const std::string in = std::string(key) + ".";
  keys.push_back({.key = "model.rope_scaling", .origin = in + "rope_type = \"llama3\""});
  keys.push_back({.key = "model.rope_factor", .origin = in + "factor = " + n(m.transformer.rope_factor)});
  keys.push_back({.key = "model.rope_low_freq_factor",
                  .origin = in + "low_freq_factor = " + n(m.transformer.rope_low_freq_factor)});
  keys.push_back({.key = "model.rope_high_freq_factor",
                  .origin = in + "high_freq_factor = " + n(m.transformer.rope_high_freq_factor)});
  keys.push_back({.key = "model.rope_original_max_position", .origin = omp_key + " = " + n(original)});
}

nlohmann::json hf_rope_json(const ModelConfig& c) {
  nlohmann::json scaling = nullptr;
  nlohmann::json params = {{"rope_theta", c.transformer.rope_theta}, {"rope_type", "default"}};
  if (c.transformer.rope_scaling == RopeScaling::llama3) {
    scaling = {{"rope_type", "llama3"},
               {"factor", c.transformer.rope_factor},
               {"low_freq_factor", c.transformer.rope_low_freq_factor},
               {"high_freq_factor", c.transformer.rope_high_freq_factor},
               {"original_max_position_embeddings", c.transformer.rope_original_max_position}};
    params = scaling;
    params["rope_theta"] = c.transformer.rope_theta;
  }
  return {{"rope_theta", c.transformer.rope_theta}, {"rope_scaling", scaling}, {"rope_parameters", params}};
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
      {"smollm3",
       "skips rotary embeddings in the layers its \"no_rope_layers\" names (NoPE); loom's Llama "
       "blocks rotate q and k in every layer"},
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
