#include "train/fit.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
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
    used = 0;
  }
  // A decimal number (stod also reads hexadecimal, "inf" and "nan").
  if (used == 0 || text.substr(0, used).find_first_not_of("0123456789.eE+-") != std::string::npos)
    throw UserError(what, "'" + text + "' is not a size", "write e.g. 24GiB, 512MiB or 16GB");
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
  // Whole bytes that an int64 holds: 1e30 or inf is no budget loom can compare with a plan, and
  // 0.5 B none a plan can fit.
  const double bytes = v * mult;
  if (!(bytes < 0x1p63))
    throw UserError(what, "'" + text + "' is too large (a size is below 8 EiB)", "write e.g. 24GiB");
  if (bytes < 1) throw UserError(what, "'" + text + "' is less than one byte", "write e.g. 24GiB");
  return static_cast<int64_t>(bytes);
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
  num_layers_ = lm ? c.model.transformer.num_layers : 1;
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
  head_chunks_ = {c.model.transformer.head_chunk};
  if (c.model.transformer.head_chunk == nn::kHeadChunkAuto) {
    head_chunks_ = {0};
    // A quarter of the vocabulary holds a quarter of the logits; a sixteenth, a sixteenth: below
    // that the head's few MiB rarely decide a fit, and ever narrower products run slower.
    const int64_t wide = lm ? std::bit_floor(static_cast<uint64_t>(c.model.transformer.num_outputs / 4)) : 0;
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
  c.model.transformer.head_chunk = f.head_chunk;
  return c;
}

FitChoice Fitter::plan(const std::vector<LayerRemat>& layers, int64_t num_minibatches, int64_t head_chunk) {
  std::string key;
  for (const LayerRemat& l : layers) key += layer_name(l) + ",";
  if (auto it = plans_by_choice_.find({key, num_minibatches, head_chunk}); it != plans_by_choice_.end())
    return it->second;
  ++plans_;
  FitChoice f = measure(layers, num_minibatches, head_chunk, nullptr, 0);
  plans_by_choice_.emplace(std::make_tuple(key, num_minibatches, head_chunk), f);
  return f;
}

namespace {

// The layer a node belongs to: n of its scope "block_n/...", or -1 (embeddings, head, loss).
int32_t layer_of(const Node& n) {
  const std::string& s = n.scope;
  if (s.rfind("block_", 0) != 0) return -1;
  size_t i = 6;
  int32_t l = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) l = l * 10 + (s[i] - '0');
  return i > 6 && (i == s.size() || s[i] == '/') ? l : -1;
}

// Which layers behave alike: the first (after the embeddings), the last (before the head) and
// the ones between.
size_t position(int64_t layer, int64_t layers) { return layer == 0 ? 0 : layer == layers - 1 ? 2 : 1; }

}  // namespace

