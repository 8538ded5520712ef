// LoRA (nn/lora.h): adapters on the dense layers of a frozen transformer.
//   - the base is frozen: no gradient value, no optimizer state and no weight-gradient product for
//     any base parameter; the gradients and optimizer state are the adapters' alone;
//   - a fresh adapter (B = 0) leaves the step-0 loss bit-identical to the base model's;
//   - training lowers the loss and leaves every base parameter bit-identical, in float32 and
//     bfloat16, with Adam and with SGD with momentum and clipping;
//   - remat changes no bit of the adapters (two minibatches, adapter dropout on);
//   - PEFT's targets: q_proj alone adapts the q columns of the packed qkv only, c_attn has one A
//     for all three; names the family lacks are errors.
#include <gtest/gtest.h>

#include <set>

#include "backend/registry.h"
#include "core/error.h"
#include "nn/models.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom {
namespace {

std::vector<std::string> tiny(const std::string& dtype, const std::string& mlp, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {
      "model.kind=transformer", "model.dtype=" + dtype,        "model.hidden_size=32", "model.num_layers=2",
      "model.head_dim=8",       "model.vocab_size=31",         "model.num_outputs=31", "model.max_seq_len=16",
      "model.mlp=" + mlp,       "data.kind=random_tokens",     "data.batch_size=4",    "data.seq_len=16",
      "data.vocab_size=31",     "optimizer.learning_rate=0.01"};
  if (mlp == "swiglu")
    for (const char* kv : {"model.norm=rmsnorm", "model.position=rope", "model.num_kv_heads=2", "model.use_bias=false"})
      o.push_back(kv);
  for (std::string& e : extra) o.push_back(std::move(e));
  return o;
}

std::vector<std::string> with_lora(std::vector<std::string> o, const std::string& targets = "all-linear") {
  for (std::string kv : {std::string("lora.rank=4"), std::string("lora.alpha=8"), "lora.targets=" + targets})
    o.push_back(std::move(kv));
  return o;
}

bool is_adapter(const std::string& path) { return path.find("/lora_") != std::string::npos; }

struct Trained {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;  // every parameter after the last step
};

Trained train(const std::vector<std::string>& overrides, int steps) {
  const Config c = default_config(overrides);
  auto be = make_backend("cpu");
  Trainer t(c, *be);
  const Batch b = make_batch(c.data, data_context(c));
  Trained r;
  for (int s = 0; s < steps; ++s) r.losses.push_back(t.step(b).metrics.loss.mean());
  const Graph& g = t.model().graph;
  for (const Param& p : g.params()) r.params[g.value(p.value).name] = t.param(g.value(p.value).name);
  return r;
}

TEST(Lora, OnlyTheAdaptersHaveGradientsAndOptimizerState) {
  for (const std::string mlp : {"swiglu", "gelu_tanh"}) {
    const Config c = default_config(with_lora(tiny("float32", mlp)));
    auto be = make_backend("cpu");
    Trainer t(c, *be);
    const Graph& g = t.model().graph;
    int64_t adapter_elems = 0, adapters = 0;
    for (const Param& p : g.params()) {
      const Value& v = g.value(p.value);
      EXPECT_EQ(p.trainable(), is_adapter(v.name)) << v.name;
      if (p.trainable()) adapter_elems += v.shape.numel(), ++adapters;
    }
    EXPECT_GT(adapters, 0);
    int64_t grad_values = 0, weight_products = 0;
    for (const Value& v : g.values()) grad_values += v.kind == ValueKind::grad;
    for (const Node& n : g.nodes()) weight_products += n.op == OpKind::dense_grad_weight;
    EXPECT_EQ(grad_values, adapters) << mlp;
    EXPECT_EQ(weight_products, adapters) << mlp
                                         << ": one weight-gradient product per adapter matrix, none for the base";
    EXPECT_EQ(t.plan().grad_bytes, adapter_elems * 4) << mlp;
    int64_t state = 0;
    for (const OptimSlice& s : t.optimizer().slices()) {
      EXPECT_TRUE(is_adapter(g.value(g.params()[s.param].value).name));
      state += s.n;
    }
    EXPECT_EQ(state, adapter_elems) << mlp;
  }
}

TEST(Lora, FreshAdaptersLeaveTheStepZeroLossAsTheBaseModels) {
  for (const std::string mlp : {"swiglu", "gelu_tanh"})
    for (const std::string dtype : {"float32", "bfloat16"}) {
      const Trained base = train(tiny(dtype, mlp), 1), lora = train(with_lora(tiny(dtype, mlp)), 1);
      EXPECT_EQ(lora.losses, base.losses) << mlp << " " << dtype;
    }
}

TEST(Lora, TrainingLowersTheLossAndLeavesTheBaseBitIdentical) {
  for (const std::string mlp : {"swiglu", "gelu_tanh"})
    for (const std::string dtype : {"float32", "bfloat16"})
      for (const std::string opt : {"adamw", "sgd"}) {
        std::vector<std::string> extra = {"optimizer.name=" + opt, "optimizer.clip_norm=1", "lora.dropout=0.1"};
        if (opt == "sgd")
          for (const char* kv : {"optimizer.momentum=0.9", "optimizer.learning_rate=0.3"}) extra.push_back(kv);
        const std::vector<std::string> o = tiny(dtype, mlp, extra);
        const std::string what = mlp + " " + dtype + " " + opt;
        const Trained init = train(with_lora(o), 0), r = train(with_lora(o), 12);
        EXPECT_LT(r.losses.back(), r.losses.front() - 0.1) << what;
        for (const auto& [path, values] : init.params) {
          if (is_adapter(path))
            EXPECT_NE(r.params.at(path), values) << what << ": " << path << " trains";
          else
            EXPECT_EQ(r.params.at(path), values) << what << ": " << path << " is frozen";
        }
      }
}

std::map<std::string, std::vector<float>> adapters(const Trained& r) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [path, v] : r.params)
    if (is_adapter(path)) out[path] = v;
  return out;
}

