#include "train/trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <stdexcept>

#include "core/error.h"
#include "graph/passes/autodiff.h"
#include "graph/passes/remat.h"
#include "nn/init.h"
#include "nn/models.h"

namespace loom {

TrainProgram build_train_program(const Config& c) {
  TrainProgram p;
  p.model = nn::build_model(c.model, model_input(c, c.data.batch_size / c.optimizer.num_minibatches), /*train=*/true);
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
  p.schedule = apply_remat(g, p.num_forward, policy);
  p.zero_grads = mark_first_grad_writes(g, p.schedule);
  return p;
}

Trainer::Trainer(const Config& c, Backend& be, PlanOptions plan_options)
    : cfg_(c), be_(be), prog_(build_train_program(c)) {
  const Graph& g = prog_.model.graph;
  MemoryPlan plan = plan_program(be, g, prog_.schedule, plan_options);
  // Everything the run will hold, from the plan (what `loom memory` prints): refuse before any
  // allocation when it cannot fit, with the figures and the levers, instead of failing inside.
  const int64_t needed = plan.arena_bytes + plan.param_bytes + plan.grad_bytes + plan.input_bytes +
                         optimizer_moments(c.optimizer) * plan.param_bytes;
  const int64_t available = be.memory_available();
  if (available >= 0 && needed > available)
    throw UserError(c.source,
                    fmt::format("the run needs {:.2f} GiB (activations {:.2f}, parameters, gradients and optimizer "
                                "state {:.2f}) but {:.2f} GiB are available",
                                needed / 1073741824.0, plan.arena_bytes / 1073741824.0,
                                (needed - plan.arena_bytes) / 1073741824.0, available / 1073741824.0),
                    std::string("shrink the activations: model.remat=Block, more optimizer.num_minibatches, ") +
                        (c.model.dtype == DType::f32 ? "model.dtype=bfloat16, " : "") +
                        "or a smaller data.batch_size (`loom memory` shows the plan)");
  if (Status s = Executor::create(be, g, std::move(plan), &exec_); !s) throw std::runtime_error(s.message());
  for (const auto& [v, bytes] : prog_.model.constants) exec_->upload(v, bytes.data());
  std::vector<float> host;
  for (const Param& p : g.params()) {
    init_param(g, p, c.seed, host);
    exec_->upload(p.value, host.data());
  }
  opt_ = std::make_unique<Optimizer>(c.optimizer, c.model.dtype, be, g, *exec_);
}

Trainer::~Trainer() = default;

StepReport Trainer::step(const Batch& batch) {
  const auto t0 = std::chrono::steady_clock::now();
  ScopedSpan step_span(recorder_, SpanKind::train_step, step_ + 1);
  const Graph& g = prog_.model.graph;
  const int64_t nmb = cfg_.optimizer.num_minibatches;
  LOOM_ASSERT(batch.batch_size == cfg_.data.batch_size, "batch size differs from the configured one");
  for (ValueId grad : prog_.zero_grads) exec_->zero(grad);  // the others are assigned in minibatch 0
  // Seed of d(loss_sum): the loss is the mean over every example (token) of the batch — each
  // minibatch's mean, averaged over minibatches, is Σ / (examples per minibatch × minibatches) —
  // times the fp16 loss scale.
  const auto seed = static_cast<float>(opt_->loss_scale() / static_cast<double>(prog_.model.examples * nmb));
  exec_->upload(prog_.dloss, &seed);
  const size_t in_bytes = static_cast<size_t>(g.value(prog_.model.inputs).bytes());
  const size_t lab_count = static_cast<size_t>(g.value(prog_.model.labels).shape.numel());
  StepReport r;
  for (int64_t i = 0; i < nmb; ++i) {
    ScopedSpan minibatch_span(recorder_, SpanKind::minibatch, i);
    exec_->upload(prog_.model.inputs, batch.inputs.data() + static_cast<size_t>(i) * in_bytes);
    exec_->upload(prog_.model.labels, batch.labels.data() + static_cast<size_t>(i) * lab_count);
    exec_->run(RunCtx{.seed = cfg_.seed, .step = static_cast<uint64_t>(step_), .minibatch = static_cast<uint32_t>(i)});
    float loss = 0;
    int32_t correct = 0;
    exec_->download(prog_.model.loss_sum, &loss);
    exec_->download(prog_.model.correct, &correct);
    r.metrics["loss"].sum += loss;
    r.metrics["loss"].count += prog_.model.examples;
    r.metrics["accuracy"].sum += correct;
    r.metrics["accuracy"].count += prog_.model.examples;
  }
  {
    ScopedSpan optimizer_span(recorder_, SpanKind::optimizer, step_ + 1);
    // A non-finite loss (the forward diverged or overflowed) applies no update: the run decides
    // whether to stop (train.on_nonfinite) with the last good state intact.
    r.opt = opt_->step(std::isfinite(r.metrics["loss"].sum));
  }
  ++step_;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
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

std::vector<float> Trainer::param(const std::string& path) const {
  const ValueId v = prog_.model.graph.input_by_name(path);
  if (v == kNoValue || !prog_.model.graph.param_of(v)) throw std::invalid_argument("no parameter '" + path + "'");
  std::vector<float> out(static_cast<size_t>(prog_.model.graph.value(v).shape.numel()));
  exec_->download(v, out.data());
  return out;
}

std::vector<float> Trainer::grad(const std::string& path) const {
  const ValueId v = prog_.model.graph.input_by_name(path);
  if (v == kNoValue || !prog_.model.graph.param_of(v)) throw std::invalid_argument("no parameter '" + path + "'");
  std::vector<float> out(static_cast<size_t>(prog_.model.graph.value(v).shape.numel()));
  exec_->download(prog_.model.graph.grad_of(v), out.data());
  return out;
}

void Trainer::set_param(const std::string& path, const std::vector<float>& values) {
  const ValueId v = prog_.model.graph.input_by_name(path);
  if (v == kNoValue || !prog_.model.graph.param_of(v)) throw std::invalid_argument("no parameter '" + path + "'");
  if (static_cast<int64_t>(values.size()) != prog_.model.graph.value(v).shape.numel())
    throw std::invalid_argument("wrong element count for parameter '" + path + "'");
  exec_->upload(v, values.data());
}

}  // namespace loom
