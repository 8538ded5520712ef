#include "train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>

#include "core/error.h"
#include "core/format.h"
#include "graph/passes/autodiff.h"
#include "graph/passes/remat.h"
#include "io/param_io.h"
#include "nn/init.h"
#include "nn/models.h"
#include "train/checkpoint.h"
#include "train/evaluator.h"
#include "train/fit.h"

namespace loom {

namespace {
// Elements of a gradient bucket (train.bucket_kib). Under optimizer.shard = params every parameter
// is a bucket of its own, so that a rank's chunk of a bucket is its chunk of one parameter: the
// shard a use's all-gather reads.
int64_t bucket_elems(const Config& c) {
  if (c.optimizer.shard == OptimizerShard::params) return 1;
  return c.train.bucket_kib * 1024 / static_cast<int64_t>(sizeof(float));
}
// Whether the gradients are sharded (state+grads, and params, which shards them as it does).
bool shards_grads(const Config& c) {
  return c.optimizer.shard == OptimizerShard::state_grads || c.optimizer.shard == OptimizerShard::params;
}

// The gradients in the order of their last write (gradient_order) and the buckets every rank
// cuts them into (what the Trainer's dist::BucketReducer plans from the same sizes).
struct GradientBuckets {
  std::vector<std::pair<size_t, size_t>> order;
  std::vector<dist::Bucket> buckets;
  // Scheduled nodes run once bucket b's gradients are final: when it starts.
  size_t ready(size_t b) const { return order[buckets[b].last - 1].second; }
};
GradientBuckets gradient_buckets(const Config& c, const TrainProgram& p) {
  const Graph& g = p.model.graph;
  GradientBuckets gb{.order = gradient_order(p), .buckets = {}};
  std::vector<int64_t> sizes;
  for (const auto& [param, at] : gb.order) sizes.push_back(g.value(g.params()[param].value).shape.numel());
  gb.buckets = dist::plan_buckets(sizes, bucket_elems(c));
  return gb;
}
}  // namespace

int64_t minibatch_size(const Config& c, int ranks) {
  const int64_t per_step = ranks * c.optimizer.num_minibatches;  // minibatches of one global step
  if (c.data.batch_size % per_step != 0)
    throw UserError("data.batch_size",
                    fmt::format("batch size {} is not divisible by {} rank{} × optimizer.num_minibatches {} = {}",
                                c.data.batch_size, ranks, ranks == 1 ? "" : "s", c.optimizer.num_minibatches, per_step),
                    "make data.batch_size a multiple of ranks × optimizer.num_minibatches, or change "
                    "optimizer.num_minibatches or the number of ranks (mpirun -np)");
  return c.data.batch_size / per_step;
}

TrainProgram build_train_program(const Config& c, int ranks) {
  TrainProgram p;
  p.model = nn::build_model(c.model, model_input(c, minibatch_size(c, ranks)), /*train=*/true);
  Graph& g = p.model.graph;
  p.dloss = g.add_input("loss_seed", Shape{}, DType::f32);
  p.num_forward = build_backward(g, p.model.loss_sum, p.dloss);
  RematPolicy policy{.kind = c.model.remat_policy, .save_names = {}};
  for (size_t start = 0; start < c.model.remat_save_names.size();) {
    size_t end = c.model.remat_save_names.find(',', start);
    if (end == std::string::npos) end = c.model.remat_save_names.size();
    if (end > start) policy.save_names.push_back(c.model.remat_save_names.substr(start, end - start));
    start = end + 1;
  }
  std::vector<RematPolicy> layer_policies;
  for (const LayerRemat& l : c.model.remat_layers)
    layer_policies.push_back(RematPolicy{.kind = l.policy, .save_names = policy.save_names});
  p.schedule = apply_remat(g, p.num_forward, policy, layer_policies);
  p.zero_grads = mark_first_grad_writes(g, p.schedule, c.optimizer.num_minibatches == 1);
  return p;
}

std::vector<std::pair<size_t, size_t>> gradient_order(const TrainProgram& p) {
  const Graph& g = p.model.graph;
  std::vector<size_t> written(g.values().size(), 0);
  for (size_t s = 0; s < p.schedule.size(); ++s) {
    const Node& n = g.node(p.schedule[s]);
    if (op_info(n.op).flags & kOpWritesGrad) written[n.in[0]] = s + 1;
  }
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t i = 0; i < g.params().size(); ++i)
    if (g.params()[i].trainable()) out.emplace_back(i, written[g.params()[i].grad]);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  return out;
}

