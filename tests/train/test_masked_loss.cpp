// One normalisation (train/trainer.h): with labels masked (data/data.h's kIgnoreLabel) the loss
// is the sum of the target tokens' losses over the global batch divided by their number, and so
// is its gradient, however the targets are spread over minibatches.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include <filesystem>

#include "backend/registry.h"
#include "data/data.h"
#include "support/chat_dir.h"
#include "support/worst_rel.h"
#include "train/config.h"
#include "train/evaluator.h"
#include "train/trainer.h"

namespace loom {
namespace {

using testing::worst_rel;

constexpr int64_t kRows = 4, kT = 16;

Config tiny(int minibatches) {
  return default_config({"model.kind=transformer", "model.hidden_size=32", "model.num_layers=2", "model.head_dim=8",
                         "model.vocab_size=31", "model.num_outputs=31", "model.max_seq_len=16",
                         "model.block_order=attn_first", "model.dropout_rate=0", "data.kind=random_tokens",
                         "data.batch_size=4", "data.seq_len=16", "data.vocab_size=31",
                         "optimizer.num_minibatches=" + std::to_string(minibatches)});
}

// `b` with the labels at positions where keep(row, t) is false ignored.
template <class Keep>
Batch masked(Batch b, Keep keep) {
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t t = 0; t < kT; ++t)
      if (!keep(r, t)) b.labels[static_cast<size_t>(r * kT + t)] = kIgnoreLabel;
  return b;
}

struct Step {
  Metrics metrics;
  std::map<std::string, std::vector<float>> grads;
};

// One step of a freshly initialised model (the same initial parameters every time).
Step first_step(const Config& c, const Batch& b) {
  auto be = make_backend("cpu");
  Trainer t(c, *be);
  Step s{t.step(b).metrics, {}};
  const Graph& g = t.model().graph;
  for (const Param& p : g.params()) s.grads[g.value(p.value).name] = t.grad(g.value(p.value).name);
  return s;
}

// Linearity is the oracle: a mask M and its complement split the unmasked batch's tokens, so
// their loss sums add up to the unmasked one, and count × gradient (the gradient of the sum) too.
// A loss divided by anything other than the number of targets (all tokens, say) breaks the second
// identity; one divided per minibatch breaks the next test.
TEST(MaskedLoss, IsTheSumOverTargetsDividedByTheirCount) {
  const Config c = tiny(1);
  const Batch all = random_tokens_batch(c.data, data_context(c));
  const auto in_m = [](int64_t r, int64_t t) { return (r * 5 + t * 3 + t * t) % 7 < 2 + r; };
  const Step whole = first_step(c, all);
  const Step m = first_step(c, masked(all, in_m));
  const Step rest = first_step(c, masked(all, [&](int64_t r, int64_t t) { return !in_m(r, t); }));
  int64_t in_m_count = 0;
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t t = 0; t < kT; ++t) in_m_count += in_m(r, t);
  ASSERT_GT(in_m_count, 0);
  ASSERT_LT(in_m_count, kRows * kT);
  EXPECT_EQ(m.metrics.loss.count, in_m_count);
  EXPECT_EQ(rest.metrics.loss.count, kRows * kT - in_m_count);
  EXPECT_EQ(m.metrics.accuracy.count, in_m_count);
  EXPECT_EQ(whole.metrics.loss.count, kRows * kT);
  EXPECT_NEAR(m.metrics.loss.sum + rest.metrics.loss.sum, whole.metrics.loss.sum, 1e-5 * whole.metrics.loss.sum);
  EXPECT_EQ(m.metrics.accuracy.sum + rest.metrics.accuracy.sum, whole.metrics.accuracy.sum);
  std::map<std::string, std::vector<float>> summed;
  for (const auto& [name, g] : whole.grads) {
    std::vector<float>& s = summed[name];
    const auto& a = m.grads.at(name);
    const auto& b = rest.grads.at(name);
    for (size_t i = 0; i < g.size(); ++i)
      s.push_back(static_cast<float>((static_cast<double>(a[i]) * static_cast<double>(m.metrics.loss.count) +
                                      static_cast<double>(b[i]) * static_cast<double>(rest.metrics.loss.count)) /
                                     static_cast<double>(kRows * kT)));
  }
  const double worst = worst_rel(summed, whole.grads);
  std::printf("count-weighted masked gradients against the whole batch's: worst %.3g\n", worst);
  EXPECT_LT(worst, 1e-5);
}

