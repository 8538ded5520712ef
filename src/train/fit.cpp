#include "train/fit.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <map>
#include <memory>
#include <queue>
#include <set>

#include "backend/registry.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/format.h"
#include "graph/ops/linear_cross_entropy.h"
#include "nn/models.h"
#include "nn/models/transformer/transformer.h"
#include "optim/optimizer.h"
#include "runtime/executor.h"
#include "train/evaluator.h"
#include "train/trainer.h"

namespace loom {

int64_t parse_bytes(const std::string& text, const std::string& what) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw UserError(what, "'" + text + "' is not a size", "write e.g. 24GiB, 512MiB or 16GB");
  }
  const std::string unit = text.substr(used);
  double mult = 1;
  if (unit == "" || unit == "B")
    mult = 1;
  else if (unit == "KiB")
    mult = 1024.0;
  else if (unit == "MiB")
    mult = 1024.0 * 1024;
  else if (unit == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "KB")
    mult = 1e3;
  else if (unit == "MB")
    mult = 1e6;
  else if (unit == "GB")
    mult = 1e9;
  else
    throw UserError(what, "unknown unit '" + unit + "'", "use B, KiB, MiB, GiB, KB, MB or GB");
  if (!(v > 0)) throw UserError(what, "must be positive", "write e.g. 24GiB");
  return static_cast<int64_t>(v * mult);
}

namespace {

std::string layer_name(const LayerRemat& l) {
  if (l.regions.empty()) return "none";
  std::string s = choice_set_name(l.regions);
  std::replace(s.begin(), s.end(), ',', '+');
  return s + "/" + std::string(choice_name(l.policy));
}

}  // namespace

std::string describe_layers(const std::vector<LayerRemat>& layers) {
  std::string s;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j < layers.size() && layers[j] == layers[i]) ++j;
    s += fmt::format("{}{}×{}", s.empty() ? "" : ", ", j - i, layer_name(layers[i]));
    i = j;
  }
  return s;
}

std::string describe_head(int64_t head_chunk) {
  return head_chunk == 0 ? "plain" : fmt::format("{} columns", head_chunk);
}

std::string describe_choice(const FitChoice& f) {
  return fmt::format("{} in {} minibatch{}, head {}", describe_layers(f.layers), f.num_minibatches,
                     f.num_minibatches == 1 ? "" : "es", describe_head(f.head_chunk));
}

Fitter::Fitter(const Config& c, int ranks) : c_(c), ranks_(ranks), be_(make_backend(c.device)) {
  const bool lm = nn::model_kind(c.model.kind).language_model;
  num_layers_ = lm ? c.model.num_layers : 1;
  std::vector<ChoiceSet<RematRegion>> regions = {{RematRegion::MLP}};
  if (lm)
    regions = {{RematRegion::MLP}, {RematRegion::Attn}, {RematRegion::MLP, RematRegion::Attn}, {RematRegion::Block}};
  std::vector<RematPolicyKind> policies = {RematPolicyKind::nothing_saveable,
                                           RematPolicyKind::dots_with_no_batch_dims_saveable,
                                           RematPolicyKind::dots_saveable};
  if (!c.model.remat_save_names.empty()) policies.push_back(RematPolicyKind::save_only_these_names);
  options_.push_back(LayerRemat{});
  for (const auto& r : regions)
    for (RematPolicyKind p : policies) options_.push_back(LayerRemat{.regions = r, .policy = p});
  c_.model.remat = {RematRegion::auto_};
  head_chunks_ = {c.model.head_chunk};
  if (c.model.head_chunk == nn::kHeadChunkAuto) {
    head_chunks_ = {0};
    // A quarter of the vocabulary holds a quarter of the logits; a sixteenth, a sixteenth: below
    // that the head's few MiB rarely decide a fit, and ever narrower products run slower.
    const int64_t wide = lm ? std::bit_floor(static_cast<uint64_t>(c.model.num_outputs / 4)) : 0;
    for (int64_t chunk = wide; chunk >= 1 && head_chunks_.size() < 3; chunk /= 4) head_chunks_.push_back(chunk);
  }
}

