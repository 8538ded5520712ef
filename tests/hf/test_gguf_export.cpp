// `loom export gguf` (src/train/gguf_export.h): the fixtures (GPT-2, Llama tied and untied), imported
// and saved as loom checkpoints, exported as GGUF: llama.cpp's tensor names and shapes, q_proj's and
// k_proj's rows permuted per head for llama (row 2j = HF row j, 2j+1 = HF row j + D/2), GPT-2's
// Conv1D weights transposed, each tensor equal to the fixture's after its type's rounding, the
// hyperparameters and the tokenizer; Llama 3.1's rope scaling as the rope_freqs tensor, Qwen2 unpermuted
// with its biases, Mistral's window refused. (llama.cpp running the file is tools/check_gguf.py's check.)
#include "train/gguf_export.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "core/dtype.h"
#include "data/hf_tokenizer.h"
#include "io/safetensors.h"
#include "support/files.h"
#include "train/checkpoint.h"
#include "train/model_source.h"
#include "train/trainer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::hf_golden;
using testing::TempDir;
using testing::user_error;

// The fixture `name` as a loom checkpoint dir/ckpt (its tokenizer saved with it).
void fixture_checkpoint(const std::string& name, const std::string& dir) {
  auto be = make_backend(Device::cpu);
  const Config c = default_config({"model.init_from=" + hf_golden(name), "device=cpu", "data.kind=random_tokens",
                                   "data.batch_size=1", "data.seq_len=8", "data.vocab_size=320"});
  Trainer t(c, *be);
  ModelSource(c.model.init_from).load_params(t.executor());
  const nlohmann::json tok = HfTokenizer::load(hf_golden(name))->to_json();
  ASSERT_TRUE(save_checkpoint(t, CheckpointState{.config_toml = config_to_toml(c)}, dir + "/ckpt", &tok).saved);
}

template <class T>
const T& meta(const GgufFile& f, const std::string& key) {
  for (const auto& [k, v] : f.metadata)
    if (k == key) return std::get<T>(v);
  ADD_FAILURE() << "no key " << key;
  static const T none{};
  return none;
}

