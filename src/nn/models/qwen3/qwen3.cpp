// Qwen3 (transformers' Qwen3ForCausalLM, model_type "qwen3": Qwen3-0.6B ... 32B dense) as a
// Hugging Face architecture of the transformer family: Llama's blocks (llama/llama.cpp) with
// model.qk_norm (q_norm and k_norm: RMSNorm of each query and key head over head_dim, before
// rope) and a head_dim independent of the width (model.num_heads = num_attention_heads; q_proj
// maps hidden_size to num_heads·head_dim features and o_proj back).
//
// config.json -> model.*: read as Llama's (the same keys; an absent key takes Qwen3Config's
// default), plus qk_norm = true. attention_bias (biases on q, k, v and o) and sliding-window
// attention (use_sliding_window, or a "sliding_attention" layer in layer_types) are refused.
//
// Tensors: Llama's (the same names, shapes and layouts), plus per layer l
//   attn/q_norm/scale [D]   model.layers.l.self_attn.q_norm.weight [D]
//   attn/k_norm/scale [D]   model.layers.l.self_attn.k_norm.weight [D]
// transformers' Qwen3RMSNorm casts x·rstd to the compute dtype before the weight multiplies it;
// loom's qk_norm rounds once (graph/ops.def), the same in float32.
#include <string>

#include "core/error.h"
#include "nn/models/hf_arch.h"
#include "nn/models/transformer/transformer.h"

namespace loom::nn {

const HfArchitecture& llama_architecture();

namespace {

constexpr const char* kArchitecture = "Qwen3ForCausalLM";

bool claims(const ModelConfig& c) { return c.transformer.norm == NormKind::rmsnorm && c.transformer.qk_norm; }

void read_config(const HfConfigJson& file, ModelConfig& m, std::vector<ArchKey>& keys) {
  // Qwen3Config's defaults where they differ from LlamaConfig's.
  static const nlohmann::json defaults = {
      {"vocab_size", 151936},         {"hidden_size", 4096},   {"intermediate_size", 22016},
      {"num_key_value_heads", 32},    {"head_dim", 128},       {"max_position_embeddings", 32768},
      {"tie_word_embeddings", false}, {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-6},
  };
  const HfConfigJson j(file, defaults);
  if (j.boolean("attention_bias", false))
    j.fail("attention_bias", "is true; loom's Qwen3 layers have no biases (Qwen3 checkpoints have none)");
  if (j.boolean("use_sliding_window", false))
    j.fail("use_sliding_window", "is true; loom's Qwen3 attention covers the whole causal context");
  if (const nlohmann::json* types = j.find("layer_types")) {
    if (!types->is_array()) j.fail("layer_types", "is not an array");
    for (const nlohmann::json& t : *types)
      if (t != "full_attention")
        j.fail("layer_types", "has " + t.dump() + "; loom's Qwen3 layers are all \"full_attention\"");
  }
  llama_architecture().read_config(j, m, keys);
  m.transformer.qk_norm = true;
  // The relative's reader names its own class in the origins.
  const std::string llama(llama_architecture().architecture);
  for (ArchKey& k : keys)
    if (const size_t at = k.origin.find(llama); at != std::string::npos)
      k.origin.replace(at, llama.size(), kArchitecture);
  keys.push_back({.key = "model.qk_norm", .origin = std::string(kArchitecture) + " (q_norm, k_norm)"});
}

nlohmann::json write_config(const ModelConfig& c, const HfModelMap& map) {
  nlohmann::json j = llama_architecture().write_config(c, map);
  j.erase("mlp_bias");
  j.erase("pretraining_tp");
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["layer_types"] = nlohmann::json::array();
  for (int64_t l = 0; l < c.transformer.num_layers; ++l) j["layer_types"].push_back("full_attention");
  return j;
}

HfModelMap tensor_map(const ModelConfig& c) {
  const HfNeeds need{kArchitecture,
                     "Qwen3's variant is Llama's (block_order = attn_first, norm = rmsnorm, mlp = swiglu, position = "
                     "rope, use_bias = false, causal_mask = true) with qk_norm = true; model.qk_norm chose it"};
  hf_check_decoder(c, need);
  need(c.transformer.mlp == MlpKind::swiglu, "model.mlp", "is not swiglu (Qwen3's MLP is SiLU-gated)");
  need(c.transformer.position == PositionKind::rope, "model.position", "is not rope (Qwen3 has no position table)");
  need(!c.transformer.use_bias, "model.use_bias", "is true (Qwen3's layers have no biases)");
  need(!c.transformer.post_norms, "model.post_norms", "is true (Qwen3 has no norms after its branches)");
  ModelConfig plain = c;  // Llama's map holds every tensor but the q/k norms
  plain.transformer.qk_norm = false;
  const HfModelMap llama = llama_architecture().tensor_map(plain);
  HfModelMap m = llama;
  m.architecture = kArchitecture;
  m.model_type = "qwen3";
  m.params.clear();
  const Shape d{c.transformer.head_dim};
  for (const HfParam& p : llama.params) {
    m.params.push_back(p);
    if (!p.hf_name.ends_with(".self_attn.o_proj.weight")) continue;  // q_norm and k_norm follow o_proj
    const std::string hf = p.hf_name.substr(0, p.hf_name.size() - std::string("o_proj.weight").size());
    const std::string path = p.path.substr(0, p.path.size() - std::string("output_layer/kernel").size());
    for (const char* which : {"q_norm", "k_norm"})
      m.params.push_back({.hf_name = hf + which + ".weight",
                          .hf_shape = d,
                          .path = path + which + "/scale",
                          .shape = d,
                          .layout = HfLayout::same});
  }
  return m;
}

}  // namespace

const HfArchitecture& qwen3_architecture() {
  static const HfArchitecture a{.architecture = kArchitecture,
                                .model_type = "qwen3",
                                .listed_as = "Qwen3ForCausalLM (model_type \"qwen3\": Qwen3 dense models)",
                                .claims = claims,
                                .read_config = read_config,
                                .write_config = write_config,
                                .tensor_map = tensor_map,
                                .gguf_architecture = "qwen3",
                                .gguf_head_lengths = true};
  return a;
}

}  // namespace loom::nn
