#include "io/hf.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "core/error.h"
#include "nn/hf_names.h"
#include "nn/transformer.h"

namespace loom {

namespace {

namespace fs = std::filesystem;

nlohmann::json read_json(const std::string& path, const std::string& fix) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError(path, "cannot be opened", fix);
  const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path, std::string("is not valid JSON (") + e.what() + ")", fix);
  }
}

// Reads config.json's keys of one architecture (its transformers config class's defaults when
// absent) and checks the options loom does not run.
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& j, const std::string& path) : j_(j), path_(path) {}

  void read_gpt2(HfConfig& out) {
    ModelConfig& m = out.model;
    const int64_t n_embd = integer("n_embd", 768), n_layer = integer("n_layer", 12), n_head = integer("n_head", 12);
    const int64_t n_positions = integer("n_positions", 1024), vocab = integer("vocab_size", 50257);
    if (n_embd % n_head != 0) fail("n_head", "n_embd = " + std::to_string(n_embd) + " is not a multiple of it");
    int64_t inner = 4 * n_embd;
    std::string inner_origin = "n_inner = null (4 × n_embd)";
    if (auto it = j_.find("n_inner"); it != j_.end() && !it->is_null()) {
      inner = integer("n_inner", 0);
      inner_origin = "n_inner / n_embd = " + std::to_string(inner) + " / " + std::to_string(n_embd);
      if (inner % n_embd != 0) fail("n_inner", "is not a multiple of n_embd = " + std::to_string(n_embd));
    }
    const double eps = number("layer_norm_epsilon", 1e-5);
    const std::string act = text("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu")
      fail("activation_function", "is \"" + act + "\"; loom runs gelu_new, gelu_pytorch_tanh (tanh GELU) and gelu");
    const bool tied = boolean("tie_word_embeddings", true);
    if (!tied) fail("tie_word_embeddings", "is false; loom runs GPT-2 with its tied head (lm_head = wte)");
    if (!boolean("scale_attn_weights", true)) fail("scale_attn_weights", "is false; loom scales by 1/sqrt(head dim)");
    if (boolean("scale_attn_by_inverse_layer_idx", false))
      fail("scale_attn_by_inverse_layer_idx", "is true, which loom does not do");
    if (boolean("add_cross_attention", false)) fail("add_cross_attention", "is true: not a decoder-only model");

    m.kind = ModelKind::transformer;
    m.hidden_size = n_embd;
    m.num_layers = n_layer;
    m.head_dim = n_embd / n_head;
    m.mlp_expansion = inner / n_embd;
    m.intermediate_size = 0;
    m.vocab_size = m.num_outputs = vocab;
    m.max_seq_len = n_positions;
    m.layer_norm_eps = eps;
    m.block_order = BlockOrder::attn_first;
    m.norm = NormKind::layernorm;
    m.mlp = act == "gelu" ? MlpKind::gelu : MlpKind::gelu_tanh;
    m.position = PositionKind::learned;
    m.num_kv_heads = 0;
    m.use_bias = true;
    m.tie_embeddings = true;
    m.causal_mask = true;
    m.embed_dropout = true;
    m.init = InitScheme::gpt2;
    const std::string a = out.architecture;
    out.keys = {
        {.key = "model.kind", .origin = a},
        {.key = "model.hidden_size", .origin = "n_embd = " + std::to_string(n_embd)},
        {.key = "model.num_layers", .origin = "n_layer = " + std::to_string(n_layer)},
        {.key = "model.head_dim",
         .origin = "n_embd / n_head = " + std::to_string(n_embd) + " / " + std::to_string(n_head)},
        {.key = "model.mlp_expansion", .origin = inner_origin},
        {.key = "model.intermediate_size", .origin = inner_origin + " (0: from mlp_expansion)"},
        {.key = "model.vocab_size", .origin = "vocab_size = " + std::to_string(vocab)},
        {.key = "model.num_outputs", .origin = "vocab_size = " + std::to_string(vocab)},
        {.key = "model.max_seq_len", .origin = "n_positions = " + std::to_string(n_positions)},
        {.key = "model.layer_norm_eps", .origin = "layer_norm_epsilon = " + nlohmann::json(eps).dump()},
        {.key = "model.tie_embeddings", .origin = "tie_word_embeddings = true"},
        {.key = "model.block_order", .origin = a + " (attention before MLP)"},
        {.key = "model.norm", .origin = a + " (LayerNorm)"},
        {.key = "model.mlp", .origin = "activation_function = \"" + act + "\""},
        {.key = "model.position", .origin = a + " (learned wpe)"},
        {.key = "model.num_kv_heads", .origin = a + " (every head has its keys and values)"},
        {.key = "model.use_bias", .origin = a + " (biases everywhere)"},
        {.key = "model.causal_mask", .origin = a + " (causal)"},
        {.key = "model.embed_dropout", .origin = "embd_pdrop", .fixed = false},
        {.key = "model.init", .origin = a, .fixed = false},
    };
  }

  // LlamaForCausalLM (LlamaConfig's defaults): rotary embeddings of the default type only.
  void read_llama(HfConfig& out) {
    ModelConfig& m = out.model;
    const int64_t hidden = integer("hidden_size", 4096), layers = integer("num_hidden_layers", 32);
    const int64_t heads = integer("num_attention_heads", 32), kv = integer("num_key_value_heads", heads);
    const int64_t inter = integer("intermediate_size", 11008), vocab = integer("vocab_size", 32000);
    const int64_t positions = integer("max_position_embeddings", 2048);
    if (hidden % heads != 0) fail("num_attention_heads", "does not divide hidden_size = " + std::to_string(hidden));
    const int64_t head_dim = integer("head_dim", hidden / heads);
    if (head_dim * heads != hidden)
      fail("head_dim", "× num_attention_heads is not hidden_size = " + std::to_string(hidden) +
                           "; loom's attention projects back from hidden_size features");
    if (heads % kv != 0) fail("num_key_value_heads", "does not divide num_attention_heads = " + std::to_string(heads));
    const double eps = number("rms_norm_eps", 1e-6);
    const std::string act = text("hidden_act", "silu");
    if (act != "silu") fail("hidden_act", "is \"" + act + "\"; loom's SwiGLU MLP is SiLU-gated");
    if (boolean("attention_bias", false)) fail("attention_bias", "is true; loom's Llama layers have no biases");
    if (boolean("mlp_bias", false)) fail("mlp_bias", "is true; loom's Llama layers have no biases");
    // transformers 5 writes rope_parameters {rope_theta, rope_type}; older versions rope_theta
    // and rope_scaling (null or {"rope_type" or "type": ...}). transformers 5 also honours a
    // rope_scaling left beside rope_parameters, so neither may ask for another type.
    double theta = number("rope_theta", 10000);
    for (const char* key : {"rope_parameters", "rope_scaling"}) {
      const nlohmann::json* r = find(key);
      if (!r) continue;
      if (!r->is_object()) fail(key, "is not an object or null");
      if (auto t = r->find("rope_theta"); t != r->end()) {
        if (!t->is_number() || !(t->get<double>() > 0))
          fail(std::string(key) + ".rope_theta", "is not a positive number");
        theta = t->get<double>();
      }
      const nlohmann::json type = r->value("rope_type", r->value("type", nlohmann::json("default")));
      if (type != "default")
        fail(key, "asks for rope_type " + type.dump() + "; loom's rotary embeddings are the default type");
    }
    const bool tied = boolean("tie_word_embeddings", false);

    m.kind = ModelKind::transformer;
    m.hidden_size = hidden;
    m.num_layers = layers;
    m.head_dim = head_dim;
    m.intermediate_size = inter;
    m.vocab_size = m.num_outputs = vocab;
    m.max_seq_len = positions;
    m.layer_norm_eps = eps;
    m.block_order = BlockOrder::attn_first;
    m.norm = NormKind::rmsnorm;
    m.mlp = MlpKind::swiglu;
    m.position = PositionKind::rope;
    m.rope_theta = theta;
    m.num_kv_heads = kv;
    m.use_bias = false;
    m.tie_embeddings = tied;
    m.causal_mask = true;
    m.embed_dropout = false;
    m.init = InitScheme::gpt2;
    const std::string a = out.architecture;
    const auto n = [](int64_t v) { return std::to_string(v); };
    out.keys = {
        {.key = "model.kind", .origin = a},
        {.key = "model.hidden_size", .origin = "hidden_size = " + n(hidden)},
        {.key = "model.num_layers", .origin = "num_hidden_layers = " + n(layers)},
        {.key = "model.head_dim", .origin = "head_dim = " + n(head_dim)},
        {.key = "model.intermediate_size", .origin = "intermediate_size = " + n(inter)},
        {.key = "model.vocab_size", .origin = "vocab_size = " + n(vocab)},
        {.key = "model.num_outputs", .origin = "vocab_size = " + n(vocab)},
        {.key = "model.max_seq_len", .origin = "max_position_embeddings = " + n(positions)},
        {.key = "model.layer_norm_eps", .origin = "rms_norm_eps = " + nlohmann::json(eps).dump()},
        {.key = "model.tie_embeddings", .origin = std::string("tie_word_embeddings = ") + (tied ? "true" : "false")},
        {.key = "model.block_order", .origin = a + " (attention before MLP)"},
        {.key = "model.norm", .origin = a + " (RMSNorm)"},
        {.key = "model.mlp", .origin = "hidden_act = \"silu\" (SwiGLU)"},
        {.key = "model.position", .origin = a + " (rotary embeddings)"},
        {.key = "model.rope_theta", .origin = "rope_theta = " + nlohmann::json(theta).dump()},
        {.key = "model.num_kv_heads", .origin = "num_key_value_heads = " + n(kv)},
        {.key = "model.use_bias", .origin = a + " (no biases)"},
        {.key = "model.causal_mask", .origin = a + " (causal)"},
        {.key = "model.embed_dropout", .origin = a + " (no embedding dropout)", .fixed = false},
        {.key = "model.init", .origin = a, .fixed = false},
    };
  }

 private:
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw UserError(path_, "\"" + key + "\" " + what, "loom imports checkpoints as transformers writes them");
  }
  const nlohmann::json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  int64_t integer(const char* key, int64_t dflt) const {
    const nlohmann::json* v = find(key);
    if (!v) return dflt;
    if (!v->is_number_integer() || v->get<int64_t>() < 1) fail(key, "is not a positive integer");
    return v->get<int64_t>();
  }
  double number(const char* key, double dflt) const {
    const nlohmann::json* v = find(key);
    if (!v) return dflt;
    if (!v->is_number() || !(v->get<double>() > 0)) fail(key, "is not a positive number");
    return v->get<double>();
  }
  bool boolean(const char* key, bool dflt) const {
    const nlohmann::json* v = find(key);
    if (!v) return dflt;
    if (!v->is_boolean()) fail(key, "is not true or false");
    return v->get<bool>();
  }
  std::string text(const char* key, const std::string& dflt) const {
    const nlohmann::json* v = find(key);
    if (!v) return dflt;
    if (!v->is_string()) fail(key, "is not a string");
    return v->get<std::string>();
  }

  const nlohmann::json& j_;
  const std::string& path_;
};