FitChoice Fitter::measure(const std::vector<LayerRemat>& layers, int64_t num_minibatches, int64_t head_chunk,
                          Calibration* cal, size_t option) {
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
                  rank.checkpoint_stream_bytes;
  if (Evaluator::during_training(c)) {
    // Evaluator::planned_bytes, whose forward program no remat choice changes: planned once.
    auto [e, fresh] = eval_bytes_.try_emplace({num_minibatches, head_chunk});
    if (fresh) {
      const int64_t input = Evaluator::planned_bytes(c, ranks_, INT64_MAX);
      e->second = {Evaluator::planned_bytes(c, ranks_, -1) - input, input};
    }
    f.fixed_bytes += (e->second.first > mp.arena_bytes ? e->second.first : 0) + e->second.second;
  }
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
  if (!cal) return f;

  // The live-bytes structure (fit.h, lower_bound): each activation buffer and kernel workspace
  // belongs to the layer of the node that made it (a view or an in-place output: its storage's),
  // -1 outside the layers; gradients and gathered parameters in the arena apart.
  const auto steps = static_cast<int32_t>(mp.schedule.size());
  std::vector<int32_t> layer_at(static_cast<size_t>(steps));
  int32_t last_forward = -1, first_backward = steps, num_layers = 0;
  for (int32_t s = 0; s < steps; ++s) {
    const Node& n = g.node(mp.schedule[static_cast<size_t>(s)]);
    layer_at[static_cast<size_t>(s)] = layer_of(n);
    if (layer_of(n) < 0) continue;
    num_layers = std::max(num_layers, layer_of(n) + 1);
    if (n.phase == Phase::forward)
      last_forward = s;
    else
      first_backward = std::min(first_backward, s);
  }
  const int32_t h = first_backward - 1;  // the head's last step: every layer's saved activations live
  struct Owned {
    int32_t layer, first, last;
    int64_t bytes;
    bool read_outside = false;
  };
  std::vector<Owned> owned;
  std::vector<int32_t> owned_of(g.values().size(), -1);  // per storage root
  constexpr int32_t kPersistent = -2;                    // a gradient or a gathered parameter in the arena
  for (const BufferInfo& b : mp.buffers) {
    if (b.gathered || (b.value != kNoValue && g.value(b.value).kind != ValueKind::activation)) {
      owned.push_back({kPersistent, b.first, b.last, b.bytes});
    } else if (b.value == kNoValue) {
      owned.push_back({layer_at[static_cast<size_t>(b.first)], b.first, b.last, b.bytes});
    } else {
      owned_of[static_cast<size_t>(b.value)] = static_cast<int32_t>(owned.size());
      owned.push_back({layer_of(g.node(g.value(b.value).producer)), b.first, b.last, b.bytes});
    }
  }
  for (int32_t s = 0; s < steps; ++s)
    for (ValueId v : g.node(mp.schedule[static_cast<size_t>(s)]).in)
      if (const int32_t o = owned_of[static_cast<size_t>(mp.value_root[static_cast<size_t>(v)])]; o >= 0)
        owned[static_cast<size_t>(o)].read_outside |=
            owned[static_cast<size_t>(o)].layer != layer_at[static_cast<size_t>(s)];
  // Live bytes per owner (index layer + 1; the last, the gradients and gathered parameters) and step.
  std::vector<std::vector<int64_t>> live(static_cast<size_t>(num_layers) + 2,
                                         std::vector<int64_t>(static_cast<size_t>(steps) + 1, 0));
  for (const Owned& o : owned) {
    if (o.layer >= num_layers) continue;
    std::vector<int64_t>& d = live[o.layer == kPersistent ? live.size() - 1 : static_cast<size_t>(o.layer + 1)];
    d[static_cast<size_t>(o.first)] += o.bytes;
    d[static_cast<size_t>(o.last) + 1] -= o.bytes;
  }
  for (std::vector<int64_t>& d : live)
    for (size_t s = 1; s < d.size(); ++s) d[s] += d[s - 1];
  if (num_layers == 0 || last_forward >= h) return f;  // no layered structure: the bound is the fixed part
  for (int32_t l = 0; l < num_layers; ++l) {
    int64_t sv = 0, out = 0, ob = 0;
    for (const Owned& o : owned)
      if (o.layer == l && o.first <= h && h <= o.last) {
        sv += o.bytes;
        if (o.read_outside) out += o.bytes;
      }
    // With the activations outside the layers live there: the embeddings' output until the first
    // layer's backward, the head's gradient into the last layer; they depend on no other layer.
    for (int32_t s = h + 1; s < steps; ++s)
      if (layer_at[static_cast<size_t>(s)] == l)
        ob = std::max(ob, live[static_cast<size_t>(l) + 1][static_cast<size_t>(s)] + live[0][static_cast<size_t>(s)]);
    const size_t at = position(l, num_layers);
    cal->saved[option][at] = sv;
    cal->output[option][at] = out;
    cal->own_backward[option][at] = ob;
  }
  // The head's steps: the least over the options so far of their bytes outside the layers, step by
  // step (the same head nodes in the same order under every option), then the most over the steps.
  // The last layer's activations the head's backward frees before h (its output, read by the final
  // norm) count there too: its buffers live at h are live at every step of the head (made before).
  // Gradients and gathered parameters count there too (the head's, and what the head's backward
  // writes or gathers at any depth); not at a layer's backward, where which are live depends on
  // the depth (their buckets).
  std::vector<int64_t> head;
  const std::vector<int64_t>& last = live[static_cast<size_t>(num_layers)];
  for (int32_t s = last_forward + 1; s <= h; ++s) {
    const auto at = static_cast<size_t>(s);
    head.push_back(live[0][at] + live.back()[at] + last[at] - last[static_cast<size_t>(h)]);
  }
  if (option == 0) cal->head_steps = head;
  if (cal->head_steps.size() != head.size()) cal->head_steps.assign(head.size(), 0);
  for (size_t s = 0; s < head.size(); ++s) cal->head_steps[s] = std::min(cal->head_steps[s], head[s]);
  cal->head = *std::max_element(cal->head_steps.begin(), cal->head_steps.end());
  return f;
}