RankMemory rank_memory(const Config& c, const TrainProgram& p, int ranks) {
  const GradientBuckets gb = gradient_buckets(c, p);
  RankMemory m;
  for (const dist::Bucket& b : gb.buckets) m.optimizer_elems += b.elems;
  m.checkpoint_stream_bytes = checkpoint_stream_bytes();
  if (ranks == 1) return m;
  m.comm_buffer_bytes = dist::BucketReducer::buffer_bytes(gb.buckets, ranks);
  if (c.optimizer.shard != OptimizerShard::none)
    m.optimizer_elems = dist::BucketReducer::shard_elems(gb.buckets, ranks);  // the largest share
  if (shards_grads(c)) m.grad_shard_elems = m.optimizer_elems;
  if (c.optimizer.shard == OptimizerShard::params) m.param_shard_elems = m.optimizer_elems;
  return m;
}

PlanOptions rank_plan_options(const Config& c, const TrainProgram& p, int ranks, PlanOptions base) {
  if (ranks == 1 || !shards_grads(c)) return base;
  base.gather_params = c.optimizer.shard == OptimizerShard::params;
  base.gather_ahead = static_cast<int32_t>(std::min<int64_t>(c.optimizer.gather_ahead, INT32_MAX));
  const Graph& g = p.model.graph;
  const GradientBuckets gb = gradient_buckets(c, p);
  const auto last_step = static_cast<int32_t>(p.schedule.size()) - 1;
  base.grad_release.assign(g.values().size(), -1);
  for (size_t b = 0; b < gb.buckets.size(); ++b) {
    const size_t waits_at = b + dist::Comm::kMaxPending;  // the bucket whose start waits for this one
    const int32_t release =
        waits_at < gb.buckets.size() ? std::max(0, static_cast<int32_t>(gb.ready(waits_at)) - 1) : last_step;
    for (size_t k = gb.buckets[b].first; k < gb.buckets[b].last; ++k)
      base.grad_release[static_cast<size_t>(g.params()[gb.order[k].first].grad)] = release;
  }
  return base;
}

