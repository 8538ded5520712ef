// Parity with the tutorial's own JAX/Flax code (tests/golden/, written by tools/jax_golden.py):
// loom loads the initial parameters JAX produced (stacked per layer, model.scan_layers = true)
// and the same batch, and must match the first step's loss and every parameter gradient, and
// the losses of five Adam steps with the tutorial's warmup-exponential-decay schedule:
// float32 loss and gradients to 1e-5 relative, 5-step losses to 1e-4; bfloat16 losses to 2e-2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "backend/registry.h"
#include "io/param_io.h"
#include "io/safetensors.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom {
namespace {

std::string golden(const std::string& name) { return std::string(LOOM_SOURCE_DIR) + "/tests/golden/" + name; }

Config parity_config(const std::string& dtype, int minibatches) {
  return default_config({"model.kind=transformer",
                         "model.dtype=" + dtype,
                         "model.hidden_size=64",
                         "model.num_layers=2",
                         "model.head_dim=16",
                         "model.mlp_expansion=4",
                         "model.vocab_size=97",
                         "model.num_outputs=97",
                         "model.max_seq_len=32",
                         "model.dropout_rate=0",
                         "model.softmax_dtype=float32",
                         "model.scan_layers=true",
                         "data.kind=random_tokens",
                         "data.batch_size=8",
                         "data.seq_len=32",
                         "data.vocab_size=97",
                         "optimizer.num_minibatches=" + std::to_string(minibatches),
                         "optimizer.name=adam",
                         "optimizer.learning_rate=1e-2",
                         "optimizer.schedule=warmup_exponential_decay",
                         "optimizer.init_value=0",
                         "optimizer.warmup_steps=2",
                         "optimizer.transition_steps=1",
                         "optimizer.decay_rate=0.99"});
}

std::vector<float> as_floats(const StTensor& t) {
  std::vector<float> v(static_cast<size_t>(t.shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_f32(t.bytes.data(), t.dtype, i);
  return v;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

struct Case {
  std::string dtype;
  int minibatches;
  double loss_tol, grad_tol, steps_tol;
};

class JaxParity : public ::testing::TestWithParam<Case> {};

TEST_P(JaxParity, LossGradientsAndFiveSteps) {
  const Case k = GetParam();
  const Config c = parity_config(k.dtype, k.minibatches);
  auto be = make_backend("cpu");
  Trainer t(c, *be);

  std::map<std::string, std::string> meta_init;
  const std::vector<StTensor> init = read_safetensors(golden("transformer_init.safetensors"), &meta_init);
  std::map<std::string, const StTensor*> by_name;
  for (const StTensor& s : init) by_name[s.name] = &s;
  import_params(t.executor(), by_name, /*scan_layers=*/true, "transformer_init.safetensors");

  Batch b;
  b.batch_size = 8;
  b.inputs = by_name.at("batch/inputs")->bytes;
  const StTensor& labels = *by_name.at("batch/labels");
  b.labels.resize(static_cast<size_t>(labels.shape.numel()));
  std::memcpy(b.labels.data(), labels.bytes.data(), labels.bytes.size());

  std::map<std::string, std::string> meta;
  const std::string variant = "transformer_" + k.dtype + "_mb" + std::to_string(k.minibatches) + ".safetensors";
  const std::vector<StTensor> want_grads = read_safetensors(golden(variant), &meta);
  const auto losses = nlohmann::json::parse(meta.at("losses")).get<std::vector<double>>();

  const StepReport first = t.step(b);
  const double loss1 = first.metrics.loss.mean();
  EXPECT_NEAR(loss1, std::stod(meta.at("loss_first")), k.loss_tol * losses[0]) << variant;

  // The gradient buffers still hold step 1's accumulated (averaged) gradients.
  std::map<std::string, std::vector<float>> got;
  for (const StTensor& s : export_params(t.executor(), true, /*grads=*/true, "grad/")) got[s.name] = as_floats(s);
  ASSERT_EQ(got.size(), want_grads.size());
  for (const StTensor& w : want_grads) {
    ASSERT_TRUE(got.count(w.name)) << w.name;
    EXPECT_LE(rel_l2(got[w.name], as_floats(w)), k.grad_tol) << variant << " " << w.name;
  }

  std::vector<double> ours{loss1};
  for (int s = 1; s < 5; ++s) ours.push_back(t.step(b).metrics.loss.mean());
  for (size_t s = 0; s < losses.size(); ++s)
    EXPECT_NEAR(ours[s], losses[s], k.steps_tol * losses[s]) << variant << " step " << s + 1;
}

INSTANTIATE_TEST_SUITE_P(Golden, JaxParity,
                         ::testing::Values(Case{"float32", 1, 1e-5, 1e-5, 1e-4}, Case{"float32", 2, 1e-5, 1e-5, 1e-4},
                                           Case{"bfloat16", 1, 2e-2, 5e-2, 2e-2},
                                           Case{"bfloat16", 2, 2e-2, 5e-2, 2e-2}),
                         [](const auto& info) {
                           return info.param.dtype + "_mb" + std::to_string(info.param.minibatches);
                         });

}  // namespace
}  // namespace loom
