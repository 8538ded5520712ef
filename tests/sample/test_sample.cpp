// KV-cached generation (sample/sample.h, nn::build_transformer_decoder, `loom sample`).
//
// A tiny transformer with random init (a Trainer initialises it) is run two ways: the training
// graph's forward over a whole sequence, and the one-token decoder fed the same tokens one at a
// time. Their logits must agree at every position (float32: 1e-5 of the logits' scale; the two
// differ only in f32 summation orders, sgemm over T rows vs one row and dot products). Then the
// sampler itself: the program is the same at every position, greedy decoding is deterministic
// and equals greedy decoding by full recomputation, seeds change samples at temperature > 0,
// the sliding window, the sampling rule, UTF-8 streaming, and the CLI end to end on a
// checkpoint written by save_checkpoint.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/reference/reference.h"
#include "core/error.h"
#include "data/data.h"
#include "data/tokenizer.h"
#include "graph/passes/narrow_params.h"
#include "graph/passes/plan.h"
#include "io/param_io.h"
#include "nn/init.h"
#include "nn/models/transformer/transformer.h"
#include "runtime/executor.h"
#include "sample/sample.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 20, kMaxLen = 16;

// The brief's tiny model: GPT-2 style (attn_first, tied embeddings, no biases) unless `variant`
// overrides it ("tutorial": mlp_first, untied, biases; "rmsnorm", "gelu", "swiglu": GPT-2 style with
// RMSNorm, the exact GELU, a SwiGLU MLP of width 40; "llama": GPT-2 style with RMSNorm, rotary
// positions (a small rope_theta for large angles) and grouped-query attention, 2 key/value heads
// for 4 query heads); "gemma": "llama" with Gemma's blocks, RMSNorm scaled by 1 + scale, a GeGLU
// MLP of width 40, post-branch norms and q/k norms, and 6 heads of 8 (q 48 wide on a width of 32)).
Config tiny_config(const std::string& variant = "gpt2", const std::string& dtype = "float32") {
  std::vector<std::string> ov = {"model.kind=transformer",  "model.hidden_size=32",
                                 "model.num_layers=2",      "model.head_dim=8",
                                 "model.vocab_size=20",     "model.num_outputs=20",
                                 "model.max_seq_len=16",    "model.mlp_expansion=4",
                                 "data.kind=random_tokens", "data.seq_len=16",
                                 "data.vocab_size=20",      "data.batch_size=2",
                                 "model.dtype=" + dtype,    "seed=7"};
  if (variant == "rmsnorm" || variant == "llama") ov.push_back("model.norm=rmsnorm");
  if (variant == "gemma")
    for (const char* o : {"model.norm=gemma_rmsnorm", "model.mlp=geglu", "model.intermediate_size=40",
                          "model.post_norms=true", "model.qk_norm=true", "model.num_heads=6"})
      ov.push_back(o);
  if (variant == "gelu") ov.push_back("model.mlp=gelu");
  if (variant == "swiglu")
    for (const char* o : {"model.mlp=swiglu", "model.intermediate_size=40"}) ov.push_back(o);
  if (variant == "llama" || variant == "gemma")
    for (const char* o : {"model.position=rope", "model.rope_theta=100", "model.num_kv_heads=2"}) ov.push_back(o);
  if (variant != "tutorial") {
    for (const char* o :
         {"model.block_order=attn_first", "model.tie_embeddings=true", "model.use_bias=false", "model.init=gpt2"})
      ov.push_back(o);
  }
  return default_config(ov);
}

// The training graph's forward (eval mode) for one sequence of kMaxLen tokens: logits [T, V].
class FullForward {
 public:
  FullForward(const Config& c, const Executor& params, Backend& be)
      : m_(nn::build_transformer(c.model, {.batch = 1, .seq_len = kMaxLen}, /*train=*/false)) {
    m_.graph.mark_output(m_.output);
    const Status st = Executor::create(be, m_.graph, plan_program(be, m_.graph, default_schedule(m_.graph)), &ex_);
    EXPECT_TRUE(st.is_ok()) << st.message();
    for (const auto& [v, bytes] : m_.constants) ex_->upload(v, bytes.data());
    const std::vector<StTensor> ts = export_params(params, false);
    std::map<std::string, const StTensor*> by_name;
    for (const StTensor& t : ts) by_name[t.name] = &t;
    import_params(*ex_, by_name, false, "test");
  }
  // Logits of every position for `tokens` (at most kMaxLen; the rest is padded with 0, which
  // causal attention keeps from the positions before it).
  std::vector<float> logits(const std::vector<int32_t>& tokens) {
    std::vector<int32_t> in(kMaxLen, 0), labels(kMaxLen, 0);
    std::copy(tokens.begin(), tokens.end(), in.begin());
    ex_->upload(m_.inputs, in.data());
    ex_->upload(m_.labels, labels.data());
    ex_->run(RunCtx{});
    // The training graph's logits are in the compute dtype (the loss widens them itself).
    const DType dt = m_.graph.value(m_.output).dtype;
    const auto n = static_cast<size_t>(kMaxLen * kVocab);
    std::vector<unsigned char> raw(n * dtype_size(dt));
    ex_->download(m_.output, raw.data());
    std::vector<float> out(n);
    convert(raw.data(), dt, out.data(), DType::f32, n);
    return out;
  }

 private:
  nn::ModelGraph m_;
  std::unique_ptr<Executor> ex_;
};

std::vector<int32_t> random_tokens(uint64_t seed, size_t n) {
  HostRng rng(rng_key(seed, 0, 0, 0));
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng.next_below(kVocab));
  return t;
}

// max |a − b| over a row, relative to the row's largest |b| (at least 1).
double row_error(std::span<const float> a, const float* b) {
  double err = 0, scale = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return err / scale;
}

void expect_decoder_matches(const Config& c, Backend& be, double tol) {
  Trainer tr(c, be);
  FullForward full(c, tr.executor(), be);
  Sampler s(c, be);
  s.copy_params_from(tr.executor());
  for (uint64_t seed : {1, 2}) {
    const std::vector<int32_t> seq = random_tokens(seed, kMaxLen);
    const std::vector<float> ref = full.logits(seq);
    s.reset();
    double worst = 0;
    for (int64_t t = 0; t < kMaxLen; ++t) {
      const std::span<const float> l = s.feed(seq[static_cast<size_t>(t)]);
      ASSERT_EQ(l.size(), static_cast<size_t>(kVocab));
      const double e = row_error(l, ref.data() + t * kVocab);
      worst = std::max(worst, e);
      EXPECT_LE(e, tol) << be.name() << " " << dtype_name(c.model.dtype) << " position " << t;
    }
    if (std::getenv("STATS")) std::printf("STAT %s %s worst %g\n", be.name(), dtype_name(c.model.dtype), worst);
  }
}