namespace {

// Everything the run will hold, from the plan (what `loom memory` prints): the training
// program's buffers and, when the run evaluates, the evaluation program's inputs and its arena
// unless that fits in the training program's. Refuses before any allocation when it cannot fit,
// with the figures and the levers, instead of failing inside. The ranks on one machine share its
// memory and each needs about this (their shards differ by at most a chunk), so the check is for
// all of them together: every rank reads the memory between two collectives, after every rank has
// planned and before any allocates, and all ranks stop if any machine is short.
void refuse_unless_it_fits(const Config& c, Backend& be, const TrainProgram& prog, const MemoryPlan& plan,
                           dist::Comm& comm, bool evaluates) {
  if (comm.size() > 1) comm.barrier();
  std::optional<UserError> refusal;
  const RankMemory rank = rank_memory(c, prog, comm.size());
  const int64_t evaluation = evaluates ? Evaluator::planned_bytes(c, comm.size(), plan.arena_bytes) : 0;
  const int64_t needed = plan.arena_bytes + plan.param_bytes + plan.grad_bytes + plan.input_bytes + plan.library_bytes +
                         rank.shard_bytes(optimizer_moments(c.optimizer)) + rank.comm_buffer_bytes +
                         rank.checkpoint_stream_bytes + evaluation;
  // train.memory_budget is a limit for every run: model.remat = auto chose a plan within it,
  // any other is refused above it.
  if (!c.model.remat.has(RematRegion::auto_) && !c.train.memory_budget.empty()) {
    if (const int64_t budget = parse_bytes(c.train.memory_budget, "train.memory_budget"); needed > budget)
      refusal.emplace("train.memory_budget",
                      fmt::format("is {} ({} B) but the run plans {} ({} B){}", c.train.memory_budget, budget,
                                  format_bytes(needed), needed, comm.size() > 1 ? " a rank" : ""),
                      "set model.remat=auto to choose a plan within it (`loom memory --fit` shows them), or raise it");
  }
  if (const int64_t available = be.memory_available(); available >= 0 && !refusal) {
    const int on_host = comm.ranks_on_this_host();
    if (needed * on_host > available) {
      constexpr double kGiB = 1073741824.0;
      const std::string parts = fmt::format(
          "activations {:.2f}, parameters, gradients, optimizer state, inputs, library, communication and "
          "checkpoint buffers {:.2f}{}",
          plan.arena_bytes / kGiB, (needed - plan.arena_bytes - evaluation) / kGiB,
          evaluation > 0 ? fmt::format(", evaluation {:.2f}", evaluation / kGiB) : "");
      const std::string what = on_host > 1
                                   ? fmt::format("{:.2f} GiB for its {} ranks on this machine ({:.2f} GiB each: {})",
                                                 needed * on_host / kGiB, on_host, needed / kGiB, parts)
                                   : fmt::format("{:.2f} GiB ({})", needed / kGiB, parts);
      std::string hint = std::string("shrink the activations: model.remat=Block, more optimizer.num_minibatches, ") +
                         (c.model.dtype == DType::f32 ? "model.dtype=bfloat16, " : "") + "or a smaller data.batch_size";
      if (on_host > 1)
        hint += std::string("; or fewer ranks on this machine") +
                (c.optimizer.shard != OptimizerShard::state_grads ? ", or optimizer.shard=state+grads" : "");
      hint += comm.size() > 1 ? fmt::format(" (`loom memory --ranks {}` shows a rank's plan)", comm.size())
                              : std::string(" (`loom memory` shows the plan)");
      // model.remat = auto fitted the plan to a budget above what this machine has.
      if (c.model.remat.has(RematRegion::auto_) && !c.train.memory_budget.empty())
        hint = fmt::format(
            "train.memory_budget = {} is more than this machine has{}: lower it, or leave it empty "
            "to fit the memory available",
            c.train.memory_budget, on_host > 1 ? " for its ranks" : "");
      refusal.emplace(c.source, fmt::format("the run needs {} but {:.2f} GiB are available", what, available / kGiB),
                      hint);
    }
  }
  if (comm.size() > 1) {
    // Every rank says whether its machine is short; this is the second collective.
    std::vector<char> short_of(static_cast<size_t>(comm.size()));
    const char mine = refusal ? 1 : 0;
    comm.all_gather_bytes(&mine, 1, short_of.data());
    const auto first = std::find(short_of.begin(), short_of.end(), 1);
    if (refusal) throw dist::AgreedError(*refusal);
    if (first != short_of.end())
      throw dist::AgreedError(c.source,
                              fmt::format("the machine of rank {} lacks the memory for its ranks (its error says "
                                          "by how much)",
                                          first - short_of.begin()),
                              "see rank " + std::to_string(first - short_of.begin()) + "'s error");
  } else if (refusal) {
    throw *refusal;
  }
}

}  // namespace

namespace {
// model.remat = auto: `c` with the least-recompute choice that fits the budget (train/fit.h),
// announced in one line by rank 0.
Config resolve_auto_remat(const Config& c, Backend& be, dist::Comm& comm) {
  if (!c.model.remat.has(RematRegion::auto_) || !c.model.remat_layers.empty()) return c;
  int64_t budget = fit_budget(c, be.memory_available(), comm.ranks_on_this_host());
  // Every rank must make the same choice (its minibatch count shapes the data split and every
  // collective), but each read its own machine's memory: the job fits the smallest budget.
  std::vector<int64_t> budgets(static_cast<size_t>(comm.size()));
  comm.all_gather_bytes(&budget, sizeof budget, budgets.data());
  budget = *std::min_element(budgets.begin(), budgets.end());
  if (budget < 0)
    throw UserError("train.memory_budget", "model.remat = auto needs a budget and this backend reports none",
                    "set train.memory_budget, e.g. 20GiB");
  Fitter fitter(c, comm.size());
  const FitChoice f = fitter.fit(budget);
  if (comm.rank() == 0)
    fmt::print(stderr, "remat auto: {}: plan {} of {}, recompute +{:.1f}% FLOPs{}\n", describe_choice(f),
               format_bytes(f.total_bytes), format_bytes(budget), 100 * f.recompute_flops / f.step_flops,
               f.proven_least ? "" : " (not proven least)");
  return fitter.apply(f);
}
}  // namespace

