// Hugging Face checkpoints in (src/io/hf.h, src/nn/models/hf_arch.h, src/train/model_source.h) against
// tests/golden/hf/{gpt2, llama_tied, llama_untied, llama3, qwen2_tied, qwen2_untied, mistral, qwen3, gemma3}:
// random-weight GPT2LMHeadModel, LlamaForCausalLM (GQA; tied and untied heads; Llama 3.1's llama3
// rope scaling), Qwen2ForCausalLM (q/k/v biases), MistralForCausalLM (a sliding window shorter
// than the sequence), Qwen3ForCausalLM (q/k norms, head_dim independent of the width) and
// Gemma3ForCausalLM (scaled embeddings, 1 + w norms, four per layer, GeGLU, query_pre_attn_scalar,
// local and global layers with their own windows and rope bases) models
// and the logits, loss and gradients transformers computes for fixed ids, and its greedy
// continuation (tools/make_hf_fixtures.py). loom started from each
// directory must compute the same (float32; logits within 1e-4 absolute, the bound, and
// 1e-5 relative to their range), on the training program, the evaluation program and the
// sampler's one-token program, on the CPU backend and on the reference oracle. Then what the
// importer accepts (bfloat16 / float16 files, shards, GPT2Model names, the mask buffers) and
// refuses (a missing, extra or misshapen tensor, other architectures and options, a
// configuration that contradicts the checkpoint), and fine-tuning from a loom run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "backend/registry.h"
#include "graph/passes/plan.h"
#include "io/hf.h"
#include "io/param_io.h"
#include "nn/models.h"
#include "nn/models/transformer/transformer.h"
#include "sample/sample.h"
#include "support/files.h"
#include "train/checkpoint.h"
#include "train/model_source.h"
#include "train/trainer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::hf_golden;
using testing::read_file;
using testing::TempDir;
using testing::user_error;
using testing::write_file;

