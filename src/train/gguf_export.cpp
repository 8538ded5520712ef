#include "train/gguf_export.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>

#include "core/error.h"
#include "data/hf_tokenizer.h"
#include "graph/op.h"
#include "nn/models/transformer/transformer.h"
#include "train/hf_export.h"

namespace loom {

namespace {

namespace fs = std::filesystem;

// transformers' module names (after the model's prefix) and llama.cpp's, as its tensor_mapping.py
// pairs them: a block's part, or the whole name outside the blocks.
struct NamePair {
  const char* hf;
  const char* gguf;
};
constexpr NamePair kGlobalNames[] = {
    {"embed_tokens", "token_embd"}, {"norm", "output_norm"},  {"lm_head", "output"},     // Llama-style
    {"wte", "token_embd"},          {"wpe", "position_embd"}, {"ln_f", "output_norm"}};  // GPT-2
constexpr NamePair kBlockNames[] = {{"input_layernorm", "attn_norm"},
                                    {"self_attn.q_proj", "attn_q"},
                                    {"self_attn.k_proj", "attn_k"},
                                    {"self_attn.v_proj", "attn_v"},
                                    {"self_attn.o_proj", "attn_output"},
                                    {"self_attn.q_norm", "attn_q_norm"},
                                    {"self_attn.k_norm", "attn_k_norm"},
                                    {"post_attention_layernorm", "ffn_norm"},
                                    {"mlp.gate_proj", "ffn_gate"},
                                    {"mlp.up_proj", "ffn_up"},
                                    {"mlp.down_proj", "ffn_down"},  // Llama-style
                                    {"ln_1", "attn_norm"},
                                    {"attn.c_attn", "attn_qkv"},
                                    {"attn.c_proj", "attn_output"},
                                    {"ln_2", "ffn_norm"},
                                    {"mlp.c_fc", "ffn_up"},
                                    {"mlp.c_proj", "ffn_down"}};  // GPT-2

// "model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight".
std::string gguf_name(const std::string& hf_name, const std::string& prefix) {
  std::string n = hf_name.starts_with(prefix) ? hf_name.substr(prefix.size()) : hf_name;
  const size_t dot = n.rfind('.');
  const std::string module = n.substr(0, dot), suffix = n.substr(dot);  // ".weight" / ".bias"
  static const std::regex block(R"((?:layers|h)\.(\d+)\.(.+))");
  std::smatch m;
  if (std::regex_match(module, m, block)) {
    for (const NamePair& p : kBlockNames)
      if (m[2] == p.hf) return "blk." + m[1].str() + "." + p.gguf + suffix;
  } else {
    for (const NamePair& p : kGlobalNames)
      if (module == p.hf) return p.gguf + suffix;
  }
  LOOM_ASSERT(false && "a tensor of the architecture's map that llama.cpp's names do not cover");
  return {};
}

// Rows of a q_proj/k_proj weight [heads·D, in] (or bias [heads·D]) reordered per head so that
// llama.cpp's adjacent-pair rotation computes transformers' rotate_half: row 2j <- j, 2j+1 <- j + D/2.
std::vector<float> rotate_pairs_rows(const float* x, const Shape& s, int64_t D) {
  const int64_t rows = s[0], cols = s.numel() / rows;
  std::vector<float> out(static_cast<size_t>(s.numel()));
  for (int64_t h = 0; h < rows / D; ++h)
    for (int64_t j = 0; j < D / 2; ++j)
      for (int64_t half = 0; half < 2; ++half)
        std::memcpy(&out[static_cast<size_t>((h * D + 2 * j + half) * cols)], x + (h * D + j + half * D / 2) * cols,
                    static_cast<size_t>(cols) * sizeof(float));
  return out;
}

std::vector<float> transposed(const float* x, int64_t rows, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(c * rows + r)] = x[r * cols + c];
  return out;
}

// llama.cpp's name of a byte-level pre-tokenizer (tokenizer.ggml.pre, which picks the split regex
// llama-vocab.cpp runs), from the tokenizer.json pre_tokenizer whose splits it reproduces.
std::string gguf_pre_tokenizer(const nlohmann::json& tj, const std::string& subject) {
  static const std::string kLlama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static const std::string kQwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const nlohmann::json pre = tj.value("pre_tokenizer", nlohmann::json());
  auto is = [](const nlohmann::json& j, const char* type) { return j.is_object() && j.value("type", "") == type; };
  if (is(pre, "ByteLevel") && pre.value("use_regex", true)) return "gpt-2";
  if (is(pre, "Sequence") && pre.contains("pretokenizers") && pre["pretokenizers"].size() == 2) {
    const nlohmann::json& a = pre["pretokenizers"][0];
    const nlohmann::json& b = pre["pretokenizers"][1];
    if (is(a, "Digits") && a.value("individual_digits", false) && is(b, "ByteLevel") && b.value("use_regex", true))
      return "smollm";
    if (is(a, "Split") && a.contains("pattern") && a["pattern"].contains("Regex") && is(b, "ByteLevel") &&
        !b.value("use_regex", true)) {
      const std::string re = a["pattern"]["Regex"].get<std::string>();
      if (re == kLlama3) return "llama-bpe";
      if (re == kQwen2) return "qwen2";
    }
  }
  throw UserError(
      subject, "has a pre_tokenizer llama.cpp has no name for",
      "llama.cpp runs the byte-level splits of GPT-2, Llama 3, Qwen2 and SmolLM; export with `loom export hf` "
      "and convert with llama.cpp's convert_hf_to_gguf.py");
}

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;  // llama.cpp's token types: 1 normal, 3 control, 4 user defined, 5 unused
  std::vector<std::string> merges;
  std::string pre;
  bool add_bos = false;
};

constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;

// Added tokens marked special, and any token spelled <|...|>, are control tokens (the converter's rule).
int32_t token_type(const std::string& t, bool added, bool special) {
  if (special || (t.starts_with("<|") && t.ends_with("|>"))) return kControl;
  return added ? kUserDefined : kNormal;
}

Vocab byte_level_vocab(const HfTokenizer& tok, const nlohmann::json& companions, const std::string& subject) {
  const nlohmann::json& tj = tok.tokenizer_json();
  const nlohmann::json& model = tj["model"];
  const bool byte_level = [&] {
    const std::string dump = tj.value("pre_tokenizer", nlohmann::json()).dump();
    return dump.find("\"ByteLevel\"") != std::string::npos;
  }();
  if (!byte_level || model.value("byte_fallback", false))
    throw UserError(
        subject, "is a SentencePiece-style tokenizer (byte fallback, metaspace)",
        "loom's GGUF export writes byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2, SmolLM) for now; export "
        "with `loom export hf` and convert with llama.cpp's convert_hf_to_gguf.py");
  Vocab v;
  v.tokens.assign(static_cast<size_t>(tok.vocab_size()), "");
  v.types.assign(v.tokens.size(), kNormal);
  for (const auto& [text, id] : model["vocab"].items()) v.tokens[id.get<size_t>()] = text;
  for (const nlohmann::json& a : tj.value("added_tokens", nlohmann::json::array())) {
    const auto id = a["id"].get<size_t>();
    v.tokens[id] = a["content"].get<std::string>();
    v.types[id] = token_type(v.tokens[id], true, a.value("special", false));
  }
  for (size_t i = 0; i < v.tokens.size(); ++i)
    if (v.types[i] == kNormal) v.types[i] = token_type(v.tokens[i], false, false);
  for (const nlohmann::json& m : model["merges"])
    v.merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());
  v.pre = gguf_pre_tokenizer(tj, subject);
  // tokenizer_config.json's add_bos_token, else whether the post-processor starts a sequence with a
  // special token (Llama 3's <|begin_of_text|>).
  if (companions.contains("tokenizer_config.json")) {
    const nlohmann::json cfg = nlohmann::json::parse(companions["tokenizer_config.json"].get<std::string>());
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
      v.add_bos = cfg["add_bos_token"].get<bool>();
      return v;
    }
  }
  nlohmann::json post = tj.value("post_processor", nlohmann::json());
  if (post.is_object() && post.value("type", "") == "Sequence")
    for (const nlohmann::json& p : post.value("processors", nlohmann::json::array()))
      if (p.value("type", "") == "TemplateProcessing") post = p;
  const nlohmann::json single = post.is_object() ? post.value("single", nlohmann::json()) : nlohmann::json();
  v.add_bos = single.is_array() && !single.empty() && single[0].contains("SpecialToken");
  return v;
}