Trainer::Trainer(const Config& config, Backend& be, PlanOptions plan_options, dist::Comm* comm, bool evaluates)
    : cfg_(resolve_auto_remat(config, be, comm ? *comm : dist::single_process())),
      be_(be),
      prog_(build_train_program(cfg_, comm ? comm->size() : 1)),
      comm_(comm ? *comm : dist::single_process()) {
  const Config& c = cfg_;  // model.remat = auto resolved
  const Graph& g = prog_.model.graph;
  MemoryPlan plan = plan_program(be, g, prog_.schedule, rank_plan_options(c, prog_, comm_.size(), plan_options));
  refuse_unless_it_fits(c, be, prog_, plan, comm_, evaluates);
  if (Status s = Executor::create(be, g, std::move(plan), &exec_); !s) throw std::runtime_error(s.message());
  for (const auto& [v, bytes] : prog_.model.constants) exec_->upload(v, bytes.data());
  sharded_ = c.optimizer.shard != OptimizerShard::none && comm_.size() > 1;
  const bool shard_params = sharded_ && c.optimizer.shard == OptimizerShard::params;
  // In bounded slices, a LoRA base stored as lora.base_dtype says: no host copy of a whole tensor.
  // Sharded parameters are drawn below, into the shard.
  if (!shard_params)
    for (const Param& p : g.params()) init_param_in(*exec_, p, c.seed);
  const std::vector<std::pair<size_t, size_t>> written = gradient_order(prog_);
  for (const auto& [param, at] : written) order_.push_back(param);
  std::vector<dist::FloatSpan> grads;
  for (size_t i : order_) {
    const Param& p = g.params()[i];
    const int64_t n = g.value(p.value).shape.numel();
    grads.push_back({static_cast<float*>(exec_->ptr(p.grad)), n});
    params_.push_back({static_cast<float*>(exec_->ptr(p.value)), n});
  }
  if (sharded_ && shards_grads(c)) {
    // This rank's chunk of every bucket, end to end (BucketReducer's shard).
    const GradientBuckets gb = gradient_buckets(c, prog_);
    int64_t elems = 0;
    for (const dist::Bucket& b : gb.buckets) elems += dist::chunk(b.elems, comm_.size(), comm_.rank()).size();
    grad_shard_ = static_cast<float*>(be.allocate(static_cast<size_t>(elems) * sizeof(float)));
    if (!grad_shard_) throw std::runtime_error("could not allocate the gradient shard");
    if (shard_params) {  // the parameters' chunks, laid out as the gradients'
      param_shard_ = static_cast<float*>(be.allocate(static_cast<size_t>(elems) * sizeof(float)));
      if (!param_shard_) throw std::runtime_error("could not allocate the parameter shard");
    }
    // A gradient the first writer does not assign is zeroed right before its buffer's first step.
    zero_at_.resize(prog_.schedule.size());
    for (ValueId v : prog_.zero_grads)
      for (const BufferInfo& b : exec_->plan().buffers)
        if (b.value == v) zero_at_[static_cast<size_t>(b.first)].push_back(v);
  }
  reducer_ = std::make_unique<dist::BucketReducer>(comm_, std::move(grads), bucket_elems(c), sharded_, grad_shard_);
  for (size_t b = 0; b < reducer_->num_buckets(); ++b) bucket_ready_.push_back(written[reducer_->last(b) - 1].second);
  bucket_span_.assign(reducer_->num_buckets(), -1);
  reducer_->set_on_complete([this](size_t b) {
    if (recorder_) recorder_->end_span(bucket_span_[b]);
  });
  if (shard_params) {
    // Parameter i is bucket shard_bucket_[i]; this rank draws its chunk alone (nn/init.h).
    shard_bucket_.assign(g.params().size(), 0);
    for (size_t b = 0; b < reducer_->num_buckets(); ++b) {
      LOOM_ASSERT(reducer_->last(b) - reducer_->first(b) == 1, "one parameter per bucket under optimizer.shard = params");
      shard_bucket_[order_[reducer_->first(b)]] = b;
    }
    std::vector<float> values;
    for (size_t i = 0; i < g.params().size(); ++i) {
      const dist::Range own = shard_range(i);
      values.resize(static_cast<size_t>(own.size()));
      ParamDraw(g, g.params()[i], c.seed).fill(own.begin, own.size(), values.data());
      write_param_shard(i, own.begin, own.size(), values.data());
    }
    gathers_ = ParamGathers(
        comm_, *exec_, [this](size_t i) { return param_chunk(i); }, c.optimizer.gather_ahead > 0);
  }
  if (!sharded_) {
    opt_ = std::make_unique<Optimizer>(c.optimizer, c.model.dtype, be, g, *exec_);
    return;
  }
  // This rank's slices: its chunk of every bucket, cut at the parameters' boundaries.
  std::vector<OptimSlice> slices;
  for (size_t b = 0; b < reducer_->num_buckets(); ++b) {
    const dist::Range own = reducer_->own(b);
    int64_t at = 0;  // where buffer k starts in the bucket
    for (size_t k = reducer_->first(b); k < reducer_->last(b); at += params_[k++].n) {
      const int64_t lo = std::max(own.begin, at), hi = std::min(own.end, at + params_[k].n);
      if (lo < hi)
        slices.push_back({.param = order_[k],
                          .begin = lo - at,
                          .n = hi - lo,
                          .grad = grad_shard_ ? grad_shard_ + reducer_->shard_offset(b) + (lo - own.begin) : nullptr,
                          .values = param_shard_ ? param_shard_ + reducer_->shard_offset(b) + (lo - own.begin) : nullptr});
    }
  }
  // Σ over ranks of their parts of the squared norm, in rank order (the same on every rank).
  auto sum_over_ranks = [this](double part) {
    std::vector<double> parts(static_cast<size_t>(comm_.size()));
    comm_.all_gather_bytes(&part, sizeof part, parts.data());
    double s = 0;
    for (double p : parts) s += p;
    return s;
  };
  for (size_t k = 0; k < slices.size(); ++k)
    if (std::ranges::find(gathers_.early_params(), slices[k].param) != gathers_.early_params().end())
      early_slices_.push_back(k);
  opt_ = std::make_unique<Optimizer>(c.optimizer, c.model.dtype, be, g, *exec_, std::move(slices), sum_over_ranks);
}