struct Expected {
  std::map<std::string, StTensor> t;
  const StTensor& at(const std::string& n) const { return t.at(n); }
  std::vector<float> f32(const std::string& n) const {
    const StTensor& x = at(n);
    std::vector<float> v(static_cast<size_t>(x.shape.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_f32(x.bytes.data(), x.dtype, i);
    return v;
  }
  std::vector<int32_t> ids(const std::string& n) const {
    const StTensor& x = at(n);
    std::vector<int32_t> v(static_cast<size_t>(x.shape.numel()));
    std::memcpy(v.data(), x.bytes.data(), x.bytes.size());
    return v;
  }
};

Expected expected(const std::string& dir = "gpt2") {
  Expected e;
  for (StTensor& t : read_safetensors(hf_golden(dir + "/expected.safetensors"))) e.t.emplace(t.name, std::move(t));
  return e;
}

// Where loom's values and transformers' differ most, relative to the range of transformers'.
struct Diff {
  double max_abs = 0, range = 0;
};
Diff compare(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  Diff d;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    d.max_abs = std::max(d.max_abs, std::abs(double(got[i]) - double(want[i])));
    d.range = std::max(d.range, std::abs(double(want[i])));
  }
  return d;
}

// A configuration that starts from the fixture, for its [2, 8] batch; sgd with learning rate 0
// so a step leaves the parameters and the gradients can be read.
Config fixture_config(const std::string& dir, const std::string& device = "cpu") {
  return default_config({"model.init_from=" + dir, "device=" + device, "data.kind=random_tokens", "data.batch_size=2",
                         "data.seq_len=8", "data.vocab_size=2", "optimizer.name=sgd", "optimizer.learning_rate=0"});
}

Batch fixture_batch(const Expected& e) {
  Batch b;
  b.batch_size = 2;
  const std::vector<int32_t> in = e.ids("inputs");
  b.inputs.resize(in.size() * 4);
  std::memcpy(b.inputs.data(), in.data(), b.inputs.size());
  b.labels = e.ids("labels");
  return b;
}

// The evaluation program's logits [2, 8, V] and mean loss on the fixture's batch.
std::pair<std::vector<float>, double> forward(const Config& c, const Expected& e) {
  auto be = make_backend(c.device);
  nn::ModelGraph m = nn::build_model(c.model, model_input(c, 2), /*train=*/false);
  m.graph.mark_output(m.output);
  std::unique_ptr<Executor> ex;
  const Status st = Executor::create(*be, m.graph, plan_program(*be, m.graph, default_schedule(m.graph)), &ex);
  EXPECT_TRUE(st.is_ok()) << st.message();
  if (!st.is_ok()) return {};
  ModelSource(c.model.init_from).load_params(*ex);
  for (const auto& [v, bytes] : m.constants) ex->upload(v, bytes.data());
  const Batch b = fixture_batch(e);
  ex->upload(m.inputs, b.inputs.data());
  ex->upload(m.labels, b.labels.data());
  ex->run(RunCtx{c.seed, 0, 0});
  std::vector<float> logits(static_cast<size_t>(m.graph.value(m.output).shape.numel()));
  ex->download(m.output, logits.data());
  float loss_sum = 0;
  ex->download(m.loss_sum, &loss_sum);
  return {logits, loss_sum / static_cast<double>(m.examples)};
}

void expect_logits_match(const std::vector<float>& got, const Expected& e, const std::string& what) {
  const Diff d = compare(got, e.f32("logits"));
  EXPECT_LE(d.max_abs, 1e-4) << what;
  EXPECT_LE(d.max_abs, 1e-5 * d.range) << what << ": max abs diff " << d.max_abs << " of range " << d.range;
}

TEST(HfGpt2, ConfigMapsOntoTheGpt2Variant) {
  const Config c = fixture_config(hf_golden("gpt2"));
  EXPECT_EQ(c.model.kind, ModelKind::transformer);
  EXPECT_EQ(c.model.transformer.block_order, BlockOrder::attn_first);
  EXPECT_EQ(c.model.hidden_size, 32);
  EXPECT_EQ(c.model.transformer.head_dim, 8);
  EXPECT_EQ(c.model.transformer.num_layers, 2);
  EXPECT_EQ(c.model.transformer.mlp_expansion, 4);
  EXPECT_EQ(c.model.transformer.mlp, MlpKind::gelu_tanh);  // gelu_new
  EXPECT_EQ(c.model.transformer.vocab_size, 320);
  EXPECT_EQ(c.model.transformer.num_outputs, 320);
  EXPECT_EQ(c.model.transformer.max_seq_len, 64);
  EXPECT_EQ(c.model.layer_norm_eps, 1e-5);
  EXPECT_TRUE(c.model.transformer.use_bias && c.model.transformer.tie_embeddings && c.model.transformer.causal_mask &&
              c.model.transformer.embed_dropout);
}

TEST(HfLlama, ConfigMapsOntoTheLlamaVariant) {
  for (const bool tied : {true, false}) {
    const Config c = fixture_config(hf_golden(tied ? "llama_tied" : "llama_untied"));
    EXPECT_EQ(c.model.kind, ModelKind::transformer);
    EXPECT_EQ(c.model.transformer.block_order, BlockOrder::attn_first);
    EXPECT_EQ(c.model.transformer.norm, NormKind::rmsnorm);
    EXPECT_EQ(c.model.transformer.mlp, MlpKind::swiglu);
    EXPECT_EQ(c.model.transformer.position, PositionKind::rope);
    EXPECT_EQ(c.model.transformer.rope_theta, 10000.0);
    EXPECT_EQ(c.model.hidden_size, 32);
    EXPECT_EQ(c.model.transformer.head_dim, 8);
    EXPECT_EQ(c.model.transformer.num_kv_heads, 2);
    EXPECT_EQ(c.model.transformer.intermediate_size, 64);
    EXPECT_EQ(c.model.transformer.num_layers, 2);
    EXPECT_EQ(c.model.transformer.vocab_size, 321);
    EXPECT_EQ(c.model.transformer.num_outputs, 321);
    EXPECT_EQ(c.model.transformer.max_seq_len, 64);
    EXPECT_EQ(c.model.layer_norm_eps, 1e-6);
    EXPECT_EQ(c.model.transformer.tie_embeddings, tied);
    EXPECT_FALSE(c.model.transformer.use_bias || c.model.transformer.embed_dropout);
    EXPECT_TRUE(c.model.transformer.causal_mask);
  }
}

// One training step's loss, and loom's gradients (in transformers' names and layouts) of the six
// parameters the fixture holds, against transformers'.
void expect_gradients_match(const Config& c, const Expected& e) {
  auto be = make_backend(c.device);
  Trainer t(c, *be);
  ModelSource(c.model.init_from).load_params(t.executor());
  const StepReport r = t.step(fixture_batch(e));
  EXPECT_NEAR(r.metrics.loss.mean(), e.f32("loss")[0], 1e-5);
  // loom's gradients by path, in transformers' names and layouts.
  std::vector<StTensor> grads = export_params(t.executor(), /*scan_layers=*/false, /*grads=*/true);
  std::map<std::string, const StTensor*> by_path;
  for (const StTensor& g : grads) by_path[g.name] = &g;
  int compared = 0;
  for (const StTensor& g : loom_to_hf(c.model, by_path)) {
    if (!e.t.count("grad/" + g.name)) continue;
    std::vector<float> got(static_cast<size_t>(g.shape.numel()));
    std::memcpy(got.data(), g.bytes.data(), g.bytes.size());
    const Diff d = compare(got, e.f32("grad/" + g.name));
    EXPECT_LE(d.max_abs, 1e-5 * d.range) << g.name << " range " << d.range;
    ++compared;
  }
  EXPECT_EQ(compared, 6);
}

// Each fixture directory.
class HfImport : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Fixtures, HfImport,
                         ::testing::Values("gpt2", "llama_tied", "llama_untied", "llama3", "qwen2_tied", "qwen2_untied",
                                           "mistral", "qwen3", "gemma3"));

TEST_P(HfImport, LogitsAndLossEqualTransformers) {
  const Expected e = expected(GetParam());
  for (const char* device : {"cpu", "reference"}) {
    const auto [logits, loss] = forward(fixture_config(hf_golden(GetParam()), device), e);
    expect_logits_match(logits, e, device);
    EXPECT_NEAR(loss, e.f32("loss")[0], 1e-5) << device;
  }
}

TEST_P(HfImport, TrainingLossAndGradientsEqualTransformers) {
  const Expected e = expected(GetParam());
  for (const char* device : {"cpu", "reference"}) {
    SCOPED_TRACE(device);
    expect_gradients_match(fixture_config(hf_golden(GetParam()), device), e);
  }
}