std::vector<int64_t> Fitter::minibatch_counts() const {
  std::vector<int64_t> out;
  const int64_t per_rank = c_.data.batch_size / ranks_;
  for (int64_t m = c_.optimizer.num_minibatches; m <= per_rank; ++m)
    if (per_rank % m == 0 && c_.data.batch_size % (m * ranks_) == 0) out.push_back(m);
  // None only when the configured count does not divide the batch either: the usual error says so.
  if (out.empty()) minibatch_size(c_, ranks_);
  return out;
}

Config Fitter::apply(const FitChoice& f) const {
  Config c = c_;
  c.model.remat_layers = f.layers;
  c.optimizer.num_minibatches = f.num_minibatches;
  c.model.head_chunk = f.head_chunk;
  return c;
}

FitChoice Fitter::plan(const std::vector<LayerRemat>& layers, int64_t num_minibatches, int64_t head_chunk) {
  std::string key;
  for (const LayerRemat& l : layers) key += layer_name(l) + ",";
  if (auto it = plans_by_choice_.find({key, num_minibatches, head_chunk}); it != plans_by_choice_.end())
    return it->second;
  ++plans_;
  FitChoice f{.layers = layers, .num_minibatches = num_minibatches, .head_chunk = head_chunk};
  const Config c = apply(f);
  const TrainProgram p = build_train_program(c, ranks_);
  const Graph& g = p.model.graph;
  const MemoryPlan mp =
      plan_program(*be_, g, p.schedule, rank_plan_options(c, p, ranks_), resolve_threads(static_cast<int>(c.threads)));
  // The sum `loom memory` prints (report/memory_report.h) and the trainer's fit check allows.
  const RankMemory rank = rank_memory(c, p, ranks_);
  f.arena_bytes = mp.arena_bytes;
  f.fixed_bytes = mp.param_bytes + mp.grad_bytes + mp.input_bytes + mp.library_bytes +
                  rank.shard_bytes(optimizer_moments(c.optimizer)) + rank.comm_buffer_bytes +
                  rank.checkpoint_stream_bytes +
                  (Evaluator::during_training(c) ? Evaluator::planned_bytes(c, ranks_, mp.arena_bytes) : 0);
  f.total_bytes = f.fixed_bytes + f.arena_bytes;
  for (NodeId id : p.schedule) {
    const Node& n = g.node(id);
    const OpCost cost = node_cost(g, n);
    const int64_t again = n.phase == Phase::recompute ? cost.flops : linear_cross_entropy_recomputed_flops(g, n);
    f.recompute_flops += static_cast<double>(again);
    f.step_flops += static_cast<double>(cost.flops - again);
  }
  f.recompute_flops *= static_cast<double>(num_minibatches);
  f.step_flops *= static_cast<double>(num_minibatches);
  plans_by_choice_.emplace(std::make_tuple(key, num_minibatches, head_chunk), f);
  return f;
}