TEST(Decoder, LogitsMatchTrainingForwardF32) {
  CpuBackend cpu;
  expect_decoder_matches(tiny_config("gpt2"), cpu, 1e-5);
  expect_decoder_matches(tiny_config("tutorial"), cpu, 1e-5);
  expect_decoder_matches(tiny_config("rmsnorm"), cpu, 1e-5);
  expect_decoder_matches(tiny_config("gelu"), cpu, 1e-5);
  expect_decoder_matches(tiny_config("swiglu"), cpu, 1e-5);
  expect_decoder_matches(tiny_config("llama"), cpu, 1e-5);
  expect_decoder_matches(tiny_config("gemma"), cpu, 1e-5);
}

TEST(Decoder, LogitsMatchTrainingForwardReference) {
  ReferenceBackend ref;
  expect_decoder_matches(tiny_config("gpt2"), ref, 1e-5);
  expect_decoder_matches(tiny_config("rmsnorm"), ref, 1e-5);
  expect_decoder_matches(tiny_config("gelu"), ref, 1e-5);
  expect_decoder_matches(tiny_config("swiglu"), ref, 1e-5);
  expect_decoder_matches(tiny_config("llama"), ref, 1e-5);
  expect_decoder_matches(tiny_config("gemma"), ref, 1e-5);
}

// model.mlp: each layer's MLP holds its activation op once (swiglu: the fused silu_mul, no separate
// silu), in the training and the decoding program, with the kernels of transformers' LlamaMLP
// (gate_layer, up_layer [C, F], output_layer [F, C]) for swiglu.
TEST(Decoder, MlpVariantsHoldTheirOps) {
  const std::map<std::string, OpKind> act = {
      {"gpt2", OpKind::gelu}, {"gelu", OpKind::gelu_erf}, {"swiglu", OpKind::silu_mul}};
  for (const auto& [variant, op] : act) {
    const Config c = tiny_config(variant);
    for (bool decoder : {false, true}) {
      const nn::ModelGraph m = decoder ? nn::build_transformer_decoder(c.model, 1, kMaxLen)
                                       : nn::build_transformer(c.model, {.batch = 1, .seq_len = kMaxLen}, true);
      std::map<OpKind, int> count;
      for (const Node& n : m.graph.nodes()) ++count[n.op];
      EXPECT_EQ(count[op], c.model.transformer.num_layers) << variant;
      EXPECT_EQ(count[OpKind::gelu] + count[OpKind::gelu_erf] + count[OpKind::silu_mul] + count[OpKind::silu],
                c.model.transformer.num_layers)
          << variant;
      std::map<std::string, Shape> kernels;
      for (const Param& p : m.graph.params()) {
        const std::string& name = m.graph.value(p.value).name;
        if (name.starts_with("block_0/mlp/")) kernels[name] = m.graph.value(p.value).shape;
      }
      const int64_t C = c.model.hidden_size, F = nn::mlp_width(c.model);
      EXPECT_EQ(F, variant == "swiglu" ? 40 : 4 * C);
      const std::map<std::string, Shape> want =
          variant == "swiglu" ? std::map<std::string, Shape>{{"block_0/mlp/gate_layer/kernel", Shape{C, F}},
                                                             {"block_0/mlp/up_layer/kernel", Shape{C, F}},
                                                             {"block_0/mlp/output_layer/kernel", Shape{F, C}},
                                                             {"block_0/mlp/pre_norm/scale", Shape{C}}}
                              : std::map<std::string, Shape>{{"block_0/mlp/input_layer/kernel", Shape{C, F}},
                                                             {"block_0/mlp/output_layer/kernel", Shape{F, C}},
                                                             {"block_0/mlp/pre_norm/scale", Shape{C}}};
      EXPECT_EQ(kernels, want) << variant;
    }
  }
}

// Gemma's blocks (tiny_config("gemma")): per layer the fused gelu_mul, four RMSNorms (pre and post
// each branch, the post ones feeding the residual adds) and one qk_norm, all scaled by 1 + scale
// with scales that start at 0; then the final norm.
TEST(Decoder, GemmaBlocksHoldTheirOps) {
  const Config c = tiny_config("gemma");
  for (bool decoder : {false, true}) {
    const nn::ModelGraph m = decoder ? nn::build_transformer_decoder(c.model, 1, kMaxLen)
                                     : nn::build_transformer(c.model, {.batch = 1, .seq_len = kMaxLen}, true);
    const Graph& g = m.graph;
    std::map<OpKind, int> count;
    int post_into_add = 0;
    for (const Node& n : g.nodes()) {
      ++count[n.op];
      if (n.op == OpKind::rms_norm) {
        EXPECT_TRUE(std::get<LayerNormAttrs>(n.attrs).unit_offset) << n.scope;
      }
      if (n.op == OpKind::qk_norm) {
        EXPECT_TRUE(std::get<QkNormAttrs>(n.attrs).unit_offset) << n.scope;
      }
      if (n.op == OpKind::add)
        for (ValueId in : n.in)
          if (g.value(in).producer >= 0 && g.node(g.value(in).producer).op == OpKind::rms_norm &&
              g.node(g.value(in).producer).scope.ends_with("/post_norm"))
            ++post_into_add;
    }
    EXPECT_EQ(count[OpKind::gelu_mul], c.model.transformer.num_layers);
    EXPECT_EQ(count[OpKind::silu_mul] + count[OpKind::gelu], 0);
    EXPECT_EQ(count[OpKind::rms_norm], 4 * c.model.transformer.num_layers + 1);
    EXPECT_EQ(count[OpKind::qk_norm], c.model.transformer.num_layers);
    EXPECT_EQ(post_into_add, 2 * c.model.transformer.num_layers)
        << "each branch's post_norm is what its residual add adds";
    for (const Param& p : g.params()) {
      const std::string& name = g.value(p.value).name;
      if (name.ends_with("norm/scale")) {
        EXPECT_EQ(p.init.kind, ParamInit::zeros) << name;
      }
    }
  }
}

// model.intermediate_size = 0: mlp_expansion·hidden_size, and for swiglu Meta's Llama rule
// (2/3 of it rounded up to 256), which gives SmolLM's and Llama 2's widths; a width set wins.
TEST(Decoder, MlpWidthRule) {
  ModelConfig c;
  c.hidden_size = 128;
  EXPECT_EQ(nn::mlp_width(c), 512);
  c.transformer.mlp = MlpKind::swiglu;
  EXPECT_EQ(nn::mlp_width(c), 512);  // 341 rounded up
  c.hidden_size = 576;
  EXPECT_EQ(nn::mlp_width(c), 1536);  // SmolLM-135M
  c.hidden_size = 4096;
  EXPECT_EQ(nn::mlp_width(c), 11008);  // Llama 2 7B
  c.transformer.intermediate_size = 341;
  EXPECT_EQ(nn::mlp_width(c), 341);
}