TEST_P(HfImport, SamplerLogitsEqualTransformers) {
  // `loom sample DIR` decodes one token at a time with the KV cache: position p's logits are the
  // full-sequence logits at p.
  const Expected e = expected(GetParam());
  const ModelSource src(hf_golden(GetParam()));
  auto be = make_backend(Device::cpu);
  Sampler s(src.config(), *be);
  src.load_params(s.executor());
  const std::vector<int32_t> in = e.ids("inputs");
  std::vector<float> logits;
  for (int b = 0; b < 2; ++b) {
    s.reset();
    for (int p = 0; p < 8; ++p) {
      const std::span<const float> l = s.feed(in[static_cast<size_t>(b * 8 + p)]);
      logits.insert(logits.end(), l.begin(), l.end());
    }
  }
  expect_logits_match(logits, e, "sampler");
  ASSERT_NE(src.tokenizer(), nullptr);
  EXPECT_EQ(src.tokenizer()->kind(), TokenizerKind::hf);
}

// The fixtures of the families after Llama: transformers' greedy continuation (32 tokens after
// inputs[0], the first maximum of a full forward pass per token) is loom's, on both backends:
// the prompt through the prefill program, then token by token through the KV-cached decoder.
class HfGreedy : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Fixtures, HfGreedy,
                         ::testing::Values("llama3", "qwen2_tied", "qwen2_untied", "mistral", "gemma3"));

TEST_P(HfGreedy, ContinuationEqualsTransformers) {
  const Expected e = expected(GetParam());
  const ModelSource src(hf_golden(GetParam()));
  const std::vector<int32_t> in = e.ids("inputs"), want = e.ids("greedy");
  ASSERT_EQ(want.size(), 32u);
  for (Device dev : {Device::cpu, Device::reference}) {
    auto be = make_backend(dev);
    Sampler s(src.config(), *be);
    src.load_params(s.executor());
    std::span<const float> l = s.prefill(std::span<const int32_t>(in.data(), 8));
    std::vector<int32_t> got;
    while (got.size() < want.size()) {
      got.push_back(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
      l = s.feed(got.back());
    }
    EXPECT_EQ(got, want) << GetParam() << " on " << be->name();
  }
}

TEST(HfFamilies, ConfigsMapOntoTheirVariants) {
  Config c = fixture_config(hf_golden("llama3"));
  EXPECT_EQ(c.model.transformer.rope_scaling, RopeScaling::llama3);
  EXPECT_EQ(c.model.transformer.rope_factor, 8.0);
  EXPECT_EQ(c.model.transformer.rope_low_freq_factor, 1.0);
  EXPECT_EQ(c.model.transformer.rope_high_freq_factor, 4.0);
  EXPECT_EQ(c.model.transformer.rope_original_max_position, 64);
  EXPECT_EQ(c.model.transformer.max_seq_len, 128);
  EXPECT_FALSE(c.model.transformer.qkv_bias);
  for (const bool tied : {true, false}) {
    c = fixture_config(hf_golden(tied ? "qwen2_tied" : "qwen2_untied"));
    EXPECT_TRUE(c.model.transformer.qkv_bias);
    EXPECT_FALSE(c.model.transformer.use_bias);
    EXPECT_EQ(c.model.transformer.tie_embeddings, tied);
    EXPECT_EQ(c.model.transformer.rope_theta, 1e6);
    EXPECT_EQ(c.model.transformer.rope_scaling, RopeScaling::none);
    EXPECT_EQ(c.model.transformer.sliding_window, 0);
    EXPECT_EQ(c.model.transformer.vocab_size, 320);
  }
  c = fixture_config(hf_golden("mistral"));
  EXPECT_EQ(c.model.transformer.sliding_window, 4);
  EXPECT_EQ(c.model.transformer.num_kv_heads, 2);
  EXPECT_FALSE(c.model.transformer.qkv_bias || c.model.transformer.use_bias);
  // The window fixes the key; a configuration may not contradict it.
  const std::string m = user_error([] {
    default_config({"model.init_from=" + hf_golden("mistral"), "model.sliding_window=8", "data.kind=random_tokens"});
  });
  EXPECT_NE(m.find("model.sliding_window: is 8, but the model of model.init_from has sliding_window = 4"),
            std::string::npos)
      << m;
}

// transformers 4.x's spelling of Llama 3.1's config (a top-level rope_theta and rope_scaling with
// "type") gives the same model.
TEST(HfFamilies, ReadsTransformers4Llama3Configs) {
  TempDir d;
  nlohmann::json config = nlohmann::json::parse(read_file(hf_golden("llama3/config.json")));
  nlohmann::json rope = config["rope_parameters"];
  config.erase("rope_parameters");
  config["rope_theta"] = rope["rope_theta"];
  rope.erase("rope_theta");
  rope["type"] = rope["rope_type"];
  rope.erase("rope_type");
  config["rope_scaling"] = rope;
  write_file(d.path("config.json"), config.dump());
  fs::copy_file(hf_golden("llama3/model.safetensors"), d.path("model.safetensors"));
  const Expected e = expected("llama3");
  const auto [logits, loss] = forward(fixture_config(d.path()), e);
  expect_logits_match(logits, e, "transformers 4.x llama3 config");
}

// The fixture rewritten: bfloat16 or float16 values, two shards with an index, GPT2Model names
// (no "transformer."), the causal-mask buffers of older files and a tied lm_head.weight.
void write_variant(const std::string& dir, DType dt) {
  fs::copy_file(hf_golden("gpt2/config.json"), fs::path(dir) / "config.json");
  std::vector<StTensor> shards[2];
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  int k = 0;
  for (const StTensor& t : read_safetensors(hf_golden("gpt2/model.safetensors"))) {
    StTensor c{t.name.substr(std::string("transformer.").size()), dt, t.shape,
               std::vector<unsigned char>(static_cast<size_t>(t.shape.numel()) * dtype_size(dt))};
    for (int64_t i = 0; i < t.shape.numel(); ++i)
      store_from_f32(c.bytes.data(), dt, static_cast<size_t>(i), load_as_f32(t.bytes.data(), DType::f32, i));
    if (c.name == "wte.weight") {
      StTensor head = c;
      head.name = "lm_head.weight";
      shards[1].push_back(std::move(head));
    }
    shards[k % 2].push_back(std::move(c));
    ++k;
  }
  for (int l = 0; l < 2; ++l)
    shards[l].push_back(StTensor{"h." + std::to_string(l) + ".attn.bias", DType::f32, Shape{1, 1, 4, 4},
                                 std::vector<unsigned char>(64, 0)});
  for (int s = 0; s < 2; ++s) {
    const std::string file = "model-0000" + std::to_string(s + 1) + "-of-00002.safetensors";
    for (const StTensor& t : shards[s]) index["weight_map"][t.name] = file;
    write_safetensors((fs::path(dir) / file).string(), shards[s]);
  }
  write_file((fs::path(dir) / "model.safetensors.index.json").string(), index.dump());
}

TEST(HfGpt2, ReadsHalfPrecisionShardsAndOldNames) {
  const Config c = fixture_config(hf_golden("gpt2"));
  auto be = make_backend(Device::cpu);
  for (DType dt : {DType::bf16, DType::f16}) {
    TempDir d;
    write_variant(d.path(), dt);
    Trainer t(c, *be);
    ModelSource(d.path()).load_params(t.executor());
    // Every parameter is the fixture's value rounded to `dt` and widened back, exactly.
    const std::vector<StTensor> want = hf_to_loom(c.model, read_safetensors(hf_golden("gpt2/model.safetensors")), "");
    for (const StTensor& w : want) {
      const std::vector<float> got = t.param(w.name);
      const auto* f = reinterpret_cast<const float*>(w.bytes.data());
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], round_to(dt, f[i])) << w.name << "[" << i << "]";
    }
  }
}

