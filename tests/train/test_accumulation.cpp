// The tutorial's gradient-accumulation experiment (seed 004): training the MLP classifier for 5
// steps on one fixed batch with 1 and with 4 minibatches gives the same metrics — to the printed
// precision in float32, within 1e-4 relative in bfloat16 — and the same parameters up to rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "backend/registry.h"
#include "data/data.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom {
namespace {

struct RunResult {
  Metrics metrics;
  std::vector<float> kernel0;
  std::vector<float> first_loss_per_step;
};

RunResult train_mlp(const std::string& device, const std::string& dtype, int minibatches, double dropout = 0.0) {
  Config c = default_config({"model.dtype=" + dtype, "optimizer.num_minibatches=" + std::to_string(minibatches),
                             "model.dropout_rate=" + std::to_string(dropout), "train.steps=5"});
  auto be = make_backend(device);
  Trainer t(c, *be);
  const Batch b = random_classification_batch(c.data, data_context(c));
  RunResult r;
  for (int s = 0; s < 5; ++s) {
    const Metrics m = t.step(b).metrics;
    r.first_loss_per_step.push_back(static_cast<float>(m.loss.mean()));
    r.metrics += m;
  }
  r.kernel0 = t.param("Dense_0/kernel");
  return r;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 0;
  for (float x : b) scale = std::max(scale, static_cast<double>(std::fabs(x)));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]) / scale);
  return worst;
}

TEST(Accumulation, Float32MetricsMatchToPrintedPrecision) {
  const RunResult one = train_mlp("cpu", "float32", 1);
  const RunResult four = train_mlp("cpu", "float32", 4);
  EXPECT_EQ(format_metrics(one.metrics), format_metrics(four.metrics));
  EXPECT_LT(max_rel_diff(four.kernel0, one.kernel0), 1e-5);
  EXPECT_EQ(one.metrics.loss.count, 5 * 512);
  // Training works: the loss falls over the five steps.
  EXPECT_LT(one.first_loss_per_step.back(), one.first_loss_per_step.front());
}

TEST(Accumulation, Bfloat16MetricsAgreeWithin1e4) {
  const RunResult one = train_mlp("cpu", "bfloat16", 1);
  const RunResult four = train_mlp("cpu", "bfloat16", 4);
  for (const auto& [k, field] : loom::kMetricFields) {
    const double a = (one.metrics.*field).mean(), b = (four.metrics.*field).mean();
    EXPECT_LE(std::fabs(a - b), 1e-4 * std::fabs(a)) << k << ": " << a << " vs " << b;
  }
}

TEST(Accumulation, ReferenceBackendAgreesWithCpu) {
  const RunResult cpu = train_mlp("cpu", "float32", 2);
  const RunResult ref = train_mlp("reference", "float32", 2);
  for (size_t s = 0; s < cpu.first_loss_per_step.size(); ++s)
    EXPECT_NEAR(cpu.first_loss_per_step[s], ref.first_loss_per_step[s], 1e-5 * std::fabs(ref.first_loss_per_step[s]));
  EXPECT_LT(max_rel_diff(cpu.kernel0, ref.kernel0), 1e-4);
}

TEST(Accumulation, DropoutIsDeterministicAndActive) {
  const RunResult a = train_mlp("cpu", "float32", 2, 0.3);
  const RunResult b = train_mlp("cpu", "float32", 2, 0.3);
  const RunResult off = train_mlp("cpu", "float32", 2, 0.0);
  EXPECT_EQ(a.kernel0, b.kernel0) << "same seed must give bit-identical training";
  EXPECT_NE(a.kernel0, off.kernel0) << "dropout 0.3 must change training";
}

// A step zeroes only the gradients whose first writer does not assign: the ones scatter-added by
// embedding_grad first (token and position tables). With tied embeddings the output layer's
// dense_grad_weight writes the token table's gradient before the embedding's scatter-add, so that
// one is assigned, not zeroed. Every other gradient's first writer is a grad_accumulate or a
// dense_grad_weight marked to assign, and no later writer assigns.
TEST(Accumulation, OnlyScatterAddedGradientsAreZeroedBeforeAStep) {
  auto zeroed = [](bool tied) {
    const TrainProgram p = build_train_program(default_config(
        {"model.kind=transformer", "model.hidden_size=32", "model.num_layers=2", "model.head_dim=8",
         "model.vocab_size=31", "model.num_outputs=31", "model.max_seq_len=16", "data.kind=random_tokens",
         "data.batch_size=4", "data.seq_len=16", "data.vocab_size=31", "model.block_order=attn_first",
         std::string("model.tie_embeddings=") + (tied ? "true" : "false")}));
    const Graph& g = p.model.graph;
    std::set<ValueId> first_seen;
    for (NodeId id : p.schedule) {
      const Node& n = g.node(id);
      if (!(op_info(n.op).flags & kOpWritesInput0)) continue;
      const bool first = first_seen.insert(n.in[0]).second;
      if (n.op == OpKind::grad_accumulate) {
        EXPECT_EQ(std::get<GradAccumulateAttrs>(n.attrs).assign_in_first_minibatch, first) << n.scope;
      }
      if (n.op == OpKind::dense_grad_weight) {
        EXPECT_EQ(std::get<DenseGradWeightAttrs>(n.attrs).assign_in_first_minibatch, first) << n.scope;
      }
    }
    EXPECT_EQ(first_seen.size(), g.params().size()) << "every parameter gets a gradient";
    std::set<std::string> names;
    for (ValueId v : p.zero_grads) names.insert(g.value(v).name);
    return names;
  };
  EXPECT_EQ(zeroed(false), (std::set<std::string>{"embed/embedding@grad", "pos_emb@grad"}));
  EXPECT_EQ(zeroed(true), (std::set<std::string>{"pos_emb@grad"}));
}

}  // namespace
}  // namespace loom