// model.position = rope: no position table, and one rope per layer on the packed qkv with the
// model's theta, in the training graph and in the decoder (whose cache then holds rotated keys).
TEST(Decoder, RopeModelHasNoPositionTable) {
  const Config c = tiny_config("llama");
  for (bool decoder : {false, true}) {
    const nn::ModelGraph m = decoder ? nn::build_transformer_decoder(c.model, 1, kMaxLen)
                                     : nn::build_transformer(c.model, {.batch = 1, .seq_len = kMaxLen}, true);
    int ropes = 0;
    for (const Node& n : m.graph.nodes())
      if (n.op == OpKind::rope && n.phase == Phase::forward) {
        ++ropes;
        EXPECT_EQ(std::get<RopeAttrs>(n.attrs).theta, 100.f) << n.scope;
      }
    EXPECT_EQ(ropes, c.model.transformer.num_layers);
    for (const Param& p : m.graph.params()) EXPECT_EQ(m.graph.value(p.value).name.find("pos_emb"), std::string::npos);
  }
  Config odd = c;
  odd.model.transformer.head_dim = 7;
  odd.model.hidden_size = 28;
  EXPECT_THROW(nn::validate_transformer(odd.model), UserError);
}

// model.num_kv_heads = 2 of 4 heads: the qkv projection is [C, KV, (G+2)·D], every attention has
// group 2, and the decoder's caches have 2 heads, not 4.
TEST(Decoder, GroupedQueryModelSizesByKeyValueHeads) {
  const Config c = tiny_config("llama");
  const nn::ModelGraph dec = nn::build_transformer_decoder(c.model, 1, kMaxLen);
  int caches = 0;
  for (const Node& n : dec.graph.nodes())
    if (n.op == OpKind::attention_decode) {
      EXPECT_EQ(std::get<AttentionAttrs>(n.attrs).group, 2);
      for (int i : {1, 2}) EXPECT_EQ(dec.graph.value(n.in[i]).shape, (Shape{1, kMaxLen, 2, 8}));
      ++caches;
    }
  EXPECT_EQ(caches, c.model.transformer.num_layers);
  const nn::ModelGraph train = nn::build_transformer(c.model, {.batch = 1, .seq_len = kMaxLen}, true);
  for (const Param& p : train.graph.params()) {
    const Value& v = train.graph.value(p.value);
    if (v.name.ends_with("qkv/kernel")) {
      EXPECT_EQ(v.shape, (Shape{32, 2, 4 * 8})) << v.name;
    }
  }
  for (int64_t bad : {3, 8, -1}) {
    Config b = c;
    b.model.transformer.num_kv_heads = bad;
    try {
      nn::validate_transformer(b.model);
      ADD_FAILURE() << bad << " accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("model.num_kv_heads"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("model.hidden_size / model.head_dim"), std::string::npos) << e.what();
    }
  }
}

// model.norm = rmsnorm: every norm of the model is an rms_norm with a scale and no bias (the
// decoder's program too), with model.layer_norm_eps.
TEST(Decoder, RmsNormModelHasOnlyRmsNorms) {
  const Config c = tiny_config("rmsnorm");
  for (bool decoder : {false, true}) {
    const nn::ModelGraph m = decoder ? nn::build_transformer_decoder(c.model, 1, kMaxLen)
                                     : nn::build_transformer(c.model, {.batch = 1, .seq_len = kMaxLen}, true);
    int rms = 0;
    for (const Node& n : m.graph.nodes()) {
      EXPECT_NE(n.op, OpKind::layer_norm) << n.scope;
      if (n.op != OpKind::rms_norm) continue;
      ++rms;
      EXPECT_EQ(std::get<LayerNormAttrs>(n.attrs).eps, static_cast<float>(c.model.layer_norm_eps));
    }
    EXPECT_EQ(rms, 2 * c.model.transformer.num_layers + 1) << "pre_norm of attention and MLP per layer, post_norm";
    for (const Param& p : m.graph.params()) {
      const std::string& name = m.graph.value(p.value).name;
      EXPECT_FALSE(name.find("_norm/") != std::string::npos && !name.ends_with("/scale")) << name;
    }
  }
}

// bf16 compute: both programs round the same intermediates to bf16, but an f32 summation-order
// difference can flip one rounding, which the following layers carry: a few bf16 ulps.
TEST(Decoder, LogitsMatchTrainingForwardBf16) {
  CpuBackend cpu;
  expect_decoder_matches(tiny_config("gpt2", "bfloat16"), cpu, 3e-2);
  expect_decoder_matches(tiny_config("llama", "bfloat16"), cpu, 3e-2);
}

// The two graphs have the same parameters, path for path and shape for shape, in the same order.
void expect_same_params(const Graph& a, const Graph& b) {
  ASSERT_EQ(a.params().size(), b.params().size());
  for (size_t i = 0; i < a.params().size(); ++i) {
    const Value& x = a.value(a.params()[i].value);
    const Value& y = b.value(b.params()[i].value);
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.shape, y.shape);
  }
}

// One program for every token: its size depends on the model, not on the cache length or the
// position, and it holds exactly one attention_decode per layer over that layer's caches.
TEST(Decoder, ProgramIndependentOfPosition) {
  const ModelConfig spec = tiny_config().model;
  const nn::ModelGraph a = nn::build_transformer_decoder(spec, 1, 4);
  const nn::ModelGraph b = nn::build_transformer_decoder(spec, 1, kMaxLen);
  EXPECT_EQ(a.graph.nodes().size(), b.graph.nodes().size());
  int decode = 0;
  for (const Node& n : b.graph.nodes()) {
    EXPECT_NE(n.op, OpKind::attention);
    if (n.op == OpKind::attention_decode) {
      ++decode;
      EXPECT_EQ(b.graph.value(n.in[1]).name, n.scope + "/k_cache");
      EXPECT_EQ(b.graph.value(n.in[2]).name, n.scope + "/v_cache");
    }
  }
  EXPECT_EQ(decode, 2);
  for (const char* name : {"block_0/attn/k_cache", "block_1/attn/v_cache"}) {
    const ValueId v = b.graph.input_by_name(name);
    ASSERT_NE(v, kNoValue) << name;
    EXPECT_EQ(b.graph.value(v).shape, (Shape{1, kMaxLen, 4, 8})) << name;
  }
  EXPECT_EQ(b.graph.value(b.output).shape, (Shape{1, 1, kVocab}));
  EXPECT_TRUE(b.graph.value(b.output).is_output);
  // The parameters are the training graph's, path for path.
  const nn::ModelGraph t = nn::build_transformer(spec, {.batch = 1, .seq_len = kMaxLen}, false);
  expect_same_params(t.graph, b.graph);

  CpuBackend cpu;
  Sampler s(tiny_config(), cpu);
  const size_t nodes = s.nodes_per_token();
  EXPECT_EQ(nodes, b.graph.nodes().size());
  for (int32_t t = 0; t < kMaxLen; ++t) {
    s.feed(t % kVocab);
    EXPECT_EQ(s.nodes_per_token(), nodes);
  }
}

