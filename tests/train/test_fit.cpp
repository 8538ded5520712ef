// model.remat = auto (train/fit.h):
//   - optimal: on 2- and 3-layer Transformers, at every budget between the smallest and the largest
//     total of all per-layer combinations of the options, the planner's recomputed FLOPs equal the
//     least of any combination that fits (exhaustive search over all of them, each planned); with
//     model.head_chunk = auto (2 layers: tied, untied with a bias, and LoRA) the combinations take
//     every head too, and some budget needs a chunk;
//   - exact: its choice's total is the one `loom memory` reports for the applied configuration, and
//     is within the budget;
//   - when no remat choice fits, more minibatches; when nothing fits, an error naming the smallest
//     total (human units and exact bytes);
//   - proven least at depth: the lower bound the search discards layouts by never exceeds the plan
//     (random layouts of small and real shapes); on 5 layers it equals the least of every multiset
//     of the options in both orders; at 12 layers every frontier point is proven least;
//   - the same search at every batch: the levels do not change with the batch or the minibatch
//     count, and more minibatches of the same size never recompute less per minibatch than fewer
//     at a budget both fit (real shapes);
//   - a Trainer with model.remat = auto runs the choice, with the gradients of no remat, and says
//     it in one line (choice, planned total of the budget, recompute).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <set>

#include "backend/registry.h"
#include "core/error.h"
#include "core/format.h"
#include "nn/models/transformer/transformer.h"
#include "report/memory_report.h"
#include "support/files.h"
#include "train/config.h"
#include "train/fit.h"
#include "train/trainer.h"