const GgufTensor& tensor(const GgufFile& f, const std::string& name) {
  for (const GgufTensor& t : f.tensors)
    if (t.name == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  return f.tensors.front();
}

std::map<std::string, std::vector<float>> hf_tensors(const std::string& fixture) {
  std::map<std::string, std::vector<float>> out;
  for (const StTensor& t : read_safetensors(hf_golden(fixture + "/model.safetensors"))) {
    const auto* x = reinterpret_cast<const float*>(t.bytes.data());
    out[t.name].assign(x, x + t.shape.numel());
  }
  return out;
}

std::vector<float> rounded(const std::vector<float>& x, GgufType t) {
  const std::vector<unsigned char> b = gguf_encode(x.data(), static_cast<int64_t>(x.size()), t);
  return gguf_decode(b.data(), static_cast<int64_t>(x.size()), t);
}

TEST(GgufExport, LlamaTensorsAreLlamaCppsWithQAndKRowsPaired) {
  for (const std::string fixture : {"llama_untied", "llama_tied"}) {
    TempDir d;
    fixture_checkpoint(fixture, d.path());
    const GgufExport r = export_gguf(d.path("ckpt"), d.path("m.gguf"), GgufType::bf16);
    EXPECT_EQ(r.architecture, "llama");
    const GgufFile f = read_gguf(d.path("m.gguf"));
    const bool tied = fixture == "llama_tied";
    EXPECT_EQ(f.tensors.size(), 2u + 2 * 9 + (tied ? 0 : 1)) << fixture;  // a tied head has no output.weight
    EXPECT_EQ(meta<std::string>(f, "general.architecture"), "llama");
    EXPECT_EQ(meta<uint32_t>(f, "llama.attention.head_count"), 4u);
    EXPECT_EQ(meta<uint32_t>(f, "llama.attention.head_count_kv"), 2u);
    EXPECT_EQ(meta<uint32_t>(f, "llama.rope.dimension_count"), 8u);
    EXPECT_EQ(meta<std::string>(f, "tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(meta<std::string>(f, "tokenizer.ggml.pre"), "llama-bpe");
    EXPECT_EQ(meta<std::vector<std::string>>(f, "tokenizer.ggml.tokens").size(), 321u);
    EXPECT_TRUE(meta<bool>(f, "tokenizer.ggml.add_bos_token"));

    const auto hf = hf_tensors(fixture);
    const GgufTensor& embd = tensor(f, "token_embd.weight");
    EXPECT_EQ(embd.shape, (std::vector<int64_t>{321, 32}));
    EXPECT_EQ(embd.type, GgufType::bf16);
    EXPECT_EQ(gguf_decode(embd.data.data(), 321 * 32, GgufType::bf16),
              rounded(hf.at("model.embed_tokens.weight"), GgufType::bf16));
    const GgufTensor& norm = tensor(f, "blk.1.ffn_norm.weight");
    EXPECT_EQ(norm.type, GgufType::f32);
    EXPECT_EQ(gguf_decode(norm.data.data(), 32, GgufType::f32),
              hf.at("model.layers.1.post_attention_layernorm.weight"));
    // q (4 heads) and k (2 heads) of D = 8: GGUF row h·8 + 2j + s is HF row h·8 + j + 4s.
    for (const auto& [g, h, heads] :
         {std::tuple<const char*, const char*, int>{"attn_q", "q_proj", 4}, {"attn_k", "k_proj", 2}}) {
      const GgufTensor& t = tensor(f, std::string("blk.0.") + g + ".weight");
      ASSERT_EQ(t.shape, (std::vector<int64_t>{heads * 8, 32})) << g;
      const std::vector<float> got = gguf_decode(t.data.data(), heads * 8 * 32, GgufType::bf16);
      const std::vector<float> want =
          rounded(hf.at(std::string("model.layers.0.self_attn.") + h + ".weight"), GgufType::bf16);
      for (int head = 0; head < heads; ++head)
        for (int j = 0; j < 4; ++j)
          for (int s = 0; s < 2; ++s)
            for (int col = 0; col < 32; ++col)
              ASSERT_EQ(got[static_cast<size_t>(((head * 8 + 2 * j + s) * 32 + col))],
                        want[static_cast<size_t>(((head * 8 + j + 4 * s) * 32 + col))])
                  << g << " head " << head << " j " << j << " s " << s;
    }
    // v is not permuted.
    const GgufTensor& v = tensor(f, "blk.0.attn_v.weight");
    EXPECT_EQ(gguf_decode(v.data.data(), 16 * 32, GgufType::bf16),
              rounded(hf.at("model.layers.0.self_attn.v_proj.weight"), GgufType::bf16));
  }
}

TEST(GgufExport, Gpt2Conv1DWeightsAreTransposed) {
  TempDir d;
  fixture_checkpoint("gpt2", d.path());
  export_gguf(d.path("ckpt"), d.path("m.gguf"), GgufType::q8_0);
  const GgufFile f = read_gguf(d.path("m.gguf"));
  EXPECT_EQ(meta<std::string>(f, "general.architecture"), "gpt2");
  EXPECT_EQ(meta<std::string>(f, "tokenizer.ggml.pre"), "gpt-2");
  EXPECT_EQ(meta<uint32_t>(f, "general.file_type"), 7u);
  const auto hf = hf_tensors("gpt2");
  const GgufTensor& qkv = tensor(f, "blk.0.attn_qkv.weight");
  ASSERT_EQ(qkv.shape, (std::vector<int64_t>{96, 32}));
  EXPECT_EQ(qkv.type, GgufType::q8_0);
  const std::vector<float>& c_attn = hf.at("transformer.h.0.attn.c_attn.weight");  // [32, 96]
  std::vector<float> t(c_attn.size());
  for (int i = 0; i < 32; ++i)
    for (int o = 0; o < 96; ++o) t[static_cast<size_t>(o * 32 + i)] = c_attn[static_cast<size_t>(i * 96 + o)];
  EXPECT_EQ(gguf_decode(qkv.data.data(), 96 * 32, GgufType::q8_0), rounded(t, GgufType::q8_0));
  EXPECT_EQ(tensor(f, "blk.0.attn_qkv.bias").type, GgufType::f32);
  EXPECT_EQ(tensor(f, "position_embd.weight").shape[0], 64);
}

TEST(GgufExport, Llama3RopeScalingIsTheRopeFreqsTensor) {
  // The fixture: head_dim 8, theta 10000, original_max_position_embeddings 64, factors 8, 1 and 4:
  // wavelengths 2π·10000^(i/4) = 6.28, 62.8, 628, 6283 against the band [64/4, 64/1] = [16, 64]:
  // kept, blended (smooth = (64/62.8 - 1)/3), divided by 8, divided by 8.
  TempDir d;
  fixture_checkpoint("llama3", d.path());
  export_gguf(d.path("ckpt"), d.path("m.gguf"), GgufType::f16);
  const GgufFile f = read_gguf(d.path("m.gguf"));
  const GgufTensor& ff = tensor(f, "rope_freqs.weight");
  ASSERT_EQ(ff.shape, (std::vector<int64_t>{4}));
  const std::vector<float> got = gguf_decode(ff.data.data(), 4, GgufType::f32);
  const double smooth = (64.0 / (2 * M_PI * std::pow(10000.0, 0.25)) - 1) / 3;
  EXPECT_EQ(got[0], 1.f);
  EXPECT_NEAR(got[1], 1 / ((1 - smooth) / 8 + smooth), 1e-6);
  EXPECT_EQ(got[2], 8.f);
  EXPECT_EQ(got[3], 8.f);
}

TEST(GgufExport, Qwen2KeepsTransformersRotationAndItsBiases) {
  TempDir d;
  fixture_checkpoint("qwen2_untied", d.path());
  export_gguf(d.path("ckpt"), d.path("m.gguf"), GgufType::f16);
  const GgufFile f = read_gguf(d.path("m.gguf"));
  EXPECT_EQ(meta<std::string>(f, "general.architecture"), "qwen2");
  EXPECT_EQ(meta<std::string>(f, "tokenizer.ggml.pre"), "qwen2");
  const auto hf = hf_tensors("qwen2_untied");
  // llama.cpp rotates Qwen2's halves as transformers does: no permutation.
  const GgufTensor& q = tensor(f, "blk.0.attn_q.weight");
  EXPECT_EQ(gguf_decode(q.data.data(), 32 * 32, GgufType::f16),
            rounded(hf.at("model.layers.0.self_attn.q_proj.weight"), GgufType::f16));
  const GgufTensor& kb = tensor(f, "blk.1.attn_k.bias");
  EXPECT_EQ(kb.type, GgufType::f32);
  EXPECT_EQ(gguf_decode(kb.data.data(), 16, GgufType::f32), hf.at("model.layers.1.self_attn.k_proj.bias"));
}

TEST(GgufExport, Refusals) {
  TempDir d;
  fixture_checkpoint("gpt2", d.path());
  testing::write_file(d.path("exists.gguf"), "mine");
  std::string m = user_error([&] { export_gguf(d.path("ckpt"), d.path("exists.gguf"), GgufType::f16); });
  EXPECT_NE(m.find("exists.gguf: exists"), std::string::npos) << m;
  EXPECT_EQ(testing::read_file(d.path("exists.gguf")), "mine");
  // Mistral's window (4 tokens of 64) is no part of llama.cpp's llama architecture.
  fixture_checkpoint("mistral", d.path("mistral"));
  m = user_error([&] { export_gguf(d.path("mistral/ckpt"), d.path("w.gguf"), GgufType::f16); });
  EXPECT_NE(m.find("model.sliding_window = 4"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(d.path("w.gguf")));
  // Gemma 3 (llama.cpp's gemma3 adds 1 to the norms and fixes the layer pattern at 6): not written.
  fixture_checkpoint("gemma3", d.path("gemma3"));
  m = user_error([&] { export_gguf(d.path("gemma3/ckpt"), d.path("g.gguf"), GgufType::f16); });
  EXPECT_NE(m.find("is a Gemma3ForCausalLM, which loom cannot write for llama.cpp"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(d.path("g.gguf")));
  m = user_error([&] { gguf_type_named("q4_0"); });
  EXPECT_NE(m.find("--type: is 'q4_0'"), std::string::npos) << m;
}

}  // namespace
}  // namespace loom