// Where one Hugging Face tensor's values sit in loom's parameter (nn/hf_names.h's layouts):
// run(hf_offset, loom_offset, n) for each run of n consecutive floats in both, in element
// offsets into p.hf_shape and p.shape.
template <class Run>
void for_each_run(const nn::HfParam& p, const nn::HfModelMap& m, Run&& run) {
  const int64_t D = m.head_dim, n = p.hf_shape.numel();
  switch (p.layout) {
    case nn::HfLayout::same:
      run(0, 0, n);
      return;
    case nn::HfLayout::qkv_columns: {  // rows of (3, H, D) <-> rows of (H, 3, D)
      const int64_t H = m.heads, C = H * D;
      for (int64_t r = 0; r < n / (3 * C); ++r)
        for (int64_t s = 0; s < 3; ++s)
          for (int64_t h = 0; h < H; ++h) run(r * 3 * C + s * C + h * D, r * 3 * C + h * 3 * D + s * D, D);
      return;
    }
    case nn::HfLayout::transposed: {  // hf [a, b] <-> loom [b, a]
      const int64_t a = p.hf_shape[0], b = n / a;
      for (int64_t i = 0; i < a; ++i)
        for (int64_t k = 0; k < b; ++k) run(i * b + k, k * a + i, 1);
      return;
    }
    case nn::HfLayout::qkv_rows: {  // hf row (j·slots + s)·D + d <-> loom [c, j, (slot + s)·D + d]
      const int64_t C = p.hf_shape[1], width = p.shape.numel() / C, per_head = width / m.kv_heads;
      for (int64_t r = 0; r < p.hf_shape[0]; ++r) {
        const int64_t col = r / (p.slots * D) * per_head + p.slot * D + r % (p.slots * D);
        for (int64_t c = 0; c < C; ++c) run(r * C + c, c * width + col, 1);
      }
      return;
    }
  }
}

