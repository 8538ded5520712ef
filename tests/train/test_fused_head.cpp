// model.head_chunk: the output layer and the loss fused (linear_cross_entropy), its logits formed a
// chunk of vocabulary columns at a time, give the step the plain head and loss give: the same loss,
// accuracy and gradients (the hidden states' through every layer, the tied embedding's or the
// untied head's kernel and, with model.use_bias, its bias), with some labels ignored, a chunk that
// does not divide the vocabulary and two minibatches (the kernel's gradient assigned, then
// accumulated). Under LoRA the head's kernel (and bias) is frozen: its backward forms dx alone
// (linear_cross_entropy_grad_input), and the adapters' gradients are those of the plain head.
//
// The oracle is the plain head. On the reference backend the fused op has its rounding points
// (the logits, dlogits and both products rounded to the compute dtype where dense and the loss
// ops round them) and sums in the same order, so the step is bit for bit the same in float32 and
// bfloat16. On the CPU backend the products are split differently and the softmax statistics
// merged over chunks, which changes float32 rounding only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "data/data.h"
#include "report/memory_report.h"
#include "support/worst_rel.h"
#include "train/config.h"
#include "train/evaluator.h"
#include "train/trainer.h"

namespace loom {
namespace {

using testing::worst_rel;

// The heads compared: untied without a bias, untied with one (model.use_bias, every dense layer's
// too: a from-scratch tutorial model's), and tied (no bias whatever use_bias says).
struct HeadKind {
  bool tied, bias;
};
constexpr HeadKind kHeads[] = {{false, false}, {false, true}, {true, false}};

// One layer of 32, a vocabulary of 61 in chunks of 16 (the last one 13 wide), biases as `head`
// says; with `lora`, rank-4 adapters on every dense layer of the block, the rest (the head too) frozen.
Config tiny(const std::string& dtype, HeadKind head, int64_t chunk, bool lora = false) {
  return default_config({std::string("lora.rank=") + (lora ? "4" : "0"), "model.kind=transformer",
                         "model.hidden_size=32", "model.num_layers=1", "model.head_dim=8", "model.vocab_size=61",
                         "model.num_outputs=61", "model.max_seq_len=16", "model.dropout_rate=0",
                         std::string("model.use_bias=") + (head.bias ? "true" : "false"),
                         std::string("model.tie_embeddings=") + (head.tied ? "true" : "false"), "model.dtype=" + dtype,
                         "model.head_chunk=" + std::to_string(chunk), "data.kind=random_tokens", "data.batch_size=4",
                         "data.seq_len=16", "data.vocab_size=61", "optimizer.num_minibatches=2"});
}

struct Step {
  Metrics metrics;
  std::map<std::string, std::vector<float>> grads;
};

// One step of a freshly initialised model on `device`, every fifth label ignored.
Step first_step(const Config& c, const std::string& device) {
  auto be = make_backend(device);
  Trainer t(c, *be);
  Batch b = random_tokens_batch(c.data, data_context(c));
  for (size_t i = 0; i < b.labels.size(); i += 5) b.labels[i] = kIgnoreLabel;
  Step s{t.step(b).metrics, {}};
  const Graph& g = t.model().graph;
  for (const Param& p : g.params())
    if (p.trainable()) s.grads[g.value(p.value).name] = t.grad(g.value(p.value).name);
  return s;
}

std::string what(const std::string& dtype, HeadKind head, bool lora) {
  return dtype + (head.tied ? " tied" : " untied") + (head.bias ? " biased" : "") + (lora ? " LoRA" : "");
}

TEST(FusedHead, IsThePlainHeadBitForBitOnTheReference) {
  for (const std::string dtype : {"float32", "bfloat16"})
    for (HeadKind head : kHeads)
      for (bool lora : {false, true}) {
        const Step plain = first_step(tiny(dtype, head, 0, lora), "reference");
        const Step fused = first_step(tiny(dtype, head, 16, lora), "reference");
        EXPECT_GT(plain.metrics.loss.count, 0);
        EXPECT_LT(plain.metrics.loss.count, 64) << "some labels are ignored";
        EXPECT_EQ(fused.metrics.loss.count, plain.metrics.loss.count) << what(dtype, head, lora);
        EXPECT_EQ(fused.metrics.loss.sum, plain.metrics.loss.sum) << what(dtype, head, lora);
        EXPECT_EQ(fused.metrics.accuracy.sum, plain.metrics.accuracy.sum) << what(dtype, head, lora);
        ASSERT_EQ(fused.grads.size(), plain.grads.size()) << what(dtype, head, lora);
        if (lora) {  // the adapters alone train
          for (const auto& [name, g] : plain.grads) EXPECT_NE(name.find("/lora_"), std::string::npos) << name;
        }
        EXPECT_EQ(plain.grads.count("output_layer/bias"), head.bias && !lora ? 1u : 0u) << what(dtype, head, lora);
        for (const auto& [name, g] : plain.grads)
          EXPECT_EQ(fused.grads.at(name), g) << what(dtype, head, lora) << " " << name;
      }
}

// float32: the loss to 1e-6 and every gradient to 1e-5 of its tensor's largest (float32 rounding
// through one layer). bfloat16: a dlogit whose float32 value moved by an ulp may round to the other
// neighbouring bfloat16 value, a change of 2⁻⁸ in that element, so 1e-3.
TEST(FusedHead, IsThePlainHeadToFloat32RoundingOnTheCpu) {
  for (const std::string dtype : {"float32", "bfloat16"})
    for (HeadKind head : kHeads)
      for (bool lora : {false, true}) {
        const Step plain = first_step(tiny(dtype, head, 0, lora), "cpu");
        const Step fused = first_step(tiny(dtype, head, 16, lora), "cpu");
        const bool f32 = dtype == "float32";
        EXPECT_EQ(fused.metrics.loss.count, plain.metrics.loss.count) << what(dtype, head, lora);
        EXPECT_NEAR(fused.metrics.loss.sum, plain.metrics.loss.sum, 1e-6 * plain.metrics.loss.sum)
            << what(dtype, head, lora);
        EXPECT_NEAR(fused.metrics.accuracy.sum, plain.metrics.accuracy.sum, f32 ? 0 : 1) << what(dtype, head, lora);
        const double worst = worst_rel(fused.grads, plain.grads);
        std::printf("%s: gradients differ by at most %.3g of their tensor's largest\n", what(dtype, head, lora).c_str(),
                    worst);
        EXPECT_LT(worst, f32 ? 1e-5 : 1e-3) << what(dtype, head, lora);
      }
}

// A LoRA run's plan: with the head fused and frozen there are no [rows, V] logits, no gradient of
// them and no [C, V] kernel gradient, so the plan is smaller by at least the logits' bytes; the
// parameters, gradients and optimizer state (the adapters') are the plain head's.
TEST(FusedHead, ALoraRunsPlanIsSmallerByAtLeastTheLogits) {
  const int64_t rows = 4 * 64, V = 4096;
  for (const std::string dtype : {"float32", "bfloat16"})
    for (const std::string tied : {"false", "true"}) {
      const auto report = [&](int64_t chunk) {
        return memory_report(
            default_config({"lora.rank=4", "model.kind=transformer", "model.hidden_size=64", "model.num_layers=1",
                            "model.head_dim=16", "model.vocab_size=4096", "model.num_outputs=4096",
                            "model.max_seq_len=64", "model.use_bias=false", "model.tie_embeddings=" + tied,
                            "model.dtype=" + dtype, "model.head_chunk=" + std::to_string(chunk),
                            "data.kind=random_tokens", "data.batch_size=4", "data.seq_len=64", "data.vocab_size=4096"}),
            0);
      };
      const MemoryReport plain = report(0), fused = report(512);
      const int64_t logits = rows * V * (dtype == "float32" ? 4 : 2);
      std::printf("LoRA %s tied %s: plain %lld B, fused %lld B, saved %.2f × the logits (%lld B)\n", dtype.c_str(),
                  tied.c_str(), static_cast<long long>(plain.total_bytes), static_cast<long long>(fused.total_bytes),
                  static_cast<double>(plain.total_bytes - fused.total_bytes) / static_cast<double>(logits),
                  static_cast<long long>(logits));
      EXPECT_EQ(fused.params_bytes, plain.params_bytes);
      EXPECT_EQ(fused.grads_bytes, plain.grads_bytes);
      EXPECT_EQ(fused.optimizer_bytes, plain.optimizer_bytes);
      EXPECT_GE(plain.total_bytes - fused.total_bytes, logits) << dtype << " tied " << tied;
    }
}

// Every head fuses: an untied one with a bias (model.use_bias), a tied one, and a LoRA run's frozen
// one (with its bias) are accepted; a negative chunk is refused naming the key.
TEST(FusedHead, TakesBiasedHeadsAndRefusesANegativeChunkNamingTheKey) {
  const auto message = [](std::vector<std::string> overrides) -> std::string {
    try {
      default_config(overrides);
    } catch (const UserError& e) {
      return std::string(e.what()) + " " + e.hint();
    }
    return "";
  };
  const std::vector<std::string> base = {"model.kind=transformer", "data.kind=random_tokens", "data.seq_len=16",
                                         "data.vocab_size=16",     "model.head_chunk=8",      "model.use_bias=true"};
  EXPECT_EQ(message(base), "");
  std::vector<std::string> tied = base;
  tied.push_back("model.tie_embeddings=true");
  EXPECT_EQ(message(tied), "");
  std::vector<std::string> lora = base;
  lora.push_back("lora.rank=4");
  EXPECT_EQ(message(lora), "");
  std::vector<std::string> negative = base;
  negative.push_back("model.head_chunk=-1");
  EXPECT_NE(message(negative).find("model.head_chunk"), std::string::npos);
}

}  // namespace
}  // namespace loom