FitChoice Fitter::fit_layers(int64_t budget, int64_t mb, int64_t head) {
  const auto L = static_cast<size_t>(num_layers_);
  // Per option: recomputed FLOPs and bytes added per layer, from uniform plans of a model of at
  // most 3 layers (identical layers: the increments carry over to any depth).
  auto [cal, fresh] = per_layer_.try_emplace({mb, head});
  if (fresh) {
    Config small = c_;
    const bool lm = nn::model_kind(c_.model.kind).language_model;
    const size_t Lc = lm ? std::min<size_t>(L, 3) : L;
    if (lm) small.model.num_layers = static_cast<int64_t>(Lc);
    Fitter calib(small, ranks_);
    const FitChoice none_small = calib.plan(std::vector<LayerRemat>(Lc), mb, head);
    for (size_t o = 0; o < options_.size(); ++o) {
      const FitChoice u = o == 0 ? none_small : calib.plan(std::vector<LayerRemat>(Lc, options_[o]), mb, head);
      cal->second.emplace_back((u.recompute_flops - none_small.recompute_flops) / static_cast<double>(Lc),
                               static_cast<double>(u.total_bytes - none_small.total_bytes) / static_cast<double>(Lc));
    }
    plans_ += calib.plans_made();
  }
  struct Level {
    size_t option;
    double flops, bytes;  // per layer, relative to none
  };
  std::vector<Level> all;
  for (size_t o = 0; o < options_.size(); ++o) all.push_back({o, cal->second[o].first, cal->second[o].second});
  // The chain: options no other beats in both FLOPs and bytes, by FLOPs ascending (bytes descending).
  std::stable_sort(all.begin(), all.end(), [](const Level& a, const Level& b) {
    return a.flops != b.flops ? a.flops < b.flops : a.bytes < b.bytes;
  });
  std::vector<Level> chain;
  for (const Level& l : all)
    if (chain.empty() || l.bytes < chain.back().bytes) chain.push_back(l);
  const size_t K = chain.size();

  const FitChoice none = plan(std::vector<LayerRemat>(L), mb, head);
  if (none.total_bytes <= budget) return none;
  // Layers by count per level, laid out with the highest levels on the first layers (their saved
  // activations are live longest) or, when that does not fit, on the last (where the peak falls
  // late, as at a fused head's backward, that can be the smaller).
  using Counts = std::vector<int64_t>;
  auto layout = [&](const Counts& n, bool highest_first) {
    std::vector<LayerRemat> layers;
    for (size_t k = K; k-- > 0;)
      for (int64_t i = 0; i < n[k]; ++i) layers.push_back(options_[chain[k].option]);
    if (!highest_first) std::reverse(layers.begin(), layers.end());
    return layers;
  };
  auto plan_counts = [&](const Counts& n) {
    FitChoice a = plan(layout(n, true), mb, head);
    if (a.total_bytes <= budget) return a;
    FitChoice b = plan(layout(n, false), mb, head);
    return b.total_bytes < a.total_bytes ? b : a;
  };
  auto predict = [&](const Counts& n) {
    double b = static_cast<double>(none.total_bytes);
    for (size_t k = 0; k < K; ++k) b += static_cast<double>(n[k]) * chain[k].bytes;
    return b;
  };
  auto flops = [&](const Counts& n) {
    double f = 0;
    for (size_t k = 0; k < K; ++k) f += static_cast<double>(n[k]) * chain[k].flops;
    return f;
  };
  Counts top(K, 0);
  top[K - 1] = static_cast<int64_t>(L);
  // A multiset predicted above budget + slack is not planned. Savings do not add exactly (the peak
  // is a maximum over the schedule, and one layer's transient may hide under another's), so the
  // slack starts at one layer's largest saving and widens to any larger overestimate seen.
  double slack = 0;
  for (const Level& l : chain) slack = std::max(slack, -l.bytes);
  // Bytes fall with every level: when all layers on the top level do not fit, no multiset does.
  FitChoice heaviest = plan(layout(top, true), mb, head);
  if (heaviest.total_bytes > budget) return FitChoice{};
  heaviest.proven_least = false;  // the answer when the search gives up (below)
  constexpr size_t kMaxVisits = 200000;
  // Deep models put many multisets inside the slack; past kMaxPlans multisets planned the search
  // trusts the prediction (slack 0) and says its answer is not proven least; past kMaxVisits
  // multisets it answers all layers on the top level, not proven least either.
  constexpr size_t kMaxPlans = 64;
  std::set<Counts> planned;
  bool proven = true;
  while (true) {
    // Multisets by FLOPs ascending (then predicted bytes): each step moves one layer up one level.
    using Item = std::pair<std::pair<double, double>, Counts>;
    std::priority_queue<Item, std::vector<Item>, std::greater<>> queue;
    std::set<Counts> seen;
    Counts start(K, 0);
    start[0] = static_cast<int64_t>(L);
    queue.push({{0.0, predict(start)}, start});
    seen.insert(start);
    bool grew = false;
    while (!queue.empty()) {
      if (seen.size() > kMaxVisits) return heaviest;
      const Counts n = queue.top().second;
      const double est = queue.top().first.second;
      queue.pop();
      if (proven && planned.size() >= kMaxPlans) {
        proven = false;
        slack = 0;
        break;
      }
      if (est <= static_cast<double>(budget) + slack) {
        planned.insert(n);
        FitChoice f = plan_counts(n);
        f.proven_least = proven;
        if (proven && est - static_cast<double>(f.total_bytes) > slack) {
          slack = est - static_cast<double>(f.total_bytes);
          grew = true;
          break;  // a multiset skipped before may fit: visit them again with the wider slack
        }
        if (f.total_bytes <= budget) return f;
      }
      for (size_t k = 0; k + 1 < K; ++k) {
        if (n[k] == 0) continue;
        Counts m = n;
        --m[k];
        ++m[k + 1];
        if (seen.insert(m).second) queue.push({{flops(m), predict(m)}, m});
      }
    }
    // Nothing planned fitted although the heaviest does (the prediction put it above the slack):
    // answer it, not proven least.
    if (!grew && proven) return heaviest;
    if (!grew && !queue.empty()) continue;  // the search restarts trusting the prediction
    if (!grew) return heaviest;
  }
}