// `t`'s values as float32 (float32, bfloat16 and float16 files).
std::vector<float> to_f32(const StTensor& t, const std::string& source) {
  if (t.dtype != DType::f32 && t.dtype != DType::bf16 && t.dtype != DType::f16)
    throw UserError(source, "tensor '" + t.name + "' is " + dtype_name(t.dtype) + ", not a float",
                    "save the checkpoint in float32, bfloat16 or float16");
  std::vector<float> v(static_cast<size_t>(t.shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_f32(t.bytes.data(), t.dtype, i);
  return v;
}

// Buffers older checkpoints saved beside the parameters: GPT-2's causal masks, Llama's rotary
// inverse frequencies (recomputed from rope_theta).
bool is_buffer(const std::string& name) {
  return ((name.starts_with("h.") || name.starts_with("transformer.h.")) &&
          (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias"))) ||
         name.ends_with(".rotary_emb.inv_freq");
}

}  // namespace

bool is_hf_model_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / "config.json", ec);
}

HfConfig read_hf_config(const std::string& dir) {
  HfConfig out;
  out.path = (fs::path(dir) / "config.json").string();
  const nlohmann::json j = read_json(out.path, "give a Hugging Face model directory (config.json, model.safetensors)");
  if (!j.is_object()) throw UserError(out.path, "is not a JSON object", "use the config.json transformers wrote");
  std::string type = j.value("model_type", "");
  if (auto a = j.find("architectures"); a != j.end() && a->is_array() && !a->empty() && (*a)[0].is_string())
    out.architecture = (*a)[0].get<std::string>();
  ConfigReader reader(j, out.path);
  // config.json names the model by model_type, and by architectures when that is missing.
  if ((type == "gpt2" || type.empty()) && out.architecture == "GPT2LMHeadModel") type = "gpt2";
  if ((type == "llama" || type.empty()) && out.architecture == "LlamaForCausalLM") type = "llama";
  if (type == "gpt2" && (out.architecture.empty() || out.architecture == "GPT2LMHeadModel")) {
    out.architecture = "GPT2LMHeadModel";
    reader.read_gpt2(out);
    return out;
  }
  if (type == "llama" && (out.architecture.empty() || out.architecture == "LlamaForCausalLM")) {
    out.architecture = "LlamaForCausalLM";
    reader.read_llama(out);
    return out;
  }
  const std::string what = out.architecture.empty() ? "model_type \"" + type + "\"" : out.architecture;
  const std::string fix =
      "loom imports GPT2LMHeadModel (model_type \"gpt2\") and LlamaForCausalLM (model_type \"llama\": SmolLM, "
      "Llama 3 without rope scaling) checkpoints";
  // Llama-family variants whose weights or blocks differ from LlamaForCausalLM's.
  const std::map<std::string, std::string> near = {
      {"qwen2", "has biases on q_proj, k_proj and v_proj (and no others), which loom's Llama blocks do not have"},
      {"qwen3", "normalises q and k per head (q_norm, k_norm), which loom's Llama blocks do not do"},
      {"mistral", "is a Mistral model (sliding-window attention); loom runs LlamaForCausalLM"},
      {"smollm3", "skips rotary embeddings in some layers (NoPE), which loom's Llama blocks do not do"},
  };
  if (auto it = near.find(type); it != near.end()) throw UserError(out.path, what + " " + it->second, fix);
  throw UserError(out.path, what + " is not an architecture loom can run", fix);
}

nlohmann::json hf_config_json(const ModelConfig& c, int32_t bos_id, int32_t eos_id) {
  const nn::HfModelMap map = nn::hf_model_map(c);
  nlohmann::json j;
  if (map.architecture == "LlamaForCausalLM") {
    j = {
        {"architectures", {map.architecture}},
        {"model_type", map.model_type},
        {"hidden_size", c.hidden_size},
        {"intermediate_size", nn::mlp_width(c)},
        {"num_hidden_layers", c.num_layers},
        {"num_attention_heads", map.heads},
        {"num_key_value_heads", map.kv_heads},
        {"head_dim", c.head_dim},
        {"hidden_act", "silu"},
        {"max_position_embeddings", c.max_seq_len},
        {"vocab_size", c.vocab_size},
        {"rms_norm_eps", c.layer_norm_eps},
        // Both spellings: transformers 5 reads rope_parameters, 4.x rope_theta and rope_scaling.
        {"rope_theta", c.rope_theta},
        {"rope_scaling", nullptr},
        {"rope_parameters", {{"rope_theta", c.rope_theta}, {"rope_type", "default"}}},
        {"attention_bias", false},
        {"mlp_bias", false},
        {"attention_dropout", 0.0},
        {"tie_word_embeddings", c.tie_embeddings},
        {"pretraining_tp", 1},
        {"initializer_range", 0.02},
        {"use_cache", true},
        {"dtype", "float32"},
    };
  } else {
    j = {
        {"architectures", {map.architecture}},
        {"model_type", map.model_type},
        {"n_embd", c.hidden_size},
        {"n_layer", c.num_layers},
        {"n_head", map.heads},
        {"n_inner", nn::mlp_width(c) == 4 * c.hidden_size ? nlohmann::json(nullptr) : nlohmann::json(nn::mlp_width(c))},
        {"n_positions", c.max_seq_len},
        {"n_ctx", c.max_seq_len},
        {"vocab_size", c.vocab_size},
        {"layer_norm_epsilon", c.layer_norm_eps},
        {"activation_function", c.mlp == MlpKind::gelu ? "gelu" : "gelu_new"},
        {"resid_pdrop", c.dropout_rate},
        {"embd_pdrop", c.embed_dropout ? c.dropout_rate : 0.0},
        {"attn_pdrop", 0.0},
        {"scale_attn_weights", true},
        {"scale_attn_by_inverse_layer_idx", false},
        {"reorder_and_upcast_attn", false},
        {"tie_word_embeddings", true},
        {"initializer_range", 0.02},
        {"use_cache", true},
        {"dtype", "float32"},
    };
  }
  // null, not absent: the config classes' defaults (GPT-2's 50256, Llama's 1 and 2) may be outside
  // the vocabulary or mean other tokens.
  j["bos_token_id"] = bos_id >= 0 ? nlohmann::json(bos_id) : nlohmann::json(nullptr);
  j["eos_token_id"] = eos_id >= 0 ? nlohmann::json(eos_id) : nlohmann::json(nullptr);
  return j;
}

std::vector<StTensor> read_hf_tensors(const std::string& dir, std::string* file) {
  const fs::path single = fs::path(dir) / "model.safetensors", index = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  const bool one = fs::is_regular_file(single, ec);
  if (file) *file = (one ? single : index).string();
  if (one) return read_safetensors(single.string());
  if (!fs::is_regular_file(index, ec))
    throw UserError(dir, "has neither model.safetensors nor model.safetensors.index.json",
                    "loom reads safetensors checkpoints; convert a pytorch_model.bin with transformers' "
                    "save_pretrained(DIR, safe_serialization=True)");
  const std::string fix = "use the index and shards save_pretrained wrote, complete";
  const nlohmann::json j = read_json(index.string(), fix);
  auto wm = j.find("weight_map");
  if (!j.is_object() || wm == j.end() || !wm->is_object() || wm->empty())
    throw UserError(index.string(), "has no \"weight_map\" object", fix);
  std::map<std::string, std::vector<std::string>> by_shard;  // shard file -> the tensors it should hold
  for (const auto& [name, shard] : wm->items()) {
    if (!shard.is_string() || shard.get<std::string>().find('/') != std::string::npos)
      throw UserError(index.string(), "the shard of tensor '" + name + "' is not a file name in the directory", fix);
    by_shard[shard.get<std::string>()].push_back(name);
  }
  std::vector<StTensor> out;
  for (const auto& [shard, names] : by_shard) {
    const std::string path = (fs::path(dir) / shard).string();
    std::vector<StTensor> ts = read_safetensors(path);
    std::set<std::string> held;
    for (const StTensor& t : ts) held.insert(t.name);
    for (const std::string& n : names)
      if (!held.count(n))
        throw UserError(path, "does not hold tensor '" + n + "', which " + index.filename().string() + " puts there",
                        fix);
    for (StTensor& t : ts) out.push_back(std::move(t));
  }
  return out;
}

std::vector<StTensor> hf_to_loom(const ModelConfig& c, const std::vector<StTensor>& hf, const std::string& source) {
  const nn::HfModelMap map = nn::hf_model_map(c);
  const std::string fix = "the checkpoint must hold exactly the parameters its config.json describes";
  std::map<std::string, const nn::HfParam*> expected;
  for (const nn::HfParam& p : map.params) expected[p.hf_name] = &p;
  std::map<std::string, const StTensor*> found;
  const StTensor* tied_head = nullptr;
  for (const StTensor& t : hf) {
    if (is_buffer(t.name)) continue;
    if (t.name == "lm_head.weight" && !expected.count(t.name)) {
      tied_head = &t;
      continue;
    }
    // Files written from the base model class (GPT2Model: the original GPT-2 hub checkpoint) lack
    // the prefix.
    const std::string name =
        expected.count(t.name) || !expected.count(map.prefix + t.name) ? t.name : map.prefix + t.name;
    if (!expected.count(name))
      throw UserError(
          source, "tensor '" + t.name + "' is not a parameter of " + map.architecture + " as config.json has it", fix);
    if (!found.emplace(name, &t).second)
      throw UserError(source, "tensor '" + name + "' is there twice (with and without '" + map.prefix + "')", fix);
  }
  std::vector<StTensor> out;  // in the order of their first tensor in the map
  std::map<std::string, size_t> index;
  for (const nn::HfParam& p : map.params) {
    LOOM_ASSERT(!p.path.empty(), "hf_to_loom: a model from config.json has every bias its architecture has");
    auto it = found.find(p.hf_name);
    if (it == found.end()) throw UserError(source, "tensor '" + p.hf_name + "' is missing", fix);
    const StTensor& t = *it->second;
    if (t.shape != p.hf_shape)
      throw UserError(
          source, "tensor '" + p.hf_name + "' is " + t.shape.str() + "; config.json's model needs " + p.hf_shape.str(),
          fix);
    const std::vector<float> v = to_f32(t, source);
    if (auto [at, added] = index.emplace(p.path, out.size()); added)
      out.push_back(
          {p.path, DType::f32, p.shape, std::vector<unsigned char>(static_cast<size_t>(p.shape.numel()) * 4)});
    auto* dst = reinterpret_cast<float*>(out[index.at(p.path)].bytes.data());
    for_each_run(p, map, [&](int64_t h, int64_t l, int64_t n) {
      std::memcpy(dst + l, v.data() + h, static_cast<size_t>(n) * 4);
    });
  }
  if (tied_head) {  // it must be the embedding (transformers would tie it and drop its values)
    const std::vector<float> head = to_f32(*tied_head, source);
    const StTensor& table = out[index.at("embed/embedding")];
    if (tied_head->shape != table.shape || std::memcmp(head.data(), table.bytes.data(), table.bytes.size()) != 0)
      throw UserError(
          source,
          "tensor 'lm_head.weight' differs from '" + map.params.front().hf_name + "', but config.json ties them",
          "set tie_word_embeddings as the checkpoint was trained");
  }
  return out;
}

std::vector<StTensor> loom_to_hf(const ModelConfig& c, const std::map<std::string, const StTensor*>& loom) {
  const nn::HfModelMap map = nn::hf_model_map(c);
  std::vector<StTensor> out;
  out.reserve(map.params.size());
  for (const nn::HfParam& p : map.params) {
    out.push_back(
        {p.hf_name, DType::f32, p.hf_shape, std::vector<unsigned char>(static_cast<size_t>(p.hf_shape.numel()) * 4)});
    if (p.path.empty()) continue;  // a bias the model lacks: zero
    auto it = loom.find(p.path);
    LOOM_ASSERT(it != loom.end() && it->second->dtype == DType::f32 && it->second->shape == p.shape,
                "loom_to_hf: parameter '" + p.path + "' is missing or misshapen");
    const auto* src = reinterpret_cast<const float*>(it->second->bytes.data());
    auto* dst = reinterpret_cast<float*>(out.back().bytes.data());
    for_each_run(p, map,
                 [&](int64_t h, int64_t l, int64_t n) { std::memcpy(dst + h, src + l, static_cast<size_t>(n) * 4); });
  }
  return out;
}

}  // namespace loom
