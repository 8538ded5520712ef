#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <stdexcept>

#include "core/error.h"

namespace loom {

void LossScaler::update(bool found_inf) {
  if (found_inf) {
    ++skipped;
    ++consecutive;
  } else {
    consecutive = 0;
  }
  if (!enabled || !dynamic) return;
  if (found_inf) {
    scale = std::max(scale * backoff, min_scale);
    tracker = 0;
    return;
  }
  if (++tracker == interval) {
    scale *= growth;
    tracker = 0;
  }
}

bool weight_decay_applies(WeightDecayMask mask, ParamRole role, const Shape& shape) {
  if (mask == WeightDecayMask::all) return true;
  if (mask == WeightDecayMask::ndim2) return shape.rank >= 2;
  // kernels: dense kernels only — not biases, norm scales/biases, embeddings or position embeddings.
  return role == ParamRole::kernel;
}

Optimizer::Optimizer(const OptimizerConfig& c, DType compute_dtype, Backend& be, const Graph& g, const Executor& ex,
                     std::optional<std::vector<OptimSlice>> slices, std::function<double(double)> sum_over_ranks)
    : cfg_(c), be_(be), sum_over_ranks_(std::move(sum_over_ranks)), moments_(optimizer_moments(c)) {
  if (slices)
    slices_ = std::move(*slices);
  else
    for (size_t i = 0; i < g.params().size(); ++i)
      if (g.params()[i].trainable())
        slices_.push_back({.param = i, .begin = 0, .n = g.value(g.params()[i].value).shape.numel()});
  for (const OptimSlice& s : slices_) {
    const Param& p = g.params().at(s.param);
    const Value& v = g.value(p.value);
    LOOM_ASSERT(s.begin >= 0 && s.n > 0 && s.begin + s.n <= v.shape.numel(), "a slice outside its parameter");
    OptimTensor t;
    t.param = s.values ? s.values : static_cast<float*>(ex.ptr(p.value)) + s.begin;
    t.grad = s.grad ? s.grad : static_cast<float*>(ex.ptr(p.grad)) + s.begin;
    t.n = s.n;
    t.weight_decay = c.name == OptimizerName::adamw && weight_decay_applies(c.weight_decay_mask, p.init.role, v.shape)
                         ? static_cast<float>(c.weight_decay)
                         : 0.f;
    const size_t bytes = static_cast<size_t>(t.n) * sizeof(float);
    auto alloc = [&](float** slot) {
      void* b = be.allocate(bytes);
      if (!b) throw std::runtime_error("could not allocate optimizer state for '" + v.name + "'");
      be.fill_zero(b, bytes);
      bufs_.push_back(b);
      *slot = static_cast<float*>(b);
    };
    if (moments_ >= 1) alloc(&t.mu);
    if (moments_ == 2) alloc(&t.nu);
    ts_.push_back(t);
  }
  scaler_.enabled = compute_dtype == DType::f16 && c.loss_scale != LossScaleMode::none;
  scaler_.dynamic = c.loss_scale == LossScaleMode::dynamic;
  scaler_.scale = scaler_.enabled ? c.loss_scale_init : 1.0;
  scaler_.growth = c.loss_scale_growth;
  scaler_.backoff = c.loss_scale_backoff;
  scaler_.interval = c.loss_scale_interval;
  scaler_.min_scale = c.loss_scale_min;
}

int64_t optimizer_moments(const OptimizerConfig& c) {
  if (c.name == OptimizerName::adam || c.name == OptimizerName::adamw) return 2;
  return c.momentum > 0 ? 1 : 0;
}

Optimizer::~Optimizer() {
  for (void* b : bufs_) be_.deallocate(b);
}

OptimizerReport Optimizer::step(bool loss_finite, const UpdateOrder& order) {
  OptimizerReport r;
  r.loss_scale = loss_scale();
  if (!loss_finite) {
    r.skipped = true;
    r.nonfinite = NonFinite::loss;
    scaler_.update(true);
    return r;
  }
  // GradScaler: inv_scale = float(1 / double(scale)).
  const auto inv_scale = static_cast<float>(1.0 / r.loss_scale);
  float grad_scale = inv_scale;
  if (scaler_.enabled || cfg_.clip_norm > 0) {
    double sq = be_.grad_sq_norm(ts_);
    if (sum_over_ranks_) sq = sum_over_ranks_(sq);
    if (!std::isfinite(sq)) {
      r.skipped = true;
      r.nonfinite = NonFinite::grad_norm;
      scaler_.update(true);
      return r;
    }
    r.grad_norm = std::sqrt(sq) * inv_scale;
    // optax.clip_by_global_norm: keep when g < max_norm, else t / g * max_norm.
    if (cfg_.clip_norm > 0 && !(r.grad_norm < cfg_.clip_norm))
      grad_scale = static_cast<float>(inv_scale * (cfg_.clip_norm / r.grad_norm));
  }
  ScheduleSpec sched = cfg_.schedule;
  sched.value = cfg_.learning_rate;
  sched.has_end_value = sched.kind == ScheduleKind::warmup_exponential_decay && sched.end_value != 0.0;
  r.lr = schedule_value(sched, count_);
  OptimHyper h;
  h.kind = cfg_.name == OptimizerName::sgd ? OptimKind::sgd : OptimKind::adam;
  h.lr = static_cast<float>(r.lr);
  h.b1 = static_cast<float>(cfg_.b1);
  h.b2 = static_cast<float>(cfg_.b2);
  h.eps = static_cast<float>(cfg_.eps);
  h.eps_root = static_cast<float>(cfg_.eps_root);
  h.momentum = static_cast<float>(cfg_.momentum);
  h.nesterov = cfg_.nesterov;
  h.count = count_ + 1;
  h.grad_scale = grad_scale;
  if (order.first.empty() && !order.poll) {
    be_.optimizer_update(ts_, h);
  } else {
    std::vector<OptimTensor> first;
    std::vector<char> is_first(ts_.size(), 0);
    for (size_t k : order.first) {
      first.push_back(ts_[k]);
      is_first[k] = 1;
    }
    be_.optimizer_update(first, h);
    if (order.after_first) order.after_first();
    for (size_t k = 0; k < ts_.size(); ++k) {
      if (is_first[k]) continue;
      be_.optimizer_update(std::span(&ts_[k], 1), h);
      if (order.poll) order.poll();
    }
  }
  ++count_;
  scaler_.update(false);
  return r;
}

}  // namespace loom