const Fitter::Calibration& Fitter::calibrate(int64_t mb, int64_t head) {
  auto [cal, fresh] = calibration_.try_emplace({mb, head});
  if (!fresh) return cal->second;
  Calibration& k = cal->second;
  const auto L = static_cast<size_t>(num_layers_);
  Config small = c_;
  const bool lm = nn::model_kind(c_.model.kind).language_model;
  const size_t Lc = lm ? std::min<size_t>(L, 3) : L;
  if (lm) small.model.transformer.num_layers = static_cast<int64_t>(Lc);
  Fitter calib(small, ranks_);
  k.saved.assign(options_.size(), {});
  k.output.assign(options_.size(), {});
  k.own_backward.assign(options_.size(), {});
  std::vector<FitChoice> uniform;
  for (size_t o = 0; o < options_.size(); ++o)
    uniform.push_back(calib.measure(std::vector<LayerRemat>(Lc, options_[o]), mb, head, &k, o));
  plans_ += static_cast<int>(options_.size());
  for (const FitChoice& u : uniform)
    k.increments.emplace_back((u.recompute_flops - uniform[0].recompute_flops) / static_cast<double>(Lc),
                              static_cast<double>(u.total_bytes - uniform[0].total_bytes) / static_cast<double>(Lc));
  const FitChoice none = plan(std::vector<LayerRemat>(L), mb, head);
  k.fixed = none.fixed_bytes;
  if (const auto e = eval_bytes_.find({mb, head}); e != eval_bytes_.end() && e->second.first > none.arena_bytes)
    k.fixed -= e->second.first;
  return k;
}

int64_t Fitter::lower_bound(const std::vector<LayerRemat>& layers, int64_t mb, int64_t head) {
  std::vector<size_t> opt;
  for (const LayerRemat& l : layers)
    opt.push_back(static_cast<size_t>(std::find(options_.begin(), options_.end(), l) - options_.begin()));
  return bound_of(calibrate(mb, head), opt);
}

int64_t Fitter::bound_of(const Calibration& k, const std::vector<size_t>& opt) {
  if (k.head < 0) return k.fixed;
  const auto L = static_cast<int64_t>(opt.size());
  auto saved = [&](int64_t j) { return k.saved[opt[j]][position(j, L)]; };
  int64_t before = 0, arena = 0;  // before: the saved bytes of the layers before the previous one
  for (int64_t j = 0; j < L; ++j) {
    const int64_t previous = j == 0 ? 0 : std::max<int64_t>(0, saved(j - 1) - k.output[opt[j - 1]][position(j - 1, L)]);
    arena = std::max(arena, before + previous + k.own_backward[opt[j]][position(j, L)]);
    if (j > 0) before += saved(j - 1);
  }
  if (L > 0) before += saved(L - 1);
  return k.fixed + std::max(arena, before + k.head);
}