Trainer::~Trainer() {
  try {
    gathers_.settle();  // every rank started them (after its last update): they complete
  } catch (...) {      // NOLINT(bugprone-empty-catch): a failed rank ends the job anyway
  }
  if (grad_shard_) be_.deallocate(grad_shard_);
  if (param_shard_) be_.deallocate(param_shard_);
}

StepReport Trainer::step(const Batch& batch) {
  const auto t0 = std::chrono::steady_clock::now();
  ScopedSpan step_span(recorder_, SpanKind::train_step, step_ + 1);
  const Graph& g = prog_.model.graph;
  const int64_t nmb = cfg_.optimizer.num_minibatches;
  const int64_t ranks = comm_.size();
  const auto first = static_cast<uint32_t>(comm_.rank() * nmb);  // this rank's first global minibatch
  LOOM_ASSERT(batch.batch_size == cfg_.data.batch_size, "batch size differs from the configured one");
  // The others are assigned in minibatch `first`; sharded gradients are the arena's, assigned in
  // every minibatch (zero_at_) and summed into the shard.
  if (grad_shard_)
    be_.fill_zero(grad_shard_, static_cast<size_t>(grad_shard_bytes()));
  else
    for (ValueId grad : prog_.zero_grads) exec_->zero(grad);
  // Seed of d(loss_sum): the loss is the sum of the target tokens' losses over the whole global
  // batch divided by the number of those targets (the header's normalisation), times the fp16
  // loss scale. Every rank holds the global batch, so each counts every minibatch's targets
  // itself: the same count on every rank, before the step, with no collective.
  std::vector<int64_t> targets(static_cast<size_t>(nmb * ranks));
  int64_t all_targets = 0;
  for (size_t k = 0; k < targets.size(); ++k) {
    const int64_t rows = batch.batch_size / (nmb * ranks);
    targets[k] = batch.targets(static_cast<int64_t>(k) * rows, rows);
    all_targets += targets[k];
  }
  // A batch without targets (every label masked) has a zero loss and no gradient.
  const auto seed = all_targets ? static_cast<float>(opt_->loss_scale() / static_cast<double>(all_targets)) : 0.f;
  exec_->upload(prog_.dloss, &seed);
  const size_t in_bytes = static_cast<size_t>(g.value(prog_.model.inputs).bytes());
  const size_t lab_count = static_cast<size_t>(g.value(prog_.model.labels).shape.numel());
  struct MinibatchResult {
    float loss = 0;
    int32_t correct = 0;
  };
  std::vector<MinibatchResult> results(static_cast<size_t>(nmb * ranks));
  for (int64_t i = 0; i < nmb; ++i) {
    ScopedSpan minibatch_span(recorder_, SpanKind::minibatch, i);
    const uint32_t mb = first + static_cast<uint32_t>(i);
    exec_->upload(prog_.model.inputs, batch.inputs.data() + mb * in_bytes);
    exec_->upload(prog_.model.labels, batch.labels.data() + mb * lab_count);
    if (prog_.model.positions != kNoValue)
      exec_->upload(prog_.model.positions, batch.positions.data() + mb * lab_count);
    const RunCtx rc{.seed = cfg_.seed,
                    .step = static_cast<uint64_t>(step_),
                    .minibatch = mb,
                    .first_minibatch = grad_shard_ ? mb : first};
    if (i + 1 < nmb && !grad_shard_)
      exec_->run(rc);
    else
      run_with_buckets(rc);
    exec_->download(prog_.model.loss_sum, &results[mb].loss);
    exec_->download(prog_.model.correct, &results[mb].correct);
  }
  // Every rank's results in global minibatch order, summed as one process sums its minibatches.
  comm_.all_gather_bytes(&results[first], static_cast<size_t>(nmb) * sizeof(MinibatchResult), results.data());
  StepReport r;
  for (size_t k = 0; k < results.size(); ++k) {
    r.metrics.loss.sum += results[k].loss;
    r.metrics.loss.count += targets[k];
    r.metrics.accuracy.sum += results[k].correct;
    r.metrics.accuracy.count += targets[k];
  }
  {
    ScopedSpan optimizer_span(recorder_, SpanKind::optimizer, step_ + 1);
    // A non-finite loss (the forward diverged or overflowed) applies no update: the run decides
    // whether to stop (train.on_nonfinite) with the last good state intact. Every rank sees the
    // same summed loss, so all of them skip or none.
    // With a prefetch, the next step's first gathers start once their chunks are updated and
    // advance while the rest of the update runs (or, skipped, start from the chunks as they are).
    Optimizer::UpdateOrder order;
    if (!gathers_.early_params().empty())
      order = {.first = early_slices_,
               .after_first = [this] { gathers_.start_early(); },
               .poll = [this] { gathers_.poll(/*overlapped=*/true); }};
    r.opt = opt_->step(std::isfinite(r.metrics.loss.sum), order);
    gathers_.start_early();
    // Every rank's updated chunks to every rank (sharded parameters are gathered when used).
    if (sharded_ && !param_shard_ && !r.opt.skipped) reducer_->all_gather(params_);
  }
  ++step_;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// A minibatch (the last one, or each with sharded gradients) with the gradient buckets started as
// they become final and advanced between kernels while the rest of the backward runs; every sum
// has completed on return. Sharded parameters: each gather starts before its buffer's first step,
// is polled between kernels and waited for right before its first use.
void Trainer::run_with_buckets(const RunCtx& rc) {
  const size_t nodes = prog_.schedule.size(), buckets = reducer_->num_buckets();
  if (buckets == 0) return exec_->run(rc);
  size_t b = 0;
  for (size_t s = 0;; ++s) {
    if (s < zero_at_.size())
      for (ValueId v : zero_at_[s]) exec_->zero(v);
    for (; b < buckets && bucket_ready_[b] == s; ++b) {
      bucket_span_[b] = recorder_ ? recorder_->begin_span(SpanKind::communication, static_cast<int64_t>(b)) : -1;
      reducer_->start(b);
    }
    if (s == nodes) break;
    gathers_.before_step(s);
    exec_->run_steps(rc, s, s + 1);
    reducer_->progress();
    gathers_.poll();
  }
  LOOM_ASSERT(gathers_.idle(), "a gathered buffer that no step reads");
  reducer_->finish();
}

namespace {
// The slice of `param` in `slices` (at most one: a parameter lies in one bucket), or nullptr.
const OptimSlice* slice_of(const std::vector<OptimSlice>& slices, size_t param, size_t* k) {
  for (*k = 0; *k < slices.size(); ++*k)
    if (slices[*k].param == param) return &slices[*k];
  return nullptr;
}
}  // namespace

dist::Range Trainer::moment_range(size_t param) const {
  size_t k = 0;
  const OptimSlice* s = slice_of(opt_->slices(), param, &k);
  return s ? dist::Range{s->begin, s->begin + s->n} : dist::Range{};
}

void Trainer::read_moment(int which, size_t param, int64_t begin, int64_t n, float* out) const {
  if (n == 0) return;
  size_t k = 0;
  const OptimSlice* s = slice_of(opt_->slices(), param, &k);
  LOOM_ASSERT(s && begin >= s->begin && begin + n <= s->begin + s->n, "a moment range this rank does not hold");
  const float* buf = which == 0 ? opt_->tensors()[k].mu : opt_->tensors()[k].nu;
  be_.copy_to_host(out, buf + (begin - s->begin), static_cast<size_t>(n) * sizeof(float));
}

void Trainer::write_moment(int which, size_t param, int64_t begin, int64_t n, const float* values) {
  if (n == 0) return;
  size_t k = 0;
  const OptimSlice* s = slice_of(opt_->slices(), param, &k);
  LOOM_ASSERT(s && begin >= s->begin && begin + n <= s->begin + s->n, "a moment range this rank does not hold");
  float* buf = which == 0 ? opt_->tensors()[k].mu : opt_->tensors()[k].nu;
  if (buf) be_.copy_to_device(buf + (begin - s->begin), values, static_cast<size_t>(n) * sizeof(float));
}

void Trainer::restore_progress(int64_t step, int64_t opt_count, double loss_scale, int64_t scaler_tracker,
                               int64_t scaler_skipped, int64_t scaler_consecutive) {
  step_ = step;
  opt_->set_count(opt_count);
  LossScaler& sc = opt_->scaler();
  if (sc.enabled) sc.scale = loss_scale;
  sc.tracker = scaler_tracker;
  sc.skipped = scaler_skipped;
  sc.consecutive = scaler_consecutive;
}

void Trainer::set_recorder(OpRecorder* r) {
  recorder_ = r;
  exec_->set_recorder(r);
}

dist::Range Trainer::shard_range(size_t param) const {
  const size_t b = shard_bucket_[param];
  return reducer_->own(b);  // a bucket is one parameter: its chunk is the parameter's
}

const float* Trainer::param_chunk(size_t param) const {
  LOOM_ASSERT(param_shard_, "parameters are not sharded");
  return param_shard_ + reducer_->shard_offset(shard_bucket_[param]);
}

size_t Trainer::param_index(const std::string& path) const {
  const Graph& g = prog_.model.graph;
  const ValueId v = g.input_by_name(path);
  if (v == kNoValue || !g.param_of(v)) throw std::invalid_argument("no parameter '" + path + "'");
  for (size_t i = 0; i < g.params().size(); ++i)
    if (g.params()[i].value == v) return i;
  throw std::logic_error("a parameter value outside Graph::params()");
}

void Trainer::read_param_shard(size_t param, int64_t begin, int64_t n, float* out) const {
  const dist::Range own = shard_range(param);
  LOOM_ASSERT(begin >= own.begin && begin + n <= own.end, "a parameter range this rank does not hold");
  be_.copy_to_host(out, param_shard_ + reducer_->shard_offset(shard_bucket_[param]) + (begin - own.begin),
                   static_cast<size_t>(n) * sizeof(float));
}

void Trainer::write_param_shard(size_t param, int64_t begin, int64_t n, const float* values) {
  gathers_.settle();  // a next step's gathers started from the old values: that step starts them again
  const dist::Range own = shard_range(param);
  LOOM_ASSERT(begin >= own.begin && begin + n <= own.end, "a parameter range this rank does not hold");
  be_.copy_to_device(param_shard_ + reducer_->shard_offset(shard_bucket_[param]) + (begin - own.begin), values,
                     static_cast<size_t>(n) * sizeof(float));
}

ParamSink Trainer::param_sink() {
  if (!param_shard_) return executor_sink(*exec_);
  const Graph& g = prog_.model.graph;
  auto index = std::make_shared<std::map<ValueId, size_t>>();  // Graph::params() order
  for (size_t i = 0; i < g.params().size(); ++i) (*index)[g.params()[i].value] = i;
  return {.keep =
              [this, index](ValueId p) {
                const dist::Range own = shard_range(index->at(p));
                return std::pair<int64_t, int64_t>{own.begin, own.end};
              },
          .store = [this, index](ValueId p, int64_t at, const float* values,
                                 size_t n) { write_param_shard(index->at(p), at, static_cast<int64_t>(n), values); }};
}

std::vector<float> Trainer::param(const std::string& path) const {
  const size_t i = param_index(path);
  const ValueId v = prog_.model.graph.params()[i].value;
  if (!param_shard_) return download_param(*exec_, v);
  std::vector<float> out(static_cast<size_t>(prog_.model.graph.value(v).shape.numel()));
  const dist::Range own = shard_range(i);
  read_param_shard(i, own.begin, own.size(), out.data() + own.begin);
  comm_.all_gather(out.data() + own.begin, static_cast<int64_t>(out.size()), out.data());
  return out;
}

std::vector<float> Trainer::grad(const std::string& path) const {
  const Graph& g = prog_.model.graph;
  const ValueId v = g.input_by_name(path);
  if (v == kNoValue || !g.param_of(v)) throw std::invalid_argument("no parameter '" + path + "'");
  if (!g.param_of(v)->trainable())
    throw std::invalid_argument("parameter '" + path + "' is frozen: it has no gradient");
  std::vector<float> out(static_cast<size_t>(g.value(v).shape.numel()));
  if (!grad_shard_) {
    exec_->download(g.grad_of(v), out.data());
    return out;
  }
  for (size_t k = 0; k < opt_->slices().size(); ++k) {  // the shard's parts of this parameter
    const OptimSlice& sl = opt_->slices()[k];
    if (g.params()[sl.param].value == v)
      be_.copy_to_host(out.data() + sl.begin, opt_->tensors()[k].grad, static_cast<size_t>(sl.n) * sizeof(float));
  }
  return out;
}

void Trainer::set_param(const std::string& path, const std::vector<float>& values) {
  const ValueId v = prog_.model.graph.input_by_name(path);
  if (v == kNoValue || !prog_.model.graph.param_of(v)) throw std::invalid_argument("no parameter '" + path + "'");
  if (static_cast<int64_t>(values.size()) != prog_.model.graph.value(v).shape.numel())
    throw std::invalid_argument("wrong element count for parameter '" + path + "'");
  if (!param_shard_) return upload_param(*exec_, v, values.data());
  const size_t i = param_index(path);
  const dist::Range own = shard_range(i);
  write_param_shard(i, own.begin, own.size(), values.data() + own.begin);
}

}  // namespace loom