Vocab gpt2_vocab(const Tokenizer& tok) {
  const nlohmann::json j = tok.to_json();
  Vocab v;
  for (const nlohmann::json& t : j["tokens"]) {
    v.tokens.push_back(t.get<std::string>());
    v.types.push_back(token_type(v.tokens.back(), false, false));
  }
  for (const nlohmann::json& m : j["merges"]) v.merges.push_back(m.get<std::string>());
  v.pre = "gpt-2";
  return v;
}

// The chat template that travels with the tokenizer: chat_template.jinja, else tokenizer_config.json's.
std::string chat_template(const nlohmann::json& companions) {
  if (companions.contains("chat_template.jinja")) return companions["chat_template.jinja"].get<std::string>();
  if (!companions.contains("tokenizer_config.json")) return {};
  const nlohmann::json cfg =
      nlohmann::json::parse(companions["tokenizer_config.json"].get<std::string>(), nullptr, false);
  return cfg.is_object() && cfg.contains("chat_template") && cfg["chat_template"].is_string()
             ? cfg["chat_template"].get<std::string>()
             : std::string();
}

// The first id of a config.json token id entry (an int or a list), or -1.
int64_t first_id(const nlohmann::json& j) {
  if (j.is_number_integer()) return j.get<int64_t>();
  if (j.is_array() && !j.empty() && j[0].is_number_integer()) return j[0].get<int64_t>();
  return -1;
}

uint32_t file_type(GgufType t) {
  switch (t) {
    case GgufType::f32:
      return 0;
    case GgufType::f16:
      return 1;
    case GgufType::q8_0:
      return 7;
    case GgufType::bf16:
      return 32;
  }
  return 0;
}

}  // namespace

GgufType gguf_type_named(const std::string& name) {
  if (name == "f16") return GgufType::f16;
  if (name == "bf16") return GgufType::bf16;
  if (name == "q8_0") return GgufType::q8_0;
  throw UserError("--type", "is '" + name + "'", "give f16, bf16 or q8_0");
}