std::vector<size_t> Fitter::levels(int64_t head) {
  // Measured at one sequence a rank in one minibatch: bytes at the peak need not scale with the
  // batch (kernel workspace, the arena's placement), and every batch and minibatch count is to
  // search the same options.
  if (c_.data.batch_size != ranks_) {
    auto [it, fresh] = levels_.try_emplace(head);
    if (fresh) {
      Config one = c_;
      one.data.batch_size = ranks_;
      one.optimizer.num_minibatches = 1;
      Fitter reference(one, ranks_);
      it->second = reference.levels(head);
      plans_ += reference.plans_made();
    }
    return it->second;
  }
  const Calibration& cal = calibrate(1, head);  // one sequence a rank: one minibatch
  // Options no other beats in FLOPs, in bytes added on the small model and in saved bytes between
  // the layers (what grows with depth), by FLOPs ascending; of options equal in all three the first.
  const auto mid = [&](size_t o) { return cal.saved[o][num_layers_ >= 3 ? 1 : 0]; };
  std::vector<size_t> out;
  for (size_t o = 0; o < options_.size(); ++o) {
    const auto& [fo, bo] = cal.increments[o];
    bool beaten = false;
    for (size_t q = 0; q < options_.size() && !beaten; ++q) {
      const auto& [fq, bq] = cal.increments[q];
      const bool no_worse = fq <= fo && bq <= bo && mid(q) <= mid(o);
      beaten = q != o && no_worse && (fq < fo || bq < bo || mid(q) < mid(o) || q < o);
    }
    if (!beaten) out.push_back(o);
  }
  std::stable_sort(out.begin(), out.end(), [&](size_t a, size_t b) {
    const auto& [fa, ba] = cal.increments[a];
    const auto& [fb, bb] = cal.increments[b];
    return fa != fb ? fa < fb : ba < bb;
  });
  return out;
}

