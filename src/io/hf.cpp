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

// Reads config.json's GPT-2 keys (GPT2Config's defaults when absent) and checks the options loom
// does not run.
class Gpt2ConfigReader {
 public:
  Gpt2ConfigReader(const nlohmann::json& j, const std::string& path) : j_(j), path_(path) {}

  void read(HfConfig& out) {
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

 private:
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw UserError(path_, "\"" + key + "\" " + what, "loom imports GPT-2 checkpoints as transformers writes them");
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

// GPT-2's c_attn: the last axis of each of `rows` rows is (3, H, D) in the file and (H, 3, D) in
// loom. to_loom picks the direction.
void permute_qkv(const float* src, float* dst, int64_t rows, int64_t H, int64_t D, bool to_loom) {
  const int64_t C = H * D;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t s = 0; s < 3; ++s)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t hf = r * 3 * C + s * C + h * D, loom = r * 3 * C + h * 3 * D + s * D;
        std::memcpy(dst + (to_loom ? loom : hf), src + (to_loom ? hf : loom), static_cast<size_t>(D) * 4);
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

StTensor f32_tensor(std::string name, Shape shape, const float* values) {
  StTensor t{std::move(name), DType::f32, shape, std::vector<unsigned char>(static_cast<size_t>(shape.numel()) * 4)};
  std::memcpy(t.bytes.data(), values, t.bytes.size());
  return t;
}

// GPT-2's causal-mask buffers, which older checkpoints saved beside the parameters.
bool is_gpt2_buffer(const std::string& name) {
  return (name.starts_with("h.") || name.starts_with("transformer.h.")) &&
         (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias"));
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
  const std::string type = j.value("model_type", "");
  if (auto a = j.find("architectures"); a != j.end() && a->is_array() && !a->empty() && (*a)[0].is_string())
    out.architecture = (*a)[0].get<std::string>();
  if (type == "gpt2" && (out.architecture.empty() || out.architecture == "GPT2LMHeadModel")) {
    out.architecture = "GPT2LMHeadModel";
    Gpt2ConfigReader(j, out.path).read(out);
    return out;
  }
  const std::string what = out.architecture.empty() ? "model_type \"" + type + "\"" : out.architecture;
  for (const char* llama : {"llama", "mistral", "qwen2", "qwen3", "smollm", "smollm3"})
    if (type == llama)
      throw UserError(out.path,
                      what +
                          " is a Llama-family model: it needs RMSNorm, SwiGLU and rotary position embeddings, "
                          "which loom does not have yet",
                      "start from a GPT-2 checkpoint (GPT2LMHeadModel)");
  throw UserError(out.path, what + " is not an architecture loom can run",
                  "loom imports GPT-2 checkpoints (model_type \"gpt2\", GPT2LMHeadModel)");
}

nlohmann::json hf_config_json(const ModelConfig& c, int32_t bos_id, int32_t eos_id) {
  const nn::HfModelMap map = nn::hf_model_map(c);
  nlohmann::json j = {
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
  // null, not absent: GPT2Config's defaults (50256) are outside most vocabularies.
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
  const StTensor* lm_head = nullptr;
  for (const StTensor& t : hf) {
    if (is_gpt2_buffer(t.name)) continue;
    if (t.name == "lm_head.weight") {
      lm_head = &t;
      continue;
    }
    // GPT-2 files written from GPT2Model (the original hub checkpoint) lack the prefix.
    const std::string name =
        expected.count(t.name) || !expected.count("transformer." + t.name) ? t.name : "transformer." + t.name;
    if (!expected.count(name))
      throw UserError(
          source, "tensor '" + t.name + "' is not a parameter of " + map.architecture + " as config.json has it", fix);
    if (!found.emplace(name, &t).second)
      throw UserError(source, "tensor '" + name + "' is there twice (with and without 'transformer.')", fix);
  }
  std::vector<StTensor> out;
  out.reserve(map.params.size());
  for (const nn::HfParam& p : map.params) {
    LOOM_ASSERT(!p.path.empty(), "hf_to_loom: a model from config.json has every GPT-2 bias");
    auto it = found.find(p.hf_name);
    if (it == found.end()) throw UserError(source, "tensor '" + p.hf_name + "' is missing", fix);
    const StTensor& t = *it->second;
    if (t.shape != p.hf_shape)
      throw UserError(
          source, "tensor '" + p.hf_name + "' is " + t.shape.str() + "; config.json's model needs " + p.hf_shape.str(),
          fix);
    const std::vector<float> v = to_f32(t, source);
    if (p.layout == nn::HfLayout::same) {
      out.push_back(f32_tensor(p.path, p.shape, v.data()));
    } else {
      std::vector<float> w(v.size());
      permute_qkv(v.data(), w.data(), p.shape.numel() / (3 * map.heads * map.head_dim), map.heads, map.head_dim,
                  /*to_loom=*/true);
      out.push_back(f32_tensor(p.path, p.shape, w.data()));
    }
  }
  if (lm_head) {  // tied: it must be wte (transformers would tie it and drop its values)
    const std::vector<float> head = to_f32(*lm_head, source);
    const StTensor& wte = out.front();
    if (lm_head->shape != wte.shape || std::memcmp(head.data(), wte.bytes.data(), wte.bytes.size()) != 0)
      throw UserError(source,
                      "tensor 'lm_head.weight' differs from 'transformer.wte.weight', but config.json ties them",
                      "set tie_word_embeddings as the checkpoint was trained");
  }
  return out;
}

std::vector<StTensor> loom_to_hf(const ModelConfig& c, const std::map<std::string, const StTensor*>& loom) {
  const nn::HfModelMap map = nn::hf_model_map(c);
  std::vector<StTensor> out;
  out.reserve(map.params.size());
  for (const nn::HfParam& p : map.params) {
    if (p.path.empty()) {  // a bias the model lacks: zero
      out.push_back(
          {p.hf_name, DType::f32, p.hf_shape, std::vector<unsigned char>(static_cast<size_t>(p.hf_shape.numel()) * 4)});
      continue;
    }
    auto it = loom.find(p.path);
    LOOM_ASSERT(it != loom.end() && it->second->dtype == DType::f32 && it->second->shape == p.shape,
                "loom_to_hf: parameter '" + p.path + "' is missing or misshapen");
    const auto* v = reinterpret_cast<const float*>(it->second->bytes.data());
    if (p.layout == nn::HfLayout::same) {
      out.push_back(f32_tensor(p.hf_name, p.hf_shape, v));
    } else {
      std::vector<float> w(static_cast<size_t>(p.shape.numel()));
      permute_qkv(v, w.data(), p.shape.numel() / (3 * map.heads * map.head_dim), map.heads, map.head_dim,
                  /*to_loom=*/false);
      out.push_back(f32_tensor(p.hf_name, p.hf_shape, w.data()));
    }
  }
  return out;
}

}  // namespace loom