GgufExport export_gguf(const std::string& run_or_checkpoint, const std::string& file, GgufType type) {
  std::error_code ec;
  if (fs::exists(file, ec)) throw UserError(file, "exists", "choose a new file name (nothing is overwritten)");
  if (const fs::path parent = fs::path(file).parent_path(); !parent.empty() && !fs::is_directory(parent, ec))
    throw UserError(parent.string(), fs::exists(parent, ec) ? "is not a directory" : "does not exist",
                    "create the directory first (mkdir -p), or write the file elsewhere");
  const HfCheckpoint hc = read_hf_checkpoint(run_or_checkpoint, LoraMerge::if_lora);
  const ModelConfig& c = hc.config.model;
  const nn::HfArchitecture& arch = nn::hf_architecture_of(c);
  if (arch.gguf_architecture.empty())
    throw UserError(run_or_checkpoint,
                    "is a " + std::string(arch.architecture) + ", which loom cannot write for llama.cpp",
                    "export it with `loom export hf` and convert that with llama.cpp's convert_hf_to_gguf.py");
  if (!hc.tokenizer)
    throw UserError(run_or_checkpoint, "has no tokenizer, which a GGUF file must hold",
                    "train on data prepared with `loom prepare hf` (or the GPT-2 tokenizer)");
  const std::string a(arch.gguf_architecture);
  const std::string tok_subject = hc.checkpoint + "/tokenizer.json";
  const auto* hf = dynamic_cast<const HfTokenizer*>(hc.tokenizer.get());
  const nlohmann::json companions = hf ? hf_export_companions(c, *hf) : nlohmann::json::object();
  Vocab v;
  if (hf)
    v = byte_level_vocab(*hf, companions, tok_subject);
  else if (hc.tokenizer->kind() == TokenizerKind::gpt2)
    v = gpt2_vocab(*hc.tokenizer);
  else
    throw UserError(tok_subject, "is loom's character tokenizer, which llama.cpp does not have",
                    "train on data prepared with `loom prepare hf` (a tokenizer.json) or the GPT-2 tokenizer");
  for (int64_t i = static_cast<int64_t>(v.tokens.size()); i < c.transformer.vocab_size;
       ++i) {  // rows past the tokenizer's
    v.tokens.push_back("[PAD" + std::to_string(i) + "]");
    v.types.push_back(kUnused);
  }

  // llama.cpp's llama architecture has no sliding window: a window shorter than the context would
  // be lost, and the model would attend further than it was trained to.
  if (c.transformer.sliding_window > 0 && c.transformer.sliding_window < c.transformer.max_seq_len)
    throw UserError(run_or_checkpoint,
                    "has a sliding window (model.sliding_window = " + std::to_string(c.transformer.sliding_window) +
                        ") shorter than its context, which llama.cpp's " + a + " architecture does not apply",
                    "export it with `loom export hf` for transformers");
  const int64_t C = c.hidden_size, D = c.transformer.head_dim, H = nn::num_heads(c);
  const int64_t KV = c.transformer.num_kv_heads > 0 ? c.transformer.num_kv_heads : H;
  GgufFile f;
  auto put = [&](std::string key, GgufValue value) { f.metadata.emplace_back(std::move(key), std::move(value)); };
  auto u32 = [](int64_t x) { return static_cast<uint32_t>(x); };
  put("general.architecture", a);
  put("general.type", std::string("model"));
  put("general.name", fs::path(hc.checkpoint).parent_path().filename().string());
  put("general.file_type", file_type(type));
  put("general.quantization_version", uint32_t{2});
  put(a + ".block_count", u32(c.transformer.num_layers));
  put(a + ".context_length", u32(c.transformer.max_seq_len));
  put(a + ".embedding_length", u32(C));
  put(a + ".feed_forward_length", u32(nn::mlp_width(c)));
  put(a + ".attention.head_count", u32(H));
  if (c.transformer.norm == NormKind::rmsnorm) {
    put(a + ".attention.head_count_kv", u32(KV));
    put(a + ".attention.layer_norm_rms_epsilon", static_cast<float>(c.layer_norm_eps));
    put(a + ".rope.freq_base", static_cast<float>(c.transformer.rope_theta));
    put(a + ".rope.dimension_count", u32(D));
    put(a + ".vocab_size", u32(c.transformer.vocab_size));
    if (H * D != C || arch.gguf_head_lengths) {
      put(a + ".attention.key_length", u32(D));
      put(a + ".attention.value_length", u32(D));
    }
  } else {
    put(a + ".attention.layer_norm_epsilon", static_cast<float>(c.layer_norm_eps));
  }
  put("tokenizer.ggml.model", std::string("gpt2"));
  put("tokenizer.ggml.pre", v.pre);
  put("tokenizer.ggml.tokens", v.tokens);
  put("tokenizer.ggml.token_type", v.types);
  put("tokenizer.ggml.merges", v.merges);
  const nlohmann::json ids = hf_export_config(c, hc.tokenizer->start_id());
  if (const int64_t bos = first_id(ids.value("bos_token_id", nlohmann::json())); bos >= 0)
    put("tokenizer.ggml.bos_token_id", u32(bos));
  if (const int64_t eos = first_id(ids.value("eos_token_id", nlohmann::json())); eos >= 0)
    put("tokenizer.ggml.eos_token_id", u32(eos));
  put("tokenizer.ggml.add_bos_token", v.add_bos);
  if (const std::string t = chat_template(companions); !t.empty()) put("tokenizer.chat_template", t);

  // Llama 3.1's rope scaling as llama.cpp takes it: rope_freqs.weight, each frequency's divisor
  // (convert_hf_to_gguf's LlamaModel.generate_extra_tensors: 1, factor, or the band's blend).
  if (c.transformer.rope_scaling == RopeScaling::llama3) {
    // Every step in float32, as the converter's torch code computes it (its Python scalars meet
    // float32 tensors).
    std::vector<float> divisors;
    const auto old = static_cast<float>(c.transformer.rope_original_max_position);
    const auto low = static_cast<float>(c.transformer.rope_low_freq_factor),
               high = static_cast<float>(c.transformer.rope_high_freq_factor);
    const auto factor = static_cast<float>(c.transformer.rope_factor);
    for (int64_t i = 0; i < D / 2; ++i) {
      const RopeAttrs plain{.theta = static_cast<float>(c.transformer.rope_theta)};
      const float wavelen = static_cast<float>(2 * M_PI) / rope_inv_freq(plain, D, i);
      if (wavelen < static_cast<float>(double{old} / double{high})) {
        divisors.push_back(1.f);
      } else if (wavelen > static_cast<float>(double{old} / double{low})) {
        divisors.push_back(factor);
      } else {
        const float smooth = (old / wavelen - low) / static_cast<float>(double{high} - double{low});
        divisors.push_back(1.f / ((1.f - smooth) / factor + smooth));
      }
    }
    f.tensors.push_back(
        {"rope_freqs.weight", {D / 2}, GgufType::f32, gguf_encode(divisors.data(), D / 2, GgufType::f32)});
  }
  for (const StTensor& t : hc.tensors) {
    const std::string name = gguf_name(t.name, hc.map.prefix);
    const auto* x = reinterpret_cast<const float*>(t.bytes.data());
    std::vector<float> data(x, x + t.shape.numel());
    std::vector<int64_t> shape(t.shape.dims.begin(), t.shape.dims.begin() + t.shape.rank);
    const bool q = name.find(".attn_q.") != std::string::npos, k = name.find(".attn_k.") != std::string::npos;
    if (arch.gguf_rotate_pairs && (q || k)) data = rotate_pairs_rows(x, t.shape, D);
    if (name.find(".attn_qkv.weight") != std::string::npos || name.find(".attn_output.weight") != std::string::npos ||
        name.find(".ffn_up.weight") != std::string::npos || name.find(".ffn_down.weight") != std::string::npos) {
      if (hc.map.conv1d) {  // [in, out] -> llama.cpp's [out, in]
        data = transposed(x, shape[0], shape[1]);
        std::swap(shape[0], shape[1]);
      }
    }
    GgufType tt = type;
    if (shape.size() <= 1 || name.ends_with("_norm.weight")) tt = GgufType::f32;
    if (tt == GgufType::q8_0 && shape.back() % 32 != 0) tt = GgufType::f16;
    f.tensors.push_back({name, shape, tt, gguf_encode(data.data(), static_cast<int64_t>(data.size()), tt)});
  }
  write_gguf(file, f);
  return {.checkpoint = hc.checkpoint,
          .architecture = a,
          .tensors = static_cast<int64_t>(f.tensors.size()),
          .bytes = static_cast<int64_t>(fs::file_size(file)),
          .skipped = hc.skipped};
}

}  // namespace loom