FitChoice Fitter::fit_layers(int64_t budget, int64_t mb, int64_t head, bool& proven) {
  const auto L = static_cast<size_t>(num_layers_);
  const Calibration& cal = calibrate(mb, head);
  struct Level {
    size_t option;
    double flops, bytes;  // per layer, relative to none
  };
  std::vector<Level> chain;
  for (size_t o : levels(head)) chain.push_back({o, cal.increments[o].first, cal.increments[o].second});
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
  auto options_of = [&](const Counts& n, bool highest_first) {
    std::vector<size_t> opt;
    for (size_t k = K; k-- > 0;)
      for (int64_t i = 0; i < n[k]; ++i) opt.push_back(chain[k].option);
    if (!highest_first) std::reverse(opt.begin(), opt.end());
    return opt;
  };
  auto flops = [&](const Counts& n) {
    double f = 0;
    for (size_t k = 0; k < K; ++k) f += static_cast<double>(n[k]) * chain[k].flops;
    return f;
  };
  // A multiset is planned only when a layout's lower bound (plus `shift`, below) is within the
  // budget; a plan below its bound (which would make the bound wrong for this model) voids the proof.
  int64_t shift = 0, least_gap = INT64_MAX;
  auto plan_counts = [&](const Counts& n, std::optional<FitChoice>& fits) {
    for (bool highest_first : {true, false}) {
      const std::vector<LayerRemat> layers = layout(n, highest_first);
      const int64_t bound = bound_of(cal, options_of(n, highest_first));
      if (bound + shift > budget) continue;
      const FitChoice f = plan(layers, mb, head);
      if (f.total_bytes < bound) proven = false;
      least_gap = std::min(least_gap, f.total_bytes - bound);
      if (f.total_bytes <= budget) {
        fits = f;
        return;
      }
    }
  };
  // Every layer's saved activations are live at the head's backward: a multiset whose saved
  // bytes exceed `room` fits in no order. From 3 layers up, those of the layers between, with the
  // first and the last layer's difference from them at its least over the levels; below, the least
  // of any position.
  std::vector<int64_t> saved(K, INT64_MAX);
  int64_t edges = 0;
  if (L >= 3) {
    int64_t first = INT64_MAX, last = INT64_MAX;
    for (size_t k = 0; k < K; ++k) {
      const std::array<int64_t, 3>& s = cal.saved[chain[k].option];
      saved[k] = s[1];
      first = std::min(first, s[0] - s[1]);
      last = std::min(last, s[2] - s[1]);
    }
    edges = first + last;
  } else {
    for (size_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < num_layers_; ++j)
        saved[k] = std::min(saved[k], cal.saved[chain[k].option][position(j, num_layers_)]);
  }
  const int64_t room = budget - cal.fixed - std::max<int64_t>(cal.head, 0) - edges;
  // completion[k][r][u]: the least FLOPs of r layers on levels k..K-1 whose saved bytes, each
  // rounded down to a multiple of `unit`, sum to at most u units: never above the least FLOPs of
  // the layers that fit the room left (a knapsack by dynamic programming, exact but for the rounding,
  // which only loosens it).
  constexpr double kNever = std::numeric_limits<double>::infinity();
  constexpr int64_t kUnits = 4096;
  const int64_t unit = std::max<int64_t>(1, room / kUnits + 1);
  const auto U = static_cast<size_t>(std::max<int64_t>(0, room / unit));
  const size_t R = L + 1;
  std::vector<double> completion((K + 1) * R * (U + 1), kNever);
  auto at = [&](size_t k, size_t r, size_t u) -> double& { return completion[(k * R + r) * (U + 1) + u]; };
  for (size_t u = 0; u <= U; ++u) at(K, 0, u) = 0;
  for (size_t k = K; k-- > 0;) {
    const auto su = static_cast<size_t>(saved[k] / unit);
    for (size_t r = 0; r < R; ++r)
      for (size_t u = 0; u <= U; ++u) {
        double v = at(k + 1, r, u);
        if (r > 0 && u >= su) v = std::min(v, chain[k].flops + at(k, r - 1, u - su));
        at(k, r, u) = v;
      }
  }
  auto least_completion = [&](size_t k, int64_t r, int64_t left) {
    return left < 0 || room < 0 ? kNever : at(k, static_cast<size_t>(r), static_cast<size_t>(left / unit));
  };
  // The first incumbent: the least-FLOPs level that fits on every layer (the chain is in FLOPs
  // order; the last saves the most), a plan no answer may recompute more than.
  std::optional<FitChoice> incumbent;  // the least-FLOPs plan known to fit
  Counts incumbent_counts;
  for (size_t k = 0; k < K && !incumbent; ++k) {
    Counts uniform(K, 0);
    uniform[k] = static_cast<int64_t>(L);
    plan_counts(uniform, incumbent);
    if (incumbent) incumbent_counts = uniform;
  }
  // Branch and bound: the multiset of least FLOPs (then least bound) that no bound rules out and
  // no plan has, below the incumbent's FLOPs; planned, it is the answer if it fits, else excluded
  // and the search runs again. When none is left, no multiset of fewer FLOPs fits in either
  // layout: the incumbent is the least.
  // Past kMaxPlans multisets planned (a bound far below the plans, as where sharded gradients
  // hold much of the peak), the search trusts the bound plus the least gap between a plan and its
  // bound seen so far (`shift`) for kMaxPlans more: its answer still fits but is not proven least.
  // A search cut short after kMaxNodes (many layers and options) plans the least multiset it had
  // found; one that fits becomes the incumbent and the search runs again below it, up to
  // kMaxCutSearches times: not proven least either, but never the incumbent it could beat.
  std::set<Counts> failed;
  constexpr size_t kMaxPlans = 64, kMaxNodes = 4000000, kMaxCutSearches = 8;
  size_t cut_searches = 0;
  while (true) {
    Counts best, n(K, 0);
    // Below the incumbent's FLOPs; of equal FLOPs the first found (the next search finds the others
    // if it does not fit). A subtree whose least FLOPs reach the best is left (FLOPs are sums of
    // whole numbers: exact in double).
    double best_flops = incumbent ? flops(incumbent_counts) : kNever;
    auto beaten = [&](double least) { return least == kNever || least >= best_flops - 0.5; };
    size_t nodes = 0;
    std::function<void(size_t, int64_t, double, int64_t)> visit = [&](size_t k, int64_t left, double fl, int64_t sv) {
      if (++nodes > kMaxNodes) return;
      if (k + 1 == K) {
        n[k] = left;
        fl += static_cast<double>(left) * chain[k].flops;
        sv += left * saved[k];
        if (sv > room - shift || beaten(fl) || failed.count(n)) return;
        if (std::min(bound_of(cal, options_of(n, true)), bound_of(cal, options_of(n, false))) + shift > budget) return;
        best = n;
        best_flops = fl;
        return;
      }
      if (beaten(fl + least_completion(k, left, room - shift - sv))) return;
      for (int64_t c = left; c >= 0; --c) {
        n[k] = c;
        visit(k + 1, left - c, fl + static_cast<double>(c) * chain[k].flops, sv + c * saved[k]);
      }
      n[k] = 0;
    };
    visit(0, static_cast<int64_t>(L), 0.0, 0);
    if (nodes > kMaxNodes) {
      proven = false;
      if (best.empty() || ++cut_searches > kMaxCutSearches) break;
      std::optional<FitChoice> fits;
      plan_counts(best, fits);
      if (fits) {
        incumbent = std::move(fits);
        incumbent_counts = best;
      } else {
        failed.insert(best);
      }
      continue;
    }
    if (failed.size() >= (shift > 0 ? 2 : 1) * kMaxPlans) {
      proven = false;
      if (shift > 0 || least_gap <= 0) break;
      shift = least_gap;
      continue;
    }
    if (best.empty()) break;
    std::optional<FitChoice> fits;
    plan_counts(best, fits);
    if (fits) return *fits;
    failed.insert(best);
  }
  return incumbent ? *incumbent : FitChoice{};
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

FitChoice Fitter::fit(int64_t budget, const std::string& budget_key) {
  const std::vector<int64_t> counts = minibatch_counts();
  // Proven while every search proved its answer least, and the minibatch counts before the
  // answer's that nothing fits.
  bool proven = true;
  for (int64_t mb : counts) {
    FitChoice best;
    for (int64_t head : head_chunks_) {
      // The head's own recompute is a floor for any layers with it.
      const FitChoice bare = plan(std::vector<LayerRemat>(static_cast<size_t>(num_layers_)), mb, head);
      if (!best.layers.empty() && bare.recompute_flops >= best.recompute_flops) continue;
      FitChoice f = fit_layers(budget, mb, head, proven);
      if (!f.layers.empty() && (best.layers.empty() || f.recompute_flops < best.recompute_flops)) best = std::move(f);
    }
    if (!best.layers.empty()) {
      best.proven_least = proven;
      return best;
    }
  }
  // The calibration's chain may have left out the option that saves the most at this depth.
  FitChoice least = smallest();
  least.proven_least = false;  // outside the search space
  if (least.total_bytes <= budget) return least;
  // The search may have planned a smaller mixed choice than smallest()'s uniform ones: name the
  // least of all, a total that fits.
  for (const auto& [key, f] : plans_by_choice_)
    if (f.total_bytes < least.total_bytes) least = f;
  // The levers that apply to this run, the likeliest first.
  const bool fixed = least.fixed_bytes >= least.arena_bytes;
  const bool lora = c_.model.lora.enabled();
  std::vector<std::string> levers;
  if (nn::model_kind(c_.model.kind).language_model && head_chunks_.size() == 1 && head_chunks_.front() == 0)
    levers.push_back("model.head_chunk=auto (the head's logits in chunks)");
  std::string dominate = "the activations dominate";
  if (fixed) {
    dominate = lora ? "the model dominates" : "parameters, gradients and optimizer state dominate";
    if (lora && c_.model.lora.base_dtype != LoraBaseDType::nf4)
      levers.push_back("a smaller lora.base_dtype (nf4 stores the frozen base in about 1/7 of float32)");
    if (!lora && c_.optimizer.shard != OptimizerShard::params)
      levers.push_back(
          "optimizer.shard=params over more ranks (mpirun; `loom memory --ranks N` shows whether a "
          "rank's plan is smaller, as small models gain less than their communication buffers cost)");
    levers.push_back("a smaller model");
  } else {
    if (c_.data.batch_size / ranks_ > 1) levers.push_back("a smaller data.batch_size");
    levers.push_back("a shorter data.seq_len");
    if (c_.model.dtype == DType::f32) levers.push_back("model.dtype=bfloat16");
  }
  std::string fix = fmt::format("a budget of at least {} ({} B), or ({}) ", format_bytes(least.total_bytes),
                                least.total_bytes, dominate);
  for (size_t i = 0; i < levers.size(); ++i) fix += (i == 0 ? "" : i + 1 == levers.size() ? ", or " : ", ") + levers[i];
  throw UserError(budget_key,
                  fmt::format("no choice fits {} ({} B): the smallest plan found is {} ({} B; {}), of which "
                              "parameters, gradients, optimizer state, inputs and buffers are {} and activations "
                              "with kernel workspace {}",
                              format_bytes(budget), budget, format_bytes(least.total_bytes), least.total_bytes,
                              describe_choice(least), format_bytes(least.fixed_bytes), format_bytes(least.arena_bytes)),
                  fix);
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