FitChoice Fitter::smallest() {
  // Every layer on one option at the most minibatches: the option that saves the most on its own.
  FitChoice least;
  for (int64_t head : head_chunks_)
    for (const LayerRemat& o : options_) {
      FitChoice f =
          plan(std::vector<LayerRemat>(static_cast<size_t>(num_layers_), o), minibatch_counts().back(), head);
      if (least.layers.empty() || f.total_bytes < least.total_bytes) least = std::move(f);
    }
  return least;
}

FitChoice Fitter::fit(int64_t budget) {
  const std::vector<int64_t> counts = minibatch_counts();
  for (int64_t mb : counts) {
    FitChoice best;
    for (int64_t head : head_chunks_) {
      // The head's own recompute is a floor for any layers with it.
      const FitChoice bare = plan(std::vector<LayerRemat>(static_cast<size_t>(num_layers_)), mb, head);
      if (!best.layers.empty() && bare.recompute_flops >= best.recompute_flops) continue;
      FitChoice f = fit_layers(budget, mb, head);
      if (!f.layers.empty() && (best.layers.empty() || f.recompute_flops < best.recompute_flops)) best = std::move(f);
    }
    if (!best.layers.empty()) return best;
  }
  // The calibration's chain may have left out the option that saves the most at this depth.
  const FitChoice least = smallest();
  if (least.total_bytes <= budget) return least;
  const bool fixed = least.fixed_bytes >= least.arena_bytes;
  throw UserError(
      "train.memory_budget",
      fmt::format("no choice fits {}: the smallest plan is {} ({} B; {}), of which parameters, gradients, "
                  "optimizer state and inputs are {} and activations with kernel workspace {}",
                  format_bytes(budget), format_bytes(least.total_bytes), least.total_bytes, describe_choice(least),
                  format_bytes(least.fixed_bytes), format_bytes(least.arena_bytes)),
      fixed ? "the parameters and optimizer state dominate: a smaller model, or more ranks with "
              "optimizer.shard=state+grads"
            : "the activations dominate: a smaller data.batch_size or data.seq_len, or model.dtype=bfloat16");
}

std::vector<Fitter::FitPoint> Fitter::frontier(int steps) {
  const FitChoice none = plan(std::vector<LayerRemat>(static_cast<size_t>(num_layers_)), minibatch_counts().front(),
                              head_chunks_.front());
  const int64_t lo = std::min(smallest().total_bytes, none.total_bytes), hi = none.total_bytes;
  std::vector<FitPoint> out;
  for (int s = 0; s <= steps; ++s) {
    FitPoint p{.budget = hi - (hi - lo) * s / steps, .choice = {}, .seconds = 0, .plans = plans_};
    const auto t0 = std::chrono::steady_clock::now();
    p.choice = fit(p.budget);
    p.seconds = seconds_since(t0);
    p.plans = plans_ - p.plans;
    out.push_back(std::move(p));
  }
  return out;
}

int64_t fit_budget(const Config& c, int64_t available, int ranks_on_host) {
  if (!c.train.memory_budget.empty()) return parse_bytes(c.train.memory_budget, "train.memory_budget");
  return available < 0 ? -1 : available / std::max(1, ranks_on_host);
}

}  // namespace loom