namespace loom {
namespace {

// The head is untied with a bias (model.use_bias's default), or with head_chunk = auto tied unless
// `tied` is false; `lora`: rank-4 adapters, the rest (the head too) frozen.
Config tiny(int layers, int minibatches = 1, const std::string& head_chunk = "0", bool lora = false, bool tied = true) {
  return default_config({fmt::format("lora.rank={}", lora ? 4 : 0),
                         fmt::format("model.tie_embeddings={}", head_chunk == "auto" && tied), "model.kind=transformer",
                         "model.dtype=float32", "model.hidden_size=32", fmt::format("model.num_layers={}", layers),
                         "model.head_dim=8", "model.vocab_size=61", "model.num_outputs=61", "model.max_seq_len=16",
                         "data.kind=random_tokens", "data.batch_size=4", "data.seq_len=16", "data.vocab_size=61",
                         fmt::format("optimizer.num_minibatches={}", minibatches), "model.remat=auto",
                         fmt::format("model.head_chunk={}", head_chunk), "threads=1"});
}

struct Combo {
  int64_t total;
  double flops;
  int64_t head_chunk;
  std::string what;  // for failure messages
};

// Every per-layer combination of the options with every head, planned.
std::vector<Combo> exhaustive(Fitter& f) {
  std::vector<Combo> out;
  const size_t L = static_cast<size_t>(f.num_layers()), K = f.options().size();
  for (int64_t head : f.head_chunks()) {
    std::vector<size_t> idx(L, 0);
    while (true) {
      std::vector<LayerRemat> layers;
      for (size_t i : idx) layers.push_back(f.options()[i]);
      const FitChoice c = f.plan(layers, 1, head);
      out.push_back({c.total_bytes, c.recompute_flops, head, describe_choice(c)});
      size_t i = 0;
      while (i < L && ++idx[i] == K) idx[i++] = 0;
      if (i == L) break;
    }
  }
  return out;
}

void expect_optimal(int layers, const std::string& head_chunk, bool lora = false, bool tied = true) {
  const Config c = tiny(layers, 1, head_chunk, lora, tied);
  Fitter f(c);
  const std::vector<Combo> all = exhaustive(f);
  std::set<int64_t> budgets;
  for (const Combo& x : all) budgets.insert(x.total);
  ASSERT_GT(budgets.size(), 4u);
  int needs_chunk = 0;  // budgets where only a fused head reaches the least FLOPs
  for (int64_t budget : budgets) {
    double best = 1e300, best_plain = 1e300;
    std::string best_what;
    for (const Combo& x : all)
      if (x.total <= budget) {
        if (x.flops < best) best_what = x.what;
        best = std::min(best, x.flops);
        if (x.head_chunk == 0) best_plain = std::min(best_plain, x.flops);
      }
    needs_chunk += best < best_plain;
    Fitter fresh(c);
    const FitChoice got = fresh.fit(budget);
    EXPECT_EQ(got.num_minibatches, 1) << budget;
    EXPECT_LE(got.total_bytes, budget);
    EXPECT_EQ(got.recompute_flops, best) << layers << " layers, budget " << budget << ": chose "
                                         << describe_choice(got) << "; least: " << best_what;
  }
  if (head_chunk == "auto") {
    EXPECT_EQ(f.head_chunks(), (std::vector<int64_t>{0, 8, 2}));  // V = 61: 0, bit_floor(61 / 4), a quarter
    EXPECT_GT(needs_chunk, 0) << "no budget where the head chunk matters: the test would not see it";
  }
}

TEST(Fit, OptimalAgainstExhaustiveSearchTwoLayers) { expect_optimal(2, "0"); }
TEST(Fit, OptimalAgainstExhaustiveSearchThreeLayers) { expect_optimal(3, "0"); }
TEST(Fit, OptimalWithTheHeadChunkAgainstExhaustiveSearchTwoLayers) { expect_optimal(2, "auto"); }
// A LoRA run's frozen head is fused too (its backward forms dx alone): auto tries its chunks.
TEST(Fit, OptimalWithTheHeadChunkUnderLoraTwoLayers) { expect_optimal(2, "auto", /*lora=*/true); }
// An untied head with a bias (a from-scratch tutorial model's) fuses too: auto tries its chunks.
TEST(Fit, OptimalWithABiasedUntiedHeadChunkTwoLayers) { expect_optimal(2, "auto", /*lora=*/false, /*tied=*/false); }

// The bound the search discards layouts by (Fitter::lower_bound) never exceeds the plan's total, on
// random per-layer layouts of 3- and 4-layer models: plain, fused and LoRA heads, two minibatches,
// one rank of two with sharded optimizer state and gradients or parameters (gradients and
// parameters in the arena). It is not trivial: above the fixed part.
TEST(Fit, LowerBoundNeverExceedsThePlan) {
  std::mt19937 rng(7);
  const auto sharded = [](OptimizerShard shard) {
    Config c = tiny(4);
    c.optimizer.shard = shard;
    return c;
  };
  for (const auto& [c, ranks] :
       std::vector<std::pair<Config, int>>{{tiny(3), 1},
                                           {tiny(4), 1},
                                           {tiny(4, 2), 1},
                                           {tiny(3, 1, "auto"), 1},
                                           {tiny(3, 1, "auto", /*lora=*/true), 1},
                                           {tiny(4, 1, "auto", /*lora=*/false, /*tied=*/false), 1},
                                           {sharded(OptimizerShard::state_grads), 2},
                                           {sharded(OptimizerShard::params), 2}}) {
    Fitter f(c, ranks);
    const auto L = static_cast<size_t>(f.num_layers());
    const int64_t mb = c.optimizer.num_minibatches;
    for (int64_t head : f.head_chunks())
      for (int i = 0; i < 40; ++i) {
        std::vector<LayerRemat> layers;
        for (size_t l = 0; l < L; ++l) layers.push_back(f.options()[rng() % f.options().size()]);
        const FitChoice p = f.plan(layers, mb, head);
        const int64_t bound = f.lower_bound(layers, mb, head);
        EXPECT_LE(bound, p.total_bytes) << describe_choice(p);
        EXPECT_GT(bound, p.fixed_bytes) << describe_choice(p);
      }
  }
}

// The same on the shapes users fit (GPT-2 124M, the tutorial Transformer, Llama 3.1 8B's
// dimensions) at 3 and 5 layers, where the head, not a layer, may hold the peak.
TEST(Fit, LowerBoundNeverExceedsThePlanOnRealShapes) {
  std::mt19937 rng(11);
  for (const char* file : {"configs/gpt2_124m.toml", "configs/tutorial_transformer.toml", "bench/qlora_llama8b.toml"})
    for (int layers : {3, 5}) {
      const Config c = load_config(std::string(LOOM_SOURCE_DIR) + "/" + file,
                                   {fmt::format("model.num_layers={}", layers), "lora.rank=0", "model.remat=auto"});
      Fitter f(c);
      for (int i = 0; i < 12; ++i) {
        std::vector<LayerRemat> l;
        for (int j = 0; j < layers; ++j) l.push_back(f.options()[rng() % f.options().size()]);
        const FitChoice p = f.plan(l, c.optimizer.num_minibatches, 0);
        EXPECT_LE(f.lower_bound(l, c.optimizer.num_minibatches, 0), p.total_bytes)
            << file << ": " << describe_choice(p);
      }
    }
}

// At 5 layers, at every fourth of the totals of every multiset of the options (each laid out in
// option order and reversed, planned), the planner's recomputed FLOPs equal the least of those that
// fit, and its answer is proven least.
TEST(Fit, OptimalAgainstEveryMultisetFiveLayers) {
  const Config c = tiny(5);
  Fitter f(c);
  const size_t L = 5, K = f.options().size();
  std::vector<Combo> all;
  std::vector<size_t> idx(L, 0);
  std::function<void(size_t, size_t)> multisets = [&](size_t at, size_t from) {
    if (at == L) {
      std::vector<LayerRemat> layers;
      for (size_t i : idx) layers.push_back(f.options()[i]);
      for (int order = 0; order < 2; ++order) {
        const FitChoice p = f.plan(layers, 1, 0);
        all.push_back({p.total_bytes, p.recompute_flops, 0, describe_choice(p)});
        std::reverse(layers.begin(), layers.end());
      }
      return;
    }
    for (size_t k = from; k < K; ++k) {
      idx[at] = k;
      multisets(at + 1, k);
    }
  };
  multisets(0, 0);
  std::set<int64_t> budgets;
  for (const Combo& x : all) budgets.insert(x.total);
  ASSERT_GT(budgets.size(), 400u);
  size_t i = 0;
  for (int64_t budget : budgets) {
    if (i++ % 4) continue;
    double best = 1e300;
    for (const Combo& x : all)
      if (x.total <= budget) best = std::min(best, x.flops);
    Fitter fresh(c);
    const FitChoice got = fresh.fit(budget);
    EXPECT_EQ(got.recompute_flops, best) << budget << ": chose " << describe_choice(got);
    EXPECT_TRUE(got.proven_least) << budget;
    EXPECT_LE(got.total_bytes, budget);
  }
}

// Deep: at 12 layers every frontier point is proven least (every multiset of fewer FLOPs ruled
// out by the bound or its plan), fits its budget, and no single option on every layer that
// recomputes less fits it.
TEST(Fit, DeepFrontierIsProvenLeast) {
  Fitter f(tiny(12));
  for (const Fitter::FitPoint& p : f.frontier(6)) {
    EXPECT_TRUE(p.choice.proven_least) << p.budget << ": " << describe_choice(p.choice);
    EXPECT_LE(p.choice.total_bytes, p.budget);
    for (const LayerRemat& o : f.options()) {
      const FitChoice u = f.plan(std::vector<LayerRemat>(12, o), p.choice.num_minibatches, p.choice.head_chunk);
      if (u.total_bytes <= p.budget) {
        EXPECT_GE(u.recompute_flops, p.choice.recompute_flops) << describe_choice(u);
      }
    }
  }
}

// Very deep: at 200 layers the search is cut short (too many multisets to rule out), and the
// answer is still no worse than any single option on every layer that fits the budget, never the
// heaviest remat merely because it was the first plan known to fit.
TEST(Fit, ACutSearchStillBeatsEveryUniformChoiceThatFits) {
  constexpr int kLayers = 200;
  Fitter f(load_config(std::string(LOOM_SOURCE_DIR) + "/configs/shakespeare_char.toml",
                       {fmt::format("model.num_layers={}", kLayers), "data.batch_size=2", "data.seq_len=16",
                        "model.remat=auto", "threads=1"}));
  std::vector<FitChoice> uniform;
  for (const LayerRemat& o : f.options()) uniform.push_back(f.plan(std::vector<LayerRemat>(kLayers, o), 1, 0));
  std::sort(uniform.begin(), uniform.end(),
            [](const FitChoice& a, const FitChoice& b) { return a.recompute_flops < b.recompute_flops; });
  for (const FitChoice& u : uniform) {
    if (u.recompute_flops == 0 || u.total_bytes >= uniform.front().total_bytes) continue;  // no remat fits it too
    const FitChoice chosen = f.fit(u.total_bytes);
    EXPECT_LE(chosen.total_bytes, u.total_bytes);
    EXPECT_LE(chosen.recompute_flops, u.recompute_flops)
        << describe_choice(chosen) << " against " << describe_choice(u);
  }
}

// A real shape at `layers` layers, `batch` sequences in `minibatches` minibatches.
Config real_shape(const char* file, int layers, int batch, int minibatches) {
  return load_config(std::string(LOOM_SOURCE_DIR) + "/" + file,
                     {fmt::format("model.num_layers={}", layers), fmt::format("data.batch_size={}", batch),
                      fmt::format("optimizer.num_minibatches={}", minibatches), "lora.rank=0", "model.remat=auto"});
}

// The search space does not depend on the batch: on the tutorial Transformer and GPT-2 124M at 3 and
// 12 layers, the levels at 1, 2 and 4 sequences a minibatch in 1 or 2 minibatches are those measured
// at one sequence in one.
TEST(Fit, LevelsAreTheSameAtEveryBatch) {
  for (const char* file : {"configs/tutorial_transformer.toml", "configs/gpt2_124m.toml"})
    for (int layers : {3, 12}) {
      const std::vector<size_t> one = Fitter(real_shape(file, layers, 1, 1)).levels(0);
      EXPECT_GT(one.size(), 2u) << file;
      for (int per : {1, 2, 4})
        for (int mb : {1, 2}) {
          Fitter f(real_shape(file, layers, per * mb, mb));
          EXPECT_EQ(f.levels(0), one) << file << ", " << layers << " layers, " << per << " × " << mb;
        }
    }
}

// More minibatches of the same size never find a choice that recomputes less per minibatch than
// fewer do at a budget both fit (accumulating only adds to the plan, and both search the same
// levels): the tutorial Transformer and GPT-2 124M at 3 and 6 layers, one sequence a minibatch, 2
// and 4 minibatches against 1, at budgets from the no-remat plan down to the smallest.
TEST(Fit, MoreMinibatchesNeverRecomputeLessPerMinibatch) {
  for (const char* file : {"configs/tutorial_transformer.toml", "configs/gpt2_124m.toml"})
    for (int layers : {3, 6}) {
      Fitter one(real_shape(file, layers, 1, 1));
      for (int n : {2, 4}) {
        Fitter many(real_shape(file, layers, n, n));
        const int64_t hi = many.plan(std::vector<LayerRemat>(static_cast<size_t>(layers)), n, 0).total_bytes;
        const int64_t lo = many.smallest().total_bytes;
        int compared = 0;
        for (int s = 0; s <= 8; ++s) {
          const int64_t budget = hi - (hi - lo) * s / 8;
          const FitChoice m = many.fit(budget);
          if (m.num_minibatches != n || !m.proven_least) continue;
          const FitChoice o = one.fit(budget);
          ASSERT_TRUE(o.proven_least) << budget;
          // Per minibatch: o's FLOPs are one minibatch's, m's n minibatches'.
          EXPECT_GE(m.recompute_flops, o.recompute_flops * n)
              << file << ", " << layers << " layers, budget " << budget << ": " << n << " minibatches chose "
              << describe_choice(m) << ", one " << describe_choice(o);
          compared += o.recompute_flops > 0;
        }
        EXPECT_GT(compared, 2) << file << ": too few budgets where both fit and recompute";
      }
    }
}

TEST(Fit, ChoiceIsWhatLoomMemoryPlans) {
  const Config c = tiny(3);
  Fitter f(c);
  const FitChoice none = f.plan(std::vector<LayerRemat>(3), 1, 0);
  // A tenth less activation memory than no remat holds (the fixed part, 4 MiB of checkpoint
  // stream buffer included, dwarfs this tiny model's activations).
  const int64_t budget = none.fixed_bytes + none.arena_bytes * 9 / 10;
  const FitChoice got = f.fit(budget);
  EXPECT_GT(got.recompute_flops, 0);
  EXPECT_LE(got.total_bytes, budget);
  EXPECT_EQ(memory_report(f.apply(got), 0).total_bytes, got.total_bytes);
  // No remat: nothing recomputed, the same total as model.remat = none.
  Config plain = c;
  plain.model.remat = {};
  plain.train.memory_budget.clear();  // a limit, above which the plain run is refused
  EXPECT_EQ(memory_report(plain, 0).total_bytes, none.total_bytes);
  EXPECT_EQ(none.recompute_flops, 0);
}

TEST(Fit, MoreMinibatchesWhenRematIsNotEnough) {
  const Config c = tiny(2);
  Fitter f(c);
  int64_t least_one = INT64_MAX;
  for (const LayerRemat& o : f.options())
    least_one = std::min(least_one, f.plan(std::vector<LayerRemat>(2, o), 1, 0).total_bytes);
  const FitChoice two = f.plan(std::vector<LayerRemat>(2, LayerRemat{.regions = {RematRegion::Block}}), 2, 0);
  ASSERT_LT(two.total_bytes, least_one);
  const FitChoice got = f.fit(least_one - 1);
  EXPECT_GT(got.num_minibatches, 1);
  EXPECT_LE(got.total_bytes, least_one - 1);
}

TEST(Fit, ImpossibleBudgetNamesTheSmallestTotal) {
  Fitter f(tiny(2));
  const int64_t smallest = f.smallest().total_bytes;
  int64_t named = 0;
  try {
    f.fit(smallest - 1, "--budget");
    FAIL() << "no error";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.subject(), "--budget");
    EXPECT_NE(m.find("smallest plan found"), std::string::npos) << m;
    // In human units and exact bytes, the budget's and the total's, to set a budget from.
    EXPECT_NE(m.find(fmt::format("no choice fits {} ({} B)", format_bytes(smallest - 1), smallest - 1)),
              std::string::npos)
        << m;
    const size_t at = m.find("found is ");
    ASSERT_NE(at, std::string::npos) << m;
    const size_t open = m.find('(', at);
    named = std::stoll(m.substr(open + 1));
    EXPECT_NE(m.find(fmt::format("found is {} ({} B;", format_bytes(named), named)), std::string::npos) << m;
    EXPECT_NE(e.hint().find("dominate"), std::string::npos) << e.hint();
    EXPECT_EQ(e.hint().rfind(fmt::format("a budget of at least {} ({} B), or (", format_bytes(named), named), 0), 0u)
        << e.hint();
    EXPECT_NE(e.hint().find("model.head_chunk=auto"), std::string::npos) << e.hint();
  }
  // The total named is a plan's that fits: no larger than the smallest uniform choice, and a
  // budget of it is met.
  EXPECT_LE(named, smallest);
  EXPECT_LE(f.fit(named).total_bytes, named);
  // Only levers that apply: a bfloat16 run is not told to use bfloat16, nor one with the head in
  // chunks to chunk it.
  Config bf16 = tiny(2, 1, "auto");
  bf16.model.dtype = DType::bf16;
  Fitter g(bf16);
  std::string hint;
  try {
    g.fit(1, "--budget");
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    hint = e.hint();
  }
  EXPECT_EQ(hint.find("model.dtype=bfloat16"), std::string::npos) << hint;
  EXPECT_EQ(hint.find("model.head_chunk=auto"), std::string::npos) << hint;
}

// Sizes are whole bytes of a decimal number with a unit; what no plan can be compared with is
// refused naming the key.
TEST(Fit, BudgetTextIsABoundedDecimalSize) {
  EXPECT_EQ(parse_bytes("3000000000", "k"), 3000000000);
  EXPECT_EQ(parse_bytes("1.5GiB", "k"), int64_t{3} << 29);
  EXPECT_EQ(parse_bytes("2KB", "k"), 2000);
  for (const char* bad : {"1e30", "inf", "nan", "0x10GiB", "0.5", "0", "-1GiB", "abc", "12 GiB", "12GiBx"}) {
    try {
      parse_bytes(bad, "train.memory_budget");
      ADD_FAILURE() << bad << " accepted";
    } catch (const UserError& e) {
      EXPECT_EQ(e.subject(), "train.memory_budget") << bad;
    }
  }
}

TEST(Fit, TrainerRunsTheChoiceWithTheGradientsOfNoRemat) {
  Config c = tiny(2);
  Fitter f(c);
  const FitChoice none_plan = f.plan(std::vector<LayerRemat>(2), 1, 0);
  const int64_t budget = none_plan.fixed_bytes + none_plan.arena_bytes * 9 / 10;  // a tenth less activation memory
  c.train.memory_budget = std::to_string(budget);
  auto be = make_backend("cpu");
  ::testing::internal::CaptureStderr();
  Trainer t(c, *be);
  const std::string said = ::testing::internal::GetCapturedStderr();
  const FitChoice chosen = f.fit(budget);
  EXPECT_FALSE(t.config().model.remat_layers.empty());
  EXPECT_EQ(t.config().model.remat_layers, chosen.layers);
  // One line: the choice, its planned total of the budget in human units, the recompute.
  const size_t at = said.find("remat auto: ");
  ASSERT_NE(at, std::string::npos) << said;
  const std::string line = said.substr(at, said.find('\n', at) - at);
  for (const std::string& field :
       {describe_choice(chosen), "plan " + format_bytes(chosen.total_bytes) + " of " + format_bytes(budget),
        fmt::format("recompute +{:.1f}% FLOPs", 100 * chosen.recompute_flops / chosen.step_flops)})
    EXPECT_NE(line.find(field), std::string::npos) << field << " in " << line;
  Config plain = c;
  plain.model.remat = {};
  plain.train.memory_budget.clear();  // a limit, above which the plain run is refused
  Trainer u(plain, *be);
  const Batch b = make_batch(c.data, data_context(c));
  EXPECT_EQ(t.step(b).metrics.loss.mean(), u.step(b).metrics.loss.mean());
}

// At a budget where the planner takes a fused head, the Trainer runs it with the plain head's loss.
TEST(Fit, TrainerRunsAChosenHeadChunk) {
  Config c = tiny(2, 1, "auto");
  Fitter f(c);
  int64_t budget = 0;
  FitChoice chosen;
  for (const LayerRemat& o : f.options())
    for (const LayerRemat& p : f.options()) {
      if (chosen.head_chunk > 0) break;
      budget = f.plan({o, p}, 1, f.head_chunks()[1]).total_bytes;
      chosen = f.fit(budget);
    }
  ASSERT_GT(chosen.head_chunk, 0) << "no budget where a fused head is the least recompute";
  c.train.memory_budget = std::to_string(budget);
  auto be = make_backend("cpu");
  Trainer t(c, *be);
  EXPECT_EQ(t.config().model.transformer.head_chunk, chosen.head_chunk);
  EXPECT_EQ(t.config().model.remat_layers, chosen.layers);
  EXPECT_LE(memory_report(t.config(), 0).total_bytes, budget);
  Config plain = c;
  plain.model.remat = {};
  plain.train.memory_budget.clear();  // a limit, above which the plain run is refused
  plain.model.transformer.head_chunk = 0;
  Trainer u(plain, *be);
  const Batch b = make_batch(c.data, data_context(c));
  EXPECT_NEAR(t.step(b).metrics.loss.mean(), u.step(b).metrics.loss.mean(), 1e-5);
}

TEST(Fit, HeadChunkAutoNeedsRematAuto) {
  EXPECT_EQ(tiny(2, 1, "auto").model.transformer.head_chunk, nn::kHeadChunkAuto);
  try {
    default_config({"model.kind=transformer", "model.head_chunk=auto", "data.kind=random_tokens"});
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model.head_chunk"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("model.remat = auto"), std::string::npos) << e.hint();
  }
}

}  // namespace
}  // namespace loom