TEST(Decoder, RejectsNonCausalModels) {
  ModelConfig spec = tiny_config().model;
  EXPECT_THROW(nn::build_transformer_decoder(spec, 1, kMaxLen + 1), std::invalid_argument);
  spec.transformer.causal_mask = false;
  EXPECT_THROW(nn::build_transformer_decoder(spec, 1, kMaxLen), std::invalid_argument);
  CpuBackend cpu;
  Config c = tiny_config();
  c.model.transformer.causal_mask = false;
  EXPECT_THROW(Sampler(c, cpu), UserError);
  EXPECT_THROW(Sampler(default_config({}), cpu), UserError);  // an mlp_classifier
}

// The prefill program: per layer one kv_cache_write into caches named and shaped as the decoder's
// and one causal attention (no attention_decode), the decoder's parameters, and only the last
// token's row past the blocks (post_norm over [1, 1, C]), giving logits [1, 1, V] f32.
TEST(Decoder, PrefillProgramSharesTheDecodersCaches) {
  for (const char* variant : {"gpt2", "llama"}) {
    const ModelConfig spec = tiny_config(variant).model;
    const nn::ModelGraph dec = nn::build_transformer_decoder(spec, 1, kMaxLen);
    const nn::ModelGraph pre = nn::build_transformer_prefill(spec, 1, 5, kMaxLen);
    std::map<OpKind, int> count;
    for (const Node& n : pre.graph.nodes()) {
      ++count[n.op];
      if (n.op == OpKind::kv_cache_write)
        for (int i : {1, 2}) {
          const Value& cache = pre.graph.value(n.in[static_cast<size_t>(i)]);
          const ValueId in_dec = dec.graph.input_by_name(cache.name);
          ASSERT_NE(in_dec, kNoValue) << cache.name;
          EXPECT_EQ(cache.shape, dec.graph.value(in_dec).shape) << cache.name;
          EXPECT_EQ(cache.name, n.scope + (i == 1 ? "/k_cache" : "/v_cache"));
        }
      if (n.op == OpKind::layer_norm && n.scope == "post_norm") {
        EXPECT_EQ(pre.graph.value(n.in[0]).shape, (Shape{1, 1, spec.hidden_size})) << variant;
      }
    }
    EXPECT_EQ(count[OpKind::kv_cache_write], spec.transformer.num_layers) << variant;
    EXPECT_EQ(count[OpKind::attention], spec.transformer.num_layers) << variant;
    EXPECT_EQ(count[OpKind::attention_decode], 0) << variant;
    expect_same_params(pre.graph, dec.graph);
    const Value& out = pre.graph.value(pre.output);
    EXPECT_EQ(out.shape, (Shape{1, 1, kVocab}));
    EXPECT_EQ(out.dtype, DType::f32);
    EXPECT_TRUE(out.is_output);
    for (int64_t bad : {int64_t{0}, kMaxLen + 1})
      EXPECT_THROW(nn::build_transformer_prefill(spec, 1, bad, kMaxLen), std::invalid_argument) << bad;
  }
}

// The batched prefill against the one-token path on the same parameters: the prompt's last
// logits, the tokens held, and the logits of the tokens decoded after it (which read the caches
// the prefill filled), for prompts of 1, 5 and max_len tokens. Returns the largest row_error.
double prefill_error(const Config& c, Backend& be) {
  Trainer tr(c, be);
  Sampler batched(c, be), token(c, be, Prefill::token);
  batched.copy_params_from(tr.executor());
  token.copy_params_from(tr.executor());
  double worst = 0;
  for (size_t len : {size_t{1}, size_t{5}, static_cast<size_t>(kMaxLen)}) {
    const std::vector<int32_t> seq = random_tokens(len + 20, kMaxLen);
    const std::span<const int32_t> prompt = std::span(seq).first(len);
    const std::span<const float> want = token.prefill(prompt);
    worst = std::max(worst, row_error(batched.prefill(prompt), want.data()));
    EXPECT_EQ(batched.cached(), token.cached());
    for (size_t t = len; t < std::min(len + 4, seq.size()); ++t) {
      const std::span<const float> next = token.feed(seq[t]);
      worst = std::max(worst, row_error(batched.feed(seq[t]), next.data()));
    }
  }
  if (std::getenv("STATS")) std::printf("STAT prefill %s %s worst %g\n", be.name(), dtype_name(c.model.dtype), worst);
  return worst;
}

// Learned positions (gpt2) and rotary positions with grouped key/value heads (llama). On the
// reference backend every row is computed alone in double, so the two paths agree bit for bit; on
// the CPU float32 differs by summation orders (sgemm over T rows vs one row, blocked attention vs
// dot products: measured 6e-8 of the logits' scale), and bfloat16 could differ by an
// intermediate's rounding flipped by those, carried through the layers (equal when measured here;
// the bound is the decoder's own test's, a few bf16 ulps).
TEST(Prefill, LogitsMatchTokenByToken) {
  CpuBackend cpu;
  ReferenceBackend ref;
  for (const char* variant : {"gpt2", "llama"}) {
    EXPECT_EQ(prefill_error(tiny_config(variant), ref), 0) << variant;
    EXPECT_LE(prefill_error(tiny_config(variant), cpu), 1e-5) << variant;
    EXPECT_LE(prefill_error(tiny_config(variant, "bfloat16"), cpu), 3e-2) << variant;
  }
}

// The prefill program reads the decoder's parameters (bound, not copied): built on the zero
// parameters of a fresh Sampler, it sees the ones copied in afterwards.
TEST(Prefill, ProgramReadsTheDecodersParameters) {
  const Config c = tiny_config();
  CpuBackend cpu;
  Trainer tr(c, cpu);
  Sampler s(c, cpu), token(c, cpu, Prefill::token);
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  for (float x : s.prefill(prompt)) EXPECT_EQ(x, 0.f) << "zero parameters";
  s.copy_params_from(tr.executor());
  token.copy_params_from(tr.executor());
  const std::span<const float> want = token.prefill(prompt);
  EXPECT_LE(row_error(s.prefill(prompt), want.data()), 1e-5);
  EXPECT_GT(row_error(want, std::vector<float>(want.size()).data()), 0) << "the logits are not all zero";
}

// Two programs at most (the prompt's and the window refill's length): a third length replaces the
// least recently used one, so the memory held does not grow with the lengths seen. The token path
// holds none. Every prefill call is one pass in the stats.
TEST(Prefill, KeepsTheTwoLatestPrograms) {
  const Config c = tiny_config();
  CpuBackend cpu;
  Sampler s(c, cpu), token(c, cpu, Prefill::token);
  const std::vector<int32_t> seq = random_tokens(3, kMaxLen);
  auto held_after = [&](size_t n) {
    s.prefill(std::span(seq).first(n));
    token.prefill(std::span(seq).first(n));
    return s.prefill_bytes();
  };
  EXPECT_EQ(s.prefill_bytes(), 0);
  const int64_t three = held_after(3);
  const int64_t three_eight = held_after(8);
  EXPECT_GT(three, 0);
  EXPECT_GT(three_eight, three);
  EXPECT_EQ(held_after(3), three_eight);  // kept: 3 and 8
  held_after(5);                          // 5 and 3
  held_after(8);                          // 8 and 5
  EXPECT_EQ(held_after(3), three_eight);  // 3 and 8 again
  EXPECT_EQ(token.prefill_bytes(), 0);
  for (const Sampler* x : {&s, &token}) {
    EXPECT_EQ(x->prefill_stats().passes, 6);
    EXPECT_EQ(x->prefill_stats().tokens, 3 + 8 + 3 + 5 + 8 + 3);
  }
  EXPECT_EQ(token.runs(), 3 + 8 + 3 + 5 + 8 + 3) << "the token path runs the decoder per token";
  EXPECT_EQ(s.runs(), 0);
}