// Targets spread very unevenly over the minibatches (a whole row, one token, none, a third):
// 1, 2 and 4 minibatches give the same loss, counts and gradients to float32 rounding.
TEST(MaskedLoss, AnyMinibatchSplitGivesTheSameStep) {
  const Config c1 = tiny(1);
  const Batch b = masked(random_tokens_batch(c1.data, data_context(c1)),
                         [](int64_t r, int64_t t) { return r == 0 || (r == 1 && t == 9) || (r == 3 && t % 3 == 0); });
  const Step one = first_step(c1, b);
  EXPECT_EQ(one.metrics.loss.count, 16 + 1 + 6);
  for (int mb : {2, 4}) {
    const Step s = first_step(tiny(mb), b);
    EXPECT_EQ(s.metrics.loss.count, one.metrics.loss.count) << mb;
    EXPECT_EQ(s.metrics.accuracy.sum, one.metrics.accuracy.sum) << mb;
    EXPECT_NEAR(s.metrics.loss.mean(), one.metrics.loss.mean(), 1e-6 * one.metrics.loss.mean()) << mb;
    const double worst = worst_rel(s.grads, one.grads);
    std::printf("%d minibatches against 1: gradients differ by at most %.3g of their tensor's largest\n", mb, worst);
    EXPECT_LT(worst, 1e-5) << mb;
  }
}

// A batch without a single target has a zero loss and zero gradients (no division by zero).
TEST(MaskedLoss, ABatchWithoutTargetsHasNoGradient) {
  const Config c = tiny(2);
  const Step s =
      first_step(c, masked(random_tokens_batch(c.data, data_context(c)), [](int64_t, int64_t) { return false; }));
  EXPECT_EQ(s.metrics.loss.count, 0);
  EXPECT_EQ(s.metrics.loss.sum, 0);
  for (const auto& [name, g] : s.grads)
    for (float x : g) ASSERT_EQ(x, 0.f) << name;
}

// The validation loss has the same convention: over chat data whose val mask is M, its
// complement or all ones, the evaluator's sums and counts split as the tokens do, and its counts
// are the targets of one pass over the split's rows (examples of 17 tokens, one row of 16
// positions each, and a last one of 13), whatever the iterations asked for.
TEST(MaskedLoss, ValidationCountsAndAveragesTargetTokens) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("loom_test_masked_val_" + std::to_string(getpid()));
  testing::ChatSplitData train, val[3];
  for (uint16_t i = 0; i < 200; ++i) {
    train.tokens.push_back(static_cast<uint16_t>(1 + (i * 7 + i / 3) % 30));
    train.mask.push_back(1);
  }
  for (int k = 0; k < 3; ++k) {
    val[k].tokens = train.tokens;
    for (size_t i = 0; i < train.tokens.size(); ++i) {
      const bool m = (i * i + i / 4) % 5 < 2;
      val[k].mask.push_back(k == 2 || (k == 0) == m ? 1 : 0);
    }
    for (uint64_t d = 0; d < train.tokens.size(); d += 17) val[k].docs.push_back(d);
    val[k].docs.push_back(train.tokens.size());
  }
  Metrics got[3];
  int64_t want_count[3] = {0, 0, 0};
  for (int k = 0; k < 3; ++k) {
    const fs::path dir = root / std::to_string(k);
    testing::write_chat_dir(dir, train, val[k], 31, nlohmann::json::object());
    Config c = tiny(2);
    c.data.kind = DataKind::tokens;
    c.data.dir = dir.string();
    auto be = make_backend("cpu");
    Trainer t(c, *be);
    Evaluator ev(t, *be);
    DataSource data(c.data, data_context(c));
    got[k] = ev.validation(data, 3);  // every example once, its tokens after the first predicted
    for (size_t e = 0; e + 1 < val[k].docs.size(); ++e)
      for (uint64_t i = val[k].docs[e] + 1; i < val[k].docs[e + 1]; ++i) want_count[k] += val[k].mask[i];
  }
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(got[k].loss.count, want_count[k]) << k;
    EXPECT_EQ(got[k].accuracy.count, want_count[k]) << k;
  }
  ASSERT_GT(want_count[0], 0);
  ASSERT_GT(want_count[1], 0);
  EXPECT_NEAR(got[0].loss.sum + got[1].loss.sum, got[2].loss.sum, 1e-5 * got[2].loss.sum);
  EXPECT_EQ(got[0].accuracy.sum + got[1].accuracy.sum, got[2].accuracy.sum);
  fs::remove_all(root);
}

}  // namespace
}  // namespace loom