TEST(Lora, RematChangesNoAdapterBit) {
  for (const std::string dtype : {"float32", "bfloat16"}) {
    const std::vector<std::string> o = tiny(dtype, "swiglu", {"lora.dropout=0.1", "optimizer.num_minibatches=2"});
    const Trained none = train(with_lora(o), 3);
    for (const std::string remat : {"MLP,Attn", "Block"}) {
      std::vector<std::string> r = with_lora(o);
      r.push_back("model.remat=" + remat);
      EXPECT_TRUE(adapters(train(r, 3)) == adapters(none)) << dtype << " remat " << remat;
    }
  }
}

// q_proj alone: its own A and B, and the only add_low_rank nodes write columns [0, G·D) of each
// key/value head of the packed qkv (tools/check_peft.py checks the numbers against PEFT).
TEST(Lora, QProjAloneAdaptsTheQueryColumnsOnly) {
  const Config c = default_config(with_lora(tiny("float32", "swiglu"), "q_proj"));
  const Graph g = nn::build_model(c.model, model_input(c, 4), true).graph;
  std::set<std::string> adapter_params;
  for (const Param& p : g.params())
    if (p.trainable()) adapter_params.insert(g.value(p.value).name);
  EXPECT_EQ(adapter_params,
            (std::set<std::string>{"block_0/attn/qkv/lora_q_proj/a", "block_0/attn/qkv/lora_q_proj/b",
                                   "block_1/attn/qkv/lora_q_proj/a", "block_1/attn/qkv/lora_q_proj/b"}));
  int columns = 0;
  for (const Node& n : g.nodes())
    if (n.op == OpKind::add_low_rank) {
      const auto& a = std::get<ColumnsAttrs>(n.attrs);
      // H = 4 heads in KV = 2 groups: qkv [.., 2, (2+2)·8], the queries columns [0, 16).
      EXPECT_EQ(g.value(n.in[0]).shape.last(), 32);
      EXPECT_EQ(a.offset, 0);
      EXPECT_EQ(a.width, 16);
      EXPECT_EQ(a.scale, 2.f);
      ++columns;
    }
  EXPECT_EQ(columns, 2);
}

TEST(Lora, CAttnSharesOneAAcrossQKV) {
  const Config c = default_config(with_lora(tiny("float32", "gelu_tanh"), "c_attn"));
  const Graph g = nn::build_model(c.model, model_input(c, 4), true).graph;
  std::set<std::string> names;
  for (const Param& p : g.params())
    if (p.trainable() && g.value(p.value).name.starts_with("block_0/")) names.insert(g.value(p.value).name);
  EXPECT_EQ(names, (std::set<std::string>{"block_0/attn/qkv/lora_c_attn/a", "block_0/attn/qkv/lora_c_attn/b_q",
                                          "block_0/attn/qkv/lora_c_attn/b_k", "block_0/attn/qkv/lora_c_attn/b_v"}));
}

TEST(Lora, NamesTheFamilyLacksAreErrors) {
  auto message = [](const std::vector<std::string>& o) {
    try {
      validate_config(default_config(o));
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(with_lora(tiny("float32", "swiglu"), "c_attn")).find("lora.targets"), std::string::npos);
  EXPECT_NE(message(with_lora(tiny("float32", "gelu_tanh"), "q_proj")).find("lora.targets"), std::string::npos);
  EXPECT_EQ(message(with_lora(tiny("float32", "gelu_tanh"), "c_attn,c_fc")), "");
}

}  // namespace
}  // namespace loom