// ---- narrowed parameters (graph/passes/narrow_params.h) ----------------------------------------

// The sampling programs as they were built before narrow_params: the decoder and the prefill
// program of one length over its caches, reading float32 masters that the kernels round to the
// compute dtype on every call. The reference the Sampler's narrowed programs must equal bit for bit.
class MasterPrograms {
 public:
  MasterPrograms(const Config& c, Backend& be, const Executor& params)
      : c_(c), be_(be), dec_(nn::build_transformer_decoder(c.model, 1, kMaxLen)) {
    const Graph& g = dec_.graph;
    const Status st = Executor::create(be, g, plan_program(be, g, default_schedule(g)), &dec_exec_);
    EXPECT_TRUE(st.is_ok()) << st.message();
    masters_ = export_params(params, false);
    std::map<std::string, const StTensor*> by_name;
    for (const StTensor& t : masters_) by_name[t.name] = &t;
    import_params(*dec_exec_, by_name, false, "test");
  }
  const Executor& decoder() const { return *dec_exec_; }
  // The logits of `token` at the next position.
  std::vector<float> feed(int32_t token) {
    dec_exec_->upload(dec_.inputs, &token);
    dec_exec_->upload(dec_.graph.input_by_name("positions"), &pos_);
    dec_exec_->run(RunCtx{});
    ++pos_;
    return logits(*dec_exec_, dec_);
  }
  // Rows 0..n-1 of the caches from `tokens` in one pass; the last token's logits.
  std::vector<float> prefill(std::span<const int32_t> tokens) {
    pre_ = nn::build_transformer_prefill(c_.model, 1, static_cast<int64_t>(tokens.size()), kMaxLen);
    const Graph& g = pre_.graph;
    Executor::External shared;  // the decoder's parameters and caches
    for (const Value& v : dec_.graph.values())
      if (v.kind == ValueKind::param || v.name.ends_with("_cache"))
        shared[v.name] = dec_exec_->ptr(dec_.graph.input_by_name(v.name));
    const Status st = Executor::create(be_, g, plan_program(be_, g, default_schedule(g)), &pre_exec_, &shared);
    EXPECT_TRUE(st.is_ok()) << st.message();
    for (const auto& [v, bytes] : pre_.constants) pre_exec_->upload(v, bytes.data());
    pre_exec_->upload(pre_.inputs, tokens.data());
    pre_exec_->run(RunCtx{});
    pos_ = static_cast<int32_t>(tokens.size());
    return logits(*pre_exec_, pre_);
  }

 private:
  static std::vector<float> logits(const Executor& ex, const nn::ModelGraph& m) {
    std::vector<float> out(static_cast<size_t>(kVocab));
    ex.download(m.output, out.data());
    return out;
  }
  Config c_;
  Backend& be_;
  nn::ModelGraph dec_, pre_;
  std::vector<StTensor> masters_;
  std::unique_ptr<Executor> dec_exec_, pre_exec_;
  int32_t pos_ = 0;
};

// Bit for bit, the float values themselves (a rounding that differs anywhere shows).
void expect_bits(std::span<const float> got, const std::vector<float>& want, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
      << where << ": narrowed " << got[0] << " " << got[1] << ", masters " << want[0] << " " << want[1];
}

// A bfloat16 model's Sampler holds its kernels, biases and embedding tables as bf16 copies rounded
// once, and gives the logits of the programs that round the f32 masters per call bit for bit: the
// decoder from position 0, the batched prefill of 1, 5 and max_len tokens, the tokens decoded after
// it from the caches it filled, and so the greedy text. On the cpu backend (its native bf16 GEMM
// reads the copies as they are) and the reference, for GPT-2 style (tied head, learned positions),
// the tutorial's (biases, untied head) and Llama style (RMSNorm, rope, grouped heads). Rounding the
// copies any other way (truncation, say) changes the logits.
TEST(Decoder, NarrowedParametersGiveTheMastersLogits) {
  CpuBackend cpu;
  ReferenceBackend ref;
  for (Backend* be : {static_cast<Backend*>(&cpu), static_cast<Backend*>(&ref)})
    for (const char* variant : {"gpt2", "tutorial", "llama"}) {
      const std::string where = std::string(be->name()) + " " + variant;
      const Config c = tiny_config(variant, "bfloat16");
      Trainer tr(c, *be);
      Sampler s(c, *be);
      s.copy_params_from(tr.executor());
      MasterPrograms old(c, *be, tr.executor());
      int narrowed = 0;
      for (const Param& p : s.executor().graph().params())
        narrowed += s.executor().graph().value(p.value).dtype == DType::bf16;
      EXPECT_GT(narrowed, 0) << where;
      const std::vector<int32_t> seq = random_tokens(5, kMaxLen);
      for (int64_t t = 0; t < kMaxLen; ++t)
        expect_bits(s.feed(seq[static_cast<size_t>(t)]), old.feed(seq[static_cast<size_t>(t)]),
                    where + " decoder position " + std::to_string(t));
      for (size_t len : {size_t{1}, size_t{5}, static_cast<size_t>(kMaxLen)}) {
        const std::span<const int32_t> prompt = std::span(seq).first(len);
        expect_bits(s.prefill(prompt), old.prefill(prompt), where + " prefill of " + std::to_string(len));
        for (size_t t = len; t < std::min(len + 4, seq.size()); ++t)
          expect_bits(s.feed(seq[t]), old.feed(seq[t]), where + " after a prefill of " + std::to_string(len));
      }
      const std::vector<int32_t> prompt = {3, 1, 4};
      const std::vector<int32_t> text = generate(s, prompt, 10, {.temperature = 0.0, .top_k = 0}, 1, 0, nullptr);
      std::vector<float> l = old.prefill(prompt);
      for (int32_t t : text) {
        EXPECT_EQ(t, std::max_element(l.begin(), l.end()) - l.begin()) << where << " greedy text";
        l = old.feed(t);
      }
    }
}