// The message loading a copy of fixture `dir` edited by `edit` gives.
template <class Edit>
std::string import_error(Edit&& edit, const std::string& dir = "gpt2") {
  TempDir d;
  nlohmann::json config = nlohmann::json::parse(read_file(hf_golden(dir + "/config.json")));
  std::vector<StTensor> tensors = read_safetensors(hf_golden(dir + "/model.safetensors"));
  edit(config, tensors);
  write_file(d.path("config.json"), config.dump());
  write_safetensors(d.path("model.safetensors"), tensors);
  return user_error([&] {
    const ModelSource src(d.path());
    auto be = make_backend(Device::cpu);
    Sampler s(src.config(), *be);
    src.load_params(s.executor());
  });
}

StTensor& tensor(std::vector<StTensor>& ts, const std::string& name) {
  for (StTensor& t : ts)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

// activation_function "gelu" is the exact GELU: model.mlp = gelu, fixed like the other
// architecture keys; an export of such a model says "gelu" again.
TEST(HfGpt2, ExactGeluActivationMapsOntoMlpGelu) {
  TempDir d;
  nlohmann::json config = nlohmann::json::parse(read_file(hf_golden("gpt2/config.json")));
  config["activation_function"] = "gelu";
  write_file(d.path("config.json"), config.dump());
  const HfConfig hc = read_hf_config(d.path());
  EXPECT_EQ(hc.model.transformer.mlp, MlpKind::gelu);
  const auto key = std::find_if(hc.keys.begin(), hc.keys.end(), [](const ArchKey& k) { return k.key == "model.mlp"; });
  ASSERT_NE(key, hc.keys.end());
  EXPECT_TRUE(key->fixed);
  EXPECT_EQ(key->origin, "activation_function = \"gelu\"");
  EXPECT_EQ(hf_config_json(hc.model)["activation_function"], "gelu");  // and back
}

TEST(HfGpt2, RefusesTensorsThatDoNotFit) {
  using J = nlohmann::json;
  using Ts = std::vector<StTensor>;
  std::string m = import_error([](J&, Ts& ts) {
    ts.erase(
        std::find_if(ts.begin(), ts.end(), [](const StTensor& t) { return t.name == "transformer.h.1.ln_2.bias"; }));
  });
  EXPECT_NE(m.find("model.safetensors"), std::string::npos) << m;
  EXPECT_NE(m.find("tensor 'transformer.h.1.ln_2.bias' is missing"), std::string::npos) << m;
  m = import_error([](J&, Ts& ts) {
    StTensor extra = tensor(ts, "transformer.h.1.ln_2.bias");
    extra.name = "transformer.h.2.ln_2.bias";
    ts.push_back(extra);
  });
  EXPECT_NE(m.find("'transformer.h.2.ln_2.bias' is not a parameter of GPT2LMHeadModel"), std::string::npos) << m;
  m = import_error([](J&, Ts& ts) {
    StTensor& t = tensor(ts, "transformer.h.0.mlp.c_fc.weight");
    t.shape = Shape{128, 32};
  });
  EXPECT_NE(m.find("'transformer.h.0.mlp.c_fc.weight' is [128, 32]"), std::string::npos) << m;
  EXPECT_NE(m.find("[32, 128]"), std::string::npos) << m;
  m = import_error([](J&, Ts& ts) { tensor(ts, "transformer.ln_f.bias").dtype = DType::i32; });
  EXPECT_NE(m.find("'transformer.ln_f.bias' is int32"), std::string::npos) << m;
  m = import_error([](J&, Ts& ts) {
    StTensor head = tensor(ts, "transformer.wte.weight");
    head.name = "lm_head.weight";
    head.bytes[5] ^= 1;
    ts.push_back(head);
  });
  EXPECT_NE(m.find("'lm_head.weight' differs"), std::string::npos) << m;
}

TEST(HfGpt2, RefusesArchitecturesAndOptionsItCannotRun) {
  using J = nlohmann::json;
  using Ts = std::vector<StTensor>;
  std::string m = import_error([](J& c, Ts&) { c["activation_function"] = "relu"; });
  EXPECT_NE(m.find("config.json: \"activation_function\" is \"relu\""), std::string::npos) << m;
  m = import_error([](J& c, Ts&) { c["tie_word_embeddings"] = false; });
  EXPECT_NE(m.find("\"tie_word_embeddings\" is false"), std::string::npos) << m;
  m = import_error([](J& c, Ts&) { c["scale_attn_by_inverse_layer_idx"] = true; });
  EXPECT_NE(m.find("scale_attn_by_inverse_layer_idx"), std::string::npos) << m;
  m = import_error([](J& c, Ts&) { c["n_head"] = 5; });
  EXPECT_NE(m.find("\"n_head\""), std::string::npos) << m;
  m = import_error([](J& c, Ts&) { c["model_type"] = "gpt_neox"; });
  EXPECT_NE(m.find("GPT2LMHeadModel is not an architecture loom can run"), std::string::npos) << m;
  m = user_error([] { ModelSource src("/nonexistent/model"); });
  EXPECT_NE(m.find("/nonexistent/model: does not exist"), std::string::npos) << m;
}

TEST(HfLlama, RefusesOptionsItCannotRun) {
  using J = nlohmann::json;
  using Ts = std::vector<StTensor>;
  const auto llama = [](auto edit) { return import_error(edit, "llama_untied"); };
  std::string m = llama([](J& c, Ts&) { c["hidden_act"] = "gelu"; });
  EXPECT_NE(m.find("config.json: \"hidden_act\" is \"gelu\""), std::string::npos) << m;
  m = llama([](J& c, Ts&) { c["attention_bias"] = true; });
  EXPECT_NE(m.find("\"attention_bias\" is true"), std::string::npos) << m;
  m = llama([](J& c, Ts&) { c["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "yarn"}}; });
  EXPECT_NE(m.find("\"rope_parameters.rope_type\" is \"yarn\"; loom runs the rope types \"default\" and "
                   "\"llama3\""),
            std::string::npos)
      << m;
  m = llama([](J& c, Ts&) {  // transformers 4.x's spelling
    c.erase("rope_parameters");
    c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  });
  EXPECT_NE(m.find("\"rope_scaling.rope_type\" is \"linear\""), std::string::npos) << m;
  m = llama([](J& c, Ts&) {  // a stale 4.x block beside 5's: transformers 5 applies it
    c["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 8.0}};
  });
  EXPECT_NE(m.find("\"rope_scaling.rope_type\" is \"dynamic\""), std::string::npos) << m;
  m = llama([](J& c, Ts&) { c["num_key_value_heads"] = 3; });
  EXPECT_NE(m.find("\"num_key_value_heads\" does not divide"), std::string::npos) << m;
  // head_dim may differ from hidden_size / heads (q_proj is then heads·head_dim wide), so the
  // fixture's q_proj is misshapen for it.
  m = llama([](J& c, Ts&) { c["head_dim"] = 16; });
  EXPECT_NE(m.find("'model.layers.0.self_attn.q_proj.weight' is [32, 32]; config.json's model needs [64, 32]"),
            std::string::npos)
      << m;
  m = llama([](J& c, Ts&) {
    c["model_type"] = "smollm3";
    c["architectures"] = {"SmolLM3ForCausalLM"};
  });
  EXPECT_NE(m.find("SmolLM3ForCausalLM skips rotary embeddings in the layers its \"no_rope_layers\" names"),
            std::string::npos)
      << m;
  // Tensors: the untied head is required, misshapen q/k/v are named.
  m = llama([](J&, Ts& ts) {
    ts.erase(std::find_if(ts.begin(), ts.end(), [](const StTensor& t) { return t.name == "lm_head.weight"; }));
  });
  EXPECT_NE(m.find("tensor 'lm_head.weight' is missing"), std::string::npos) << m;
  m = llama([](J&, Ts& ts) { tensor(ts, "model.layers.1.self_attn.k_proj.weight").shape = Shape{32, 16}; });
  EXPECT_NE(m.find("'model.layers.1.self_attn.k_proj.weight' is [32, 16]; config.json's model needs [16, 32]"),
            std::string::npos)
      << m;
}

TEST(HfFamilies, RefusesWhatTheyCannotRun) {
  using J = nlohmann::json;
  using Ts = std::vector<StTensor>;
  std::string m = import_error([](J& c, Ts&) { c["use_sliding_window"] = true; }, "qwen2_untied");
  EXPECT_NE(m.find("config.json: \"use_sliding_window\" is true"), std::string::npos) << m;
  EXPECT_NE(m.find("use_sliding_window = false"), std::string::npos) << m;
  m = import_error([](J& c, Ts&) { c["layer_types"][1] = "sliding_attention"; }, "qwen2_untied");
  EXPECT_NE(m.find("\"layer_types\" has \"sliding_attention\""), std::string::npos) << m;
  m = import_error(
      [](J&, Ts& ts) {
        ts.erase(std::find_if(ts.begin(), ts.end(),
                              [](const StTensor& t) { return t.name == "model.layers.0.self_attn.k_proj.bias"; }));
      },
      "qwen2_untied");
  EXPECT_NE(m.find("tensor 'model.layers.0.self_attn.k_proj.bias' is missing"), std::string::npos) << m;
  m = import_error([](J& c, Ts&) { c["rope_parameters"].erase("low_freq_factor"); }, "llama3");
  EXPECT_NE(m.find("\"rope_parameters.low_freq_factor\" is missing"), std::string::npos) << m;
  m = import_error([](J& c, Ts&) { c["rope_parameters"]["high_freq_factor"] = 0.5; }, "llama3");
  EXPECT_NE(m.find("\"rope_parameters.high_freq_factor\" is not above low_freq_factor"), std::string::npos) << m;
}

TEST(HfQwen3, ConfigMapsOntoLlamaWithQkNormAndWiderHeads) {
  const Config c = fixture_config(hf_golden("qwen3"));
  EXPECT_EQ(c.model.transformer.norm, NormKind::rmsnorm);
  EXPECT_EQ(c.model.transformer.mlp, MlpKind::swiglu);
  EXPECT_EQ(c.model.transformer.position, PositionKind::rope);
  EXPECT_TRUE(c.model.transformer.qk_norm);
  EXPECT_EQ(c.model.hidden_size, 32);
  EXPECT_EQ(c.model.transformer.num_heads, 4);
  EXPECT_EQ(c.model.transformer.head_dim, 16);  // 4 heads × 16 = 64 ≠ hidden 32
  EXPECT_EQ(c.model.transformer.num_kv_heads, 2);
  EXPECT_TRUE(c.model.transformer.tie_embeddings);
  EXPECT_FALSE(c.model.transformer.use_bias);
}

// transformers' greedy continuation of the fixture's prompt (model.generate, do_sample=False),
// 32 tokens, through the sampler's prefill and one-token programs; argmax, first maximum wins.
TEST(HfQwen3, GreedyContinuationEqualsTransformers) {
  const Expected e = expected("qwen3");
  const ModelSource src(hf_golden("qwen3"));
  for (const Device device : {Device::cpu, Device::reference}) {
    auto be = make_backend(device);
    Sampler s(src.config(), *be);
    src.load_params(s.executor());
    const std::vector<int32_t> prompt = e.ids("greedy/prompt"), want = e.ids("greedy/tokens");
    std::vector<int32_t> got;
    std::span<const float> logits = s.prefill(prompt);
    while (got.size() < want.size()) {
      got.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      logits = s.feed(got.back());
    }
    EXPECT_EQ(got, want) << be->name();
  }
}

TEST(HfQwen3, RefusesOptionsItCannotRun) {
  using J = nlohmann::json;
  using Ts = std::vector<StTensor>;
  const auto qwen3 = [](auto edit) { return import_error(edit, "qwen3"); };
  std::string m = qwen3([](J& c, Ts&) { c["attention_bias"] = true; });
  EXPECT_NE(m.find("\"attention_bias\" is true; loom's Qwen3 layers have no biases"), std::string::npos) << m;
  m = qwen3([](J& c, Ts&) { c["use_sliding_window"] = true; });
  EXPECT_NE(m.find("\"use_sliding_window\" is true"), std::string::npos) << m;
  m = qwen3([](J& c, Ts&) { c["layer_types"][1] = "sliding_attention"; });
  EXPECT_NE(m.find("\"layer_types\" has \"sliding_attention\""), std::string::npos) << m;
  m = qwen3([](J&, Ts& ts) {
    ts.erase(std::find_if(ts.begin(), ts.end(),
                          [](const StTensor& t) { return t.name == "model.layers.1.self_attn.k_norm.weight"; }));
  });
  EXPECT_NE(m.find("tensor 'model.layers.1.self_attn.k_norm.weight' is missing"), std::string::npos) << m;
}

// A config.json that lacks a key the architecture reads takes its config class's default, as
// transformers does; where the tensors contradict that default, the message names config.json and
// the missing key (with the default it was read as) after the tensor, which stays named first: a
// file cut short shows the same way.
TEST(HfFamilies, AMissingKeyWhoseDefaultContradictsTheTensorsIsNamed) {
  using J = nlohmann::json;
  using Ts = std::vector<StTensor>;
  struct Case {
    std::string dir, key, expect, tensor;
  };
  const std::vector<Case> cases = {
      {"qwen3", "hidden_size", "hidden_size = 4096", "tensor 'model.embed_tokens.weight' is [320, 32]"},
      {"qwen3", "head_dim", "head_dim = 128", "tensor 'model.layers.0.self_attn.q_proj.weight' is [64, 32]"},
      {"gpt2", "n_layer", "n_layer = 12", "tensor 'transformer.h.2."},
  };
  for (const Case& c : cases) {
    const std::string m = import_error([&](J& config, Ts&) { config.erase(c.key); }, c.dir);
    const size_t lacks = m.find("config.json lacks \"" + c.key + "\", read as ");
    EXPECT_NE(lacks, std::string::npos) << m;
    EXPECT_NE(m.find(c.expect + ")"), std::string::npos) << m;
    EXPECT_LT(m.find(c.tensor), lacks) << m;
  }
}

TEST(HfGemma3, ConfigMapsOntoTheGemmaVariant) {
  const Config c = fixture_config(hf_golden("gemma3"));
  EXPECT_EQ(c.model.transformer.norm, NormKind::gemma_rmsnorm);
  EXPECT_EQ(c.model.transformer.mlp, MlpKind::geglu);
  EXPECT_TRUE(c.model.transformer.post_norms && c.model.transformer.qk_norm && c.model.transformer.scale_embeddings &&
              c.model.transformer.tie_embeddings);
  EXPECT_EQ(c.model.transformer.num_layers, 3);
  EXPECT_EQ(c.model.transformer.head_dim, 16);
  EXPECT_EQ(c.model.transformer.query_pre_attn_scalar, 12.0);
  EXPECT_EQ(c.model.transformer.sliding_window, 4);
  EXPECT_EQ(c.model.transformer.sliding_window_pattern, 2);
  EXPECT_EQ(c.model.transformer.rope_theta, 1e6);
  EXPECT_EQ(c.model.transformer.rope_local_theta, 1e4);
  // Layers 0 and 2 local (the window, base 1e4), layer 1 global.
  for (int64_t l : {0, 2}) {
    EXPECT_EQ(nn::layer_attention(c.model, l).window, 4);
    EXPECT_EQ(nn::layer_attention(c.model, l).rope_theta, 1e4);
  }
  EXPECT_EQ(nn::layer_attention(c.model, 1).window, 0);
  EXPECT_EQ(nn::layer_attention(c.model, 1).rope_theta, 1e6);
}

// transformers 4.x's spelling (sliding_window_pattern, rope_theta and rope_local_base_freq, no
// layer_types or rope_parameters; gemma-3-1b's config.json) gives the same model, bases aside.
TEST(HfGemma3, ReadsTransformers4Configs) {
  TempDir d;
  nlohmann::json config = nlohmann::json::parse(read_file(hf_golden("gemma3/config.json")));
  config.erase("layer_types");
  config.erase("rope_parameters");
  config["rope_theta"] = 5e5;  // not the defaults, to be read
  config["rope_local_base_freq"] = 2e4;
  config["rope_scaling"] = nullptr;
  write_file(d.path("config.json"), config.dump());
  for (const char* f : {"model.safetensors", "tokenizer.json"})
    fs::copy_file(hf_golden(std::string("gemma3/") + f), d.path(f));
  Config old = fixture_config(d.path()), now = fixture_config(hf_golden("gemma3"));
  EXPECT_EQ(old.model.transformer.rope_theta, 5e5);
  EXPECT_EQ(old.model.transformer.rope_local_theta, 2e4);
  EXPECT_EQ(old.model.transformer.sliding_window_pattern, 2);  // sliding_window_pattern, not the default 6
  old.model.init_from = now.model.init_from = "";
  now.model.transformer.rope_theta = 5e5;
  now.model.transformer.rope_local_theta = 2e4;
  EXPECT_EQ(config_to_toml(old), config_to_toml(now));
}

TEST(HfGemma3, RefusesOptionsItCannotRun) {
  using J = nlohmann::json;
  using Ts = std::vector<StTensor>;
  const auto gemma = [](auto edit) { return import_error(edit, "gemma3"); };
  std::string m = gemma([](J& c, Ts&) { c["final_logit_softcapping"] = 30.0; });
  EXPECT_NE(m.find("\"final_logit_softcapping\" is not null"), std::string::npos) << m;
  m = gemma([](J& c, Ts&) { c["attn_logit_softcapping"] = 50.0; });
  EXPECT_NE(m.find("\"attn_logit_softcapping\" is not null"), std::string::npos) << m;
  m = gemma([](J& c, Ts&) { c["rope_parameters"]["full_attention"] = {{"rope_type", "linear"}, {"factor", 8.0}}; });
  EXPECT_NE(m.find("\"rope_parameters.full_attention.rope_type\" is \"linear\""), std::string::npos) << m;
  m = gemma([](J& c, Ts&) { c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}}; });
  EXPECT_NE(m.find("\"rope_scaling\" is"), std::string::npos) << m;
  m = gemma([](J& c, Ts&) { c["layer_types"][2] = "full_attention"; });
  EXPECT_NE(m.find("\"layer_types\" has \"full_attention\" at layer 2"), std::string::npos) << m;
  m = gemma([](J& c, Ts&) { c["hidden_activation"] = "gelu"; });
  EXPECT_NE(m.find("\"hidden_activation\" is \"gelu\""), std::string::npos) << m;
  m = gemma([](J& c, Ts&) { c["use_bidirectional_attention"] = true; });
  EXPECT_NE(m.find("\"use_bidirectional_attention\" is true"), std::string::npos) << m;
  m = gemma([](J&, Ts& ts) {
    ts.erase(std::find_if(ts.begin(), ts.end(), [](const StTensor& t) {
      return t.name == "model.layers.2.post_feedforward_layernorm.weight";
    }));
  });
  EXPECT_NE(m.find("tensor 'model.layers.2.post_feedforward_layernorm.weight' is missing"), std::string::npos) << m;
}

TEST(HfLlama, ReadsTransformers4ConfigsAndOldBuffers) {
  // rope_theta at the top level (transformers 4.x) and rotary inverse frequencies saved with the
  // weights (older Llama files) give the same model.
  TempDir d;
  nlohmann::json config = nlohmann::json::parse(read_file(hf_golden("llama_tied/config.json")));
  config.erase("rope_parameters");
  config["rope_theta"] = 10000.0;
  config["rope_scaling"] = nullptr;
  write_file(d.path("config.json"), config.dump());
  std::vector<StTensor> ts = read_safetensors(hf_golden("llama_tied/model.safetensors"));
  ts.push_back(StTensor{"model.layers.0.self_attn.rotary_emb.inv_freq", DType::f32, Shape{4},
                        std::vector<unsigned char>(16, 0)});
  write_safetensors(d.path("model.safetensors"), ts);
  const Expected e = expected("llama_tied");
  const auto [logits, loss] = forward(fixture_config(d.path()), e);
  expect_logits_match(logits, e, "transformers 4.x config");
}

TEST(HfGpt2, AConfigMayNotContradictTheCheckpoint) {
  // fixture, a key the configuration sets, what the message must say
  for (const auto& [fixture, key, says] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"gpt2", "model.hidden_size=64",
            "model.hidden_size: is 64, but the model of model.init_from has n_embd = 32"},
           {"gpt2", "model.layer_norm_eps=1e-6", "layer_norm_epsilon = 1e-05"},
           {"gpt2", "model.norm=rmsnorm",
            "model.norm: is \"rmsnorm\", but the model of model.init_from has GPT2LMHeadModel (LayerNorm)"},
           {"gpt2", "model.position=rope",
            "model.position: is \"rope\", but the model of model.init_from has GPT2LMHeadModel (learned wpe)"},
           {"llama_tied", "model.num_kv_heads=4",
            "model.num_kv_heads: is 4, but the model of model.init_from has num_key_value_heads = 2"},
           {"llama_tied", "model.rope_theta=500000", "rope_theta = 10000"},
           {"llama_tied", "model.mlp_expansion=8",
            "model.mlp_expansion: is 8, which would go unused: the model of model.init_from sets the MLP's width"},
       }) {
    const std::string m = user_error([&] {
      default_config({"model.init_from=" + hf_golden(fixture), key, "data.kind=random_tokens"});
    });
    EXPECT_NE(m.find(says), std::string::npos) << m;
  }
  // Keys it does not fix may be set; the ones it fixes may be repeated.
  const Config c =
      default_config({"model.init_from=" + hf_golden("gpt2"), "model.hidden_size=32", "model.embed_dropout=false",
                      "model.dropout_rate=0.1", "data.kind=random_tokens", "data.vocab_size=300", "data.seq_len=64"});
  EXPECT_FALSE(c.model.transformer.embed_dropout);
  EXPECT_EQ(c.model.dropout_rate, 0.1);
}

TEST(InitFrom, ALoomRunGivesItsParametersAndArchitecture) {
  // A loom run trained a few steps, then a new configuration that starts from it.
  TempDir d;
  const Config a =
      default_config({"model.kind=transformer", "model.block_order=attn_first", "model.hidden_size=16",
                      "model.head_dim=8", "model.num_layers=1", "model.vocab_size=12", "model.num_outputs=12",
                      "model.max_seq_len=8", "model.scan_layers=true", "data.kind=random_tokens", "data.vocab_size=12",
                      "data.seq_len=8", "data.batch_size=2", "optimizer.learning_rate=0.1"});
  auto be = make_backend(Device::cpu);
  Trainer ta(a, *be);
  const Batch b = make_batch(a.data, data_context(a));
  for (int i = 0; i < 3; ++i) ta.step(b);
  const CheckpointState st{.config_toml = config_to_toml(a), .step = 3};
  ASSERT_TRUE(save_checkpoint(ta, st, d.path("ckpt_000003")).saved);

  const Config c = default_config({"model.init_from=" + d.path(), "data.kind=random_tokens", "data.vocab_size=12",
                                   "data.seq_len=4", "optimizer.learning_rate=0.5"});
  EXPECT_EQ(c.model.hidden_size, 16);
  EXPECT_EQ(c.model.transformer.vocab_size, 12);
  EXPECT_FALSE(c.model.transformer.scan_layers);  // a file layout, not the architecture
  Trainer tc(c, *be);
  const ModelSource src(c.model.init_from);
  EXPECT_EQ(src.description(), "the loom checkpoint " + d.path("ckpt_000003"));
  src.load_params(tc.executor());
  for (const Param& p : tc.model().graph.params()) {
    const std::string& path = tc.model().graph.value(p.value).name;
    EXPECT_EQ(tc.param(path), ta.param(path)) << path;
  }
  EXPECT_EQ(tc.steps_done(), 0);  // optimizer and step start fresh
  const std::string m = user_error([&] {
    default_config({"model.init_from=" + d.path(), "model.num_layers=2", "data.vocab_size=12"});
  });
  EXPECT_NE(m.find("model.num_layers: is 2, but the model of model.init_from has"), std::string::npos) << m;
}

}  // namespace
}  // namespace loom