// Which parameters are narrowed, and what the plan counts: in a bfloat16 model every kernel, bias
// and embedding table, stored in 2 bytes, and the norms' scales and biases (read in f32) in 4; the
// plan's parameter bytes are those, and its arena holds no converted weight copies, so it is no
// larger than the masters' programs'. A float32 model's programs are left exactly as built.
TEST(Decoder, NarrowsWhatOnlyTheComputeDtypeReads) {
  CpuBackend cpu;
  for (const char* variant : {"gpt2", "tutorial", "llama"}) {
    const nn::ModelGraph f32 = nn::build_transformer_decoder(tiny_config(variant).model, 1, kMaxLen);
    nn::ModelGraph copy = nn::build_transformer_decoder(tiny_config(variant).model, 1, kMaxLen);
    EXPECT_TRUE(narrow_params(copy.graph).empty()) << variant;
    EXPECT_EQ(copy.graph.dump(), f32.graph.dump()) << variant;

    const Config c = tiny_config(variant, "bfloat16");
    for (bool prefill : {false, true}) {
      nn::ModelGraph m = prefill ? nn::build_transformer_prefill(c.model, 1, 5, kMaxLen)
                                 : nn::build_transformer_decoder(c.model, 1, kMaxLen);
      const std::vector<ValueId> narrowed = narrow_params(m.graph);
      int64_t bytes = 0;
      for (const Param& p : m.graph.params()) {
        const Value& v = m.graph.value(p.value);
        const bool norm = v.name.find("_norm/") != std::string::npos;
        EXPECT_EQ(v.dtype, norm ? DType::f32 : DType::bf16) << variant << " " << v.name;
        EXPECT_EQ(std::count(narrowed.begin(), narrowed.end(), p.value), norm ? 0 : 1) << v.name;
        bytes += v.shape.numel() * (norm ? 4 : 2);
      }
      if (!prefill) {
        Sampler s(c, cpu);
        EXPECT_EQ(s.executor().plan().param_bytes, bytes) << variant;
        const nn::ModelGraph masters = nn::build_transformer_decoder(c.model, 1, kMaxLen);
        const MemoryPlan mp = plan_program(cpu, masters.graph, default_schedule(masters.graph));
        EXPECT_LT(s.executor().plan().param_bytes, mp.param_bytes) << variant;
        EXPECT_LE(s.executor().plan().arena_bytes, mp.arena_bytes) << variant;
      }
    }
  }
}

struct Fixture {
  Config c = tiny_config();
  CpuBackend cpu;
  Trainer tr{c, cpu};
};

// Greedy decoding with the cache equals greedy decoding by recomputing the full forward for
// every prefix (nanoGPT's way), and repeats exactly.
TEST(Sampler, GreedyMatchesRecomputationAndRepeats) {
  Fixture f;
  Sampler s(f.c, f.cpu);
  s.copy_params_from(f.tr.executor());
  const std::vector<int32_t> prompt = {3, 1, 4};
  const std::vector<int32_t> a = generate(s, prompt, 12, {.temperature = 0.0, .top_k = 0}, 1, 0, nullptr);
  const std::vector<int32_t> b =
      generate(s, prompt, 12, {.temperature = 0.0, .top_k = 0}, 99, 0, nullptr);  // seed is irrelevant
  EXPECT_EQ(a, b);
  FullForward full(f.c, f.tr.executor(), f.cpu);
  std::vector<int32_t> ctx = prompt;
  for (size_t i = 0; i < a.size(); ++i) {
    const std::vector<float> l = full.logits(ctx);
    const float* row = l.data() + (ctx.size() - 1) * kVocab;
    ctx.push_back(static_cast<int32_t>(std::max_element(row, row + kVocab) - row));
  }
  EXPECT_EQ(std::vector<int32_t>(ctx.begin() + 3, ctx.end()), a);
}

TEST(Sampler, SeedsChangeSamples) {
  Fixture f;
  Sampler s(f.c, f.cpu);
  s.copy_params_from(f.tr.executor());
  const std::vector<int32_t> prompt = {5};
  const auto a = generate(s, prompt, 12, {.temperature = 1.0, .top_k = 0}, 1, 0, nullptr);
  const auto b = generate(s, prompt, 12, {.temperature = 1.0, .top_k = 0}, 2, 0, nullptr);
  const auto a2 = generate(s, prompt, 12, {.temperature = 1.0, .top_k = 0}, 1, 0, nullptr);
  EXPECT_NE(a, b);
  EXPECT_EQ(a, a2);
  std::vector<int32_t> streamed;
  const auto c =
      generate(s, prompt, 12, {.temperature = 1.0, .top_k = 5}, 3, 0, [&](int32_t t) {
        streamed.push_back(t);
        return true;
      });
  EXPECT_EQ(streamed, c);
  const auto d =
      generate(s, prompt, 30, {.temperature = 1.0, .top_k = 0}, 4, 7, nullptr);  // ids below the vocab limit only
  for (int32_t t : d) EXPECT_LT(t, 7);
}

// Past max_len the caches restart from the last max_len/2 tokens: the logits are then those of
// the full forward over that window, at positions 0.. . The window is max_seq_len, or --context.
TEST(Sampler, SlidingWindow) {
  Fixture f;
  FullForward full(f.c, f.tr.executor(), f.cpu);
  const std::vector<int32_t> ctx = random_tokens(11, 40);
  for (const int64_t context : {int64_t{0}, int64_t{10}}) {
    Sampler s(f.c, f.cpu, Prefill::batched, context);
    s.copy_params_from(f.tr.executor());
    const size_t max_len = context > 0 ? static_cast<size_t>(context) : static_cast<size_t>(kMaxLen);
    EXPECT_EQ(s.max_len(), static_cast<int64_t>(max_len));
    for (size_t n = 1; n <= ctx.size(); ++n) {
      const std::span<const float> l = s.next_logits(std::span(ctx).first(n));
      const size_t w = s.cached().size();
      ASSERT_GE(w, std::min<size_t>(n, max_len / 2)) << n;
      ASSERT_LE(w, max_len) << n;
      const std::vector<int32_t> window(ctx.begin() + static_cast<ptrdiff_t>(n - w),
                                        ctx.begin() + static_cast<ptrdiff_t>(n));
      EXPECT_EQ(s.cached(), window) << n;
      const std::vector<float> ref = full.logits(window);
      EXPECT_LE(row_error(l, ref.data() + (w - 1) * kVocab), 1e-5) << n;
    }
    // 16 tokens fill the cache; then it restarts with 8 and refills when 9 more arrive: n = 17, 26,
    // 35. With 10: n = 11, 17, 23, 29, 35.
    EXPECT_EQ(s.window_refills(), context > 0 ? 5 : 3);
    const auto long_run = generate(s, {1}, 50, {.temperature = 1.0, .top_k = 0}, 5, 0, nullptr);
    EXPECT_EQ(long_run.size(), 50u);
  }
  for (const int64_t bad : {int64_t{1}, kMaxLen + 1}) {
    try {
      Sampler s(f.c, f.cpu, Prefill::batched, bad);
      ADD_FAILURE() << bad;
    } catch (const UserError& e) {
      EXPECT_EQ(e.subject(), "--context");
    }
  }
}

TEST(Sampler, SampleTokenRule) {
  const PhiloxKey key = named_key(0, "sample");
  const std::vector<float> l = {0.5f, 2.f, -1.f, 2.f, 1.f};
  EXPECT_EQ(sample_token(l, {.temperature = 0.0, .top_k = 0}, key, 0), 1);  // greedy: the first maximum
  for (uint64_t i = 0; i < 200; ++i) {
    const int32_t t = sample_token(l, {.temperature = 0.7, .top_k = 1}, key, i);  // top-1 keeps both tied maxima
    EXPECT_TRUE(t == 1 || t == 3) << t;
    const int32_t u = sample_token(l, {.temperature = 5.0, .top_k = 3}, key, i);  // top-3: 2.0, 2.0, 1.0
    EXPECT_TRUE(u == 1 || u == 3 || u == 4) << u;
  }
  // Frequencies follow softmax(l / T).
  const double T = 1.5;
  std::array<int, 5> counts{};
  const int N = 40000;
  for (int i = 0; i < N; ++i)
    ++counts[static_cast<size_t>(sample_token(l, {.temperature = T, .top_k = 0}, key, static_cast<uint64_t>(i)))];
  double z = 0;
  for (float x : l) z += std::exp(x / T);
  for (size_t k = 0; k < l.size(); ++k) {
    const double p = std::exp(l[k] / T) / z;
    EXPECT_NEAR(counts[k] / double(N), p, 4 * std::sqrt(p * (1 - p) / N) + 1e-3) << k;
  }
  const std::vector<float> bad = {0.f, NAN};
  EXPECT_THROW(sample_token(bad, {.temperature = 1.0, .top_k = 0}, key, 0), std::runtime_error);
}

// The nucleus: the most likely tokens whose probabilities first reach top_p, at least one.
TEST(Sampler, TopPKeepsTheNucleus) {
  const std::vector<float> l = {std::log(0.2f), std::log(0.5f), std::log(0.3f)};
  const PhiloxKey key = named_key(11, "top_p");
  std::array<int, 3> seen{};
  for (uint64_t i = 0; i < 400; ++i) ++seen[sample_token(l, {.temperature = 1.0, .top_k = 0, .top_p = 0.6}, key, i)];
  EXPECT_EQ(seen[0], 0) << "0.5 + 0.3 reach 0.6 before 0.2 is needed";
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[2], 0);
  for (uint64_t i = 0; i < 50; ++i)
    EXPECT_EQ(sample_token(l, {.temperature = 1.0, .top_k = 0, .top_p = 0.5}, key, i), 1) << "0.5 alone is enough";
  std::array<int, 3> all{};
  for (uint64_t i = 0; i < 400; ++i) ++all[sample_token(l, {.temperature = 1.0, .top_k = 0, .top_p = 1.0}, key, i)];
  EXPECT_GT(all[0], 0) << "top_p = 1 keeps everything";
}

TEST(Sampler, ValidatesFlags) {
  auto subject = [](SampleOptions o) -> std::string {
    try {
      validate_sample_options(o);
    } catch (const UserError& e) {
      return e.subject();
    }
    return "";
  };
  SampleOptions o;
  EXPECT_EQ(subject(o), "");
  o.tokens = -1;
  EXPECT_EQ(subject(o), "--tokens");
  o = {};
  o.sampling.top_k = -2;
  EXPECT_EQ(subject(o), "--top-k");
  o = {};
  o.sampling.temperature = -0.5;
  EXPECT_EQ(subject(o), "--temperature");
  o.sampling.temperature = NAN;
  EXPECT_EQ(subject(o), "--temperature");
  o = {};
  o.sampling.top_p = 0;
  EXPECT_EQ(subject(o), "--top-p");
  o.sampling.top_p = 1.5;
  EXPECT_EQ(subject(o), "--top-p");
  o = {};
  o.num_samples = 0;
  EXPECT_EQ(subject(o), "--num-samples");
}

// ---- end to end: save_checkpoint, then `loom sample` ------------------------------------------

struct CmdResult {
  int status = -1;
  std::string out, err;
};

CmdResult run_cmd(const std::string& args, const fs::path& dir) {
  const std::string err_file = (dir / "stderr.txt").string();
  const std::string cmd = std::string(LOOM_BINARY) + " " + args + " 2>" + err_file;
  CmdResult r;
  std::FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::FILE* e = std::fopen(err_file.c_str(), "rb");
  if (e) {
    while ((n = std::fread(buf, 1, sizeof buf, e)) > 0) r.err.append(buf, n);
    std::fclose(e);
  }
  return r;
}

// What loom sample prints for one sample: the text, ending with a newline.
std::string ended(std::string s) { return s.empty() || s.back() != '\n' ? s + "\n" : s; }

class SampleCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("loom_test_sample_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(SampleCli, GeneratesFromACheckpoint) {
  const CharTokenizer tok = CharTokenizer::fit("\n abcdefghijklmnopqr", "test vocabulary");  // 20 characters
  ASSERT_EQ(tok.vocab_size(), kVocab);
  Fixture f;
  CheckpointState st;
  st.config_toml = config_to_toml(f.c);
  st.seed = f.c.seed;
  const nlohmann::json tj = tok.to_json();
  const fs::path run = dir_ / "run";
  fs::create_directories(run);
  save_checkpoint(f.tr, st, (run / "ckpt_3").string(), &tj);

  // In process, the same greedy continuation.
  Sampler s(f.c, f.cpu);
  s.copy_params_from(f.tr.executor());
  const std::vector<int32_t> want = generate(s, tok.encode("abc"), 25, {.temperature = 0.0, .top_k = 0}, 0, 0, nullptr);

  const CmdResult r = run_cmd("sample " + run.string() + " --prompt abc --tokens 25 --temperature 0 --seed 3", dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, ended("abc" + tok.decode(want)));

  // Sampling: seeded, reproducible, different across seeds; --top-k 1 is greedy.
  const std::string base = "sample " + (run / "ckpt_3").string() + " --prompt 'ab c' --tokens 30 --temperature 1.2 ";
  const CmdResult s1 = run_cmd(base + "--seed 1", dir_), s1b = run_cmd(base + "--seed 1", dir_),
                  s2 = run_cmd(base + "--seed 2", dir_);
  ASSERT_EQ(s1.status, 0) << s1.err;
  EXPECT_EQ(s1.out.size(), ended(s1.out.substr(0, 34)).size());
  EXPECT_EQ(s1.out.back(), '\n') << "the output ends with a newline";
  EXPECT_EQ(s1.out, s1b.out);
  EXPECT_NE(s1.out, s2.out);
  const CmdResult k1 =
      run_cmd("sample " + run.string() + " --prompt abc --tokens 25 --temperature 0.9 --top-k 1", dir_);
  EXPECT_EQ(k1.out, r.out);
  // Longer than max_seq_len: the sliding window keeps going.
  const CmdResult longer = run_cmd("sample " + run.string() + " --prompt abc --tokens 60 --stats", dir_);
  ASSERT_EQ(longer.status, 0) << longer.err;
  EXPECT_EQ(longer.out.size(), ended(longer.out.substr(0, 63)).size());
  EXPECT_NE(longer.err.find("ms/token"), std::string::npos) << longer.err;

  // The defaults are the end-of-training sample's: temperature 0.8, top-k 200.
  const std::string plain = "sample " + run.string() + " --prompt abc --tokens 20 --seed 5";
  EXPECT_EQ(run_cmd(plain, dir_).out, run_cmd(plain + " --temperature 0.8 --top-k 200", dir_).out);
  EXPECT_NE(run_cmd(plain, dir_).out, run_cmd(plain + " --temperature 1.0 --top-k 0", dir_).out);
  // Several samples, each from the prompt, separated as nanoGPT does; sample 0 is the single one.
  const CmdResult three = run_cmd(plain + " --num-samples 3", dir_);
  ASSERT_EQ(three.status, 0) << three.err;
  std::vector<std::string> parts;
  for (size_t at = 0; at <= three.out.size();) {
    size_t sep = three.out.find("---------------\n", at);
    if (sep == std::string::npos) sep = three.out.size();
    parts.push_back(three.out.substr(at, sep - at));
    at = sep + 16;
  }
  ASSERT_EQ(parts.size(), 3u) << three.out;
  EXPECT_EQ(parts[0], run_cmd(plain, dir_).out);
  for (const std::string& p : parts) EXPECT_EQ(p.rfind("abc", 0), 0u) << p;
  EXPECT_NE(parts[1], parts[2]);
  // A prompt from a file is the same as the same prompt given inline.
  std::ofstream(dir_ / "prompt.txt") << "ab c";
  EXPECT_EQ(
      run_cmd("sample " + run.string() + " --prompt-file " + (dir_ / "prompt.txt").string() + " --tokens 9", dir_).out,
      run_cmd("sample " + run.string() + " --prompt 'ab c' --tokens 9", dir_).out);
  // Top-p 1 changes nothing; a tiny nucleus is greedy.
  EXPECT_EQ(run_cmd(plain + " --top-p 1", dir_).out, run_cmd(plain, dir_).out);
  EXPECT_EQ(run_cmd(plain + " --top-p 0.000001", dir_).out,
            run_cmd("sample " + run.string() + " --prompt abc --tokens 20 --temperature 0", dir_).out);
}

// A trained tiny checkpoint (40 steps on one batch) decoded greedily: the text is the same with
// the batched prefill and with --token-prefill, for a short prompt whose sample refills the window
// and a prompt longer than the window; --stats names the prefill path and gives tokens/s.
TEST_F(SampleCli, BatchedPrefillKeepsTheText) {
  const CharTokenizer tok = CharTokenizer::fit("\n abcdefghijklmnopqr", "test vocabulary");
  Fixture f;
  const Batch b = random_tokens_batch(f.c.data, data_context(f.c));
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    last = f.tr.step(b).metrics.loss.mean();
    if (step == 0) first = last;
  }
  ASSERT_LT(last, first) << "the checkpoint learned something";
  CheckpointState st;
  st.config_toml = config_to_toml(f.c);
  const nlohmann::json tj = tok.to_json();
  const std::string ck = (dir_ / "ckpt_40").string();
  save_checkpoint(f.tr, st, ck, &tj);
  for (const char* prompt : {"abc", "abc def ghi jkl mno pqr"}) {
    const std::string cmd = "sample " + ck + " --prompt '" + prompt + "' --tokens 40 --temperature 0 --stats";
    const CmdResult batched = run_cmd(cmd, dir_), token = run_cmd(cmd + " --token-prefill", dir_);
    ASSERT_EQ(batched.status, 0) << batched.err;
    ASSERT_EQ(token.status, 0) << token.err;
    EXPECT_EQ(batched.out, token.out) << prompt;
    EXPECT_EQ(batched.out.size(), ended(batched.out.substr(0, std::strlen(prompt) + 40)).size());
    EXPECT_NE(batched.err.find("batched prefill"), std::string::npos) << batched.err;
    EXPECT_NE(token.err.find("token-by-token prefill"), std::string::npos) << token.err;
    for (const CmdResult* r : {&batched, &token}) {
      EXPECT_NE(r->err.find("window refills"), std::string::npos) << r->err;
      EXPECT_NE(r->err.find("ms/token"), std::string::npos) << r->err;
    }
  }
}

TEST_F(SampleCli, BadInputs) {
  const CharTokenizer tok = CharTokenizer::fit("\n abcdefghijklmnopqr", "test vocabulary");
  Fixture f;
  CheckpointState st;
  st.config_toml = config_to_toml(f.c);
  const nlohmann::json tj = tok.to_json();
  const std::string ck = (dir_ / "ckpt_1").string();
  save_checkpoint(f.tr, st, ck, &tj);
  const CmdResult z = run_cmd("sample " + ck + " --prompt 'xyz' --tokens 5", dir_);  // x, y, z: not in the vocabulary
  EXPECT_EQ(z.status, 2);
  EXPECT_NE(z.err.find("loom: error"), std::string::npos) << z.err;
  EXPECT_EQ(z.out, "");
  for (const char* flag : {"--tokens", "--top-k", "--temperature", "--top-p", "--num-samples"}) {
    const CmdResult r = run_cmd("sample " + ck + " --prompt abc " + flag + " -1", dir_);
    EXPECT_EQ(r.status, 2) << flag;
    EXPECT_NE(r.err.find(flag), std::string::npos) << flag << ": " << r.err;
  }
  const std::string bare = (dir_ / "ckpt_2").string();
  save_checkpoint(f.tr, st, bare);  // no tokenizer
  const CmdResult n = run_cmd("sample " + bare + " --prompt abc", dir_);
  EXPECT_EQ(n.status, 2);
  EXPECT_NE(n.err.find("no tokenizer"), std::string::npos) << n.err;
  const CmdResult m = run_cmd("sample " + (dir_ / "nowhere").string(), dir_);
  EXPECT_EQ(m.status, 2) << m.err;
  const CmdResult both = run_cmd("sample " + ck + " --prompt abc --prompt-file " + ck + "/state.json", dir_);
  EXPECT_EQ(both.status, 2) << both.err;
  const CmdResult missing = run_cmd("sample " + ck + " --prompt-file " + (dir_ / "no_such.txt").string(), dir_);
  EXPECT_EQ(missing.status, 2) << missing.err;
  EXPECT_NE(missing.err.find("no_such.txt"), std::string::npos) << missing.err;
  // A prompt file the tokenizer cannot read (not UTF-8 here): the message names the file.
  std::ofstream(dir_ / "binary.txt", std::ios::binary) << std::string("\x9b\xff\x00\x01", 4);
  const CmdResult binary = run_cmd("sample " + ck + " --prompt-file " + (dir_ / "binary.txt").string(), dir_);
  EXPECT_EQ(binary.status, 2) << binary.err;
  EXPECT_NE(binary.err.find("--prompt-file " + (dir_ / "binary.txt").string()), std::string::npos) << binary.err;
}

}  // namespace
}  // namespace loom
