#include "train/evaluator.h"

#include <algorithm>
#include <climits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "nn/models.h"

namespace loom {

namespace {
// The forward program in eval mode over one rank's minibatch.
nn::ModelGraph eval_model(const Config& c, int ranks) {
  return nn::build_model(c.model, model_input(c, minibatch_size(c, ranks)), /*train=*/false);
}
// Under ZeRO-3 (optimizer.shard = params on more than one rank) the parameters are planned in the
// arena, gathered before their uses with the training program's prefetch (Trainer's plan).
PlanOptions eval_plan_options(const Config& c, int ranks) {
  PlanOptions o;
  o.gather_params = ranks > 1 && c.optimizer.shard == OptimizerShard::params;
  o.gather_ahead = static_cast<int32_t>(std::min<int64_t>(c.optimizer.gather_ahead, INT32_MAX));
  return o;
}
}  // namespace

Evaluator::Evaluator(Trainer& t, Backend& be) : cfg_(t.config()), comm_(t.comm()), trainer_(&t) {
  Executor::External params;
  const Graph& tg = t.model().graph;
  std::map<std::string, size_t> trainer_index;
  for (size_t i = 0; i < tg.params().size(); ++i) {
    const std::string& name = tg.value(tg.params()[i].value).name;
    params[name] = t.executor().ptr(tg.params()[i].value);  // nullptr when gathered
    trainer_index[name] = i;
  }
  build(be, &params, &t.executor());
  if (t.params_sharded()) {
    const Graph& g = model_.graph;
    gathers_ = ParamGathers(
        comm_, *exec_, [&](size_t i) { return t.param_chunk(trainer_index.at(g.value(g.params()[i].value).name)); },
        /*prefetch=*/false);
  }
}

Evaluator::Evaluator(const Config& c, Backend& be) : cfg_(c), comm_(dist::single_process()) {
  build(be, nullptr, nullptr);
}

void Evaluator::build(Backend& be, const Executor::External* params, const Executor* arena_of) {
  model_ = eval_model(cfg_, comm_.size());
  MemoryPlan plan =
      plan_program(be, model_.graph, default_schedule(model_.graph), eval_plan_options(cfg_, comm_.size()));
  Executor::External ext = params ? *params : Executor::External{};
  Executor::bind_no_gradients(model_.graph, ext);
  if (Status s = Executor::create(be, model_.graph, std::move(plan), &exec_, &ext, arena_of); !s)
    throw std::runtime_error(s.message());
  for (const auto& [v, bytes] : model_.constants) exec_->upload(v, bytes.data());
}

Evaluator::~Evaluator() = default;

int64_t Evaluator::planned_bytes(const Config& c, int ranks, int64_t trainer_arena_bytes) {
  const std::unique_ptr<Backend> be = make_backend(c.device);
  const nn::ModelGraph m = eval_model(c, ranks);
  const MemoryPlan p = plan_program(*be, m.graph, default_schedule(m.graph), eval_plan_options(c, ranks),
                                    resolve_threads(static_cast<int>(c.threads)));
  return (p.arena_bytes > trainer_arena_bytes ? p.arena_bytes : 0) + p.input_bytes;
}

bool Evaluator::during_training(const Config& c) {
  return c.train.eval_interval > 0 && c.data.kind == DataKind::tokens;
}

int64_t Evaluator::rows() const { return cfg_.data.batch_size / cfg_.optimizer.num_minibatches; }

void Evaluator::run_rows(const Batch& b, int64_t first, Metrics& into) {
  const size_t in_row = b.inputs.size() / static_cast<size_t>(b.batch_size);
  const size_t label_row = b.labels.size() / static_cast<size_t>(b.batch_size);
  const auto row = static_cast<size_t>(first + comm_.rank() * minibatch_size(cfg_, comm_.size()));
  exec_->upload(model_.inputs, b.inputs.data() + row * in_row);
  exec_->upload(model_.labels, b.labels.data() + row * label_row);
  if (model_.positions != kNoValue) exec_->upload(model_.positions, b.positions.data() + row * label_row);
  const RunCtx rc{.seed = cfg_.seed, .step = 0, .minibatch = 0};
  if (gathers_.empty())
    exec_->run(rc);
  else
    gathers_.run(*exec_, rc);
  struct Sums {
    float loss = 0;
    int32_t correct = 0;
  };
  std::vector<Sums> sums(static_cast<size_t>(comm_.size()));
  Sums& mine = sums[static_cast<size_t>(comm_.rank())];
  exec_->download(model_.loss_sum, &mine.loss);
  exec_->download(model_.correct, &mine.correct);
  comm_.all_gather_bytes(&mine, sizeof mine, sums.data());
  // Each rank's count of targets in its slice, read from the batch every rank holds.
  const int64_t slice = minibatch_size(cfg_, comm_.size());
  for (size_t q = 0; q < sums.size(); ++q) {
    const int64_t targets = b.targets(first + static_cast<int64_t>(q) * slice, slice);
    into += {.accuracy = {.sum = static_cast<double>(sums[q].correct), .count = targets},
             .loss = {.sum = sums[q].loss, .count = targets}};
  }
}

void Evaluator::settle_trainer() {
  if (trainer_) trainer_->settle_gathers();
}

Metrics Evaluator::validation(DataSource& data, int64_t iters) {
  settle_trainer();
  Metrics m;
  const int64_t batches = data.val_batches(iters);
  for (int64_t i = 0; i < batches; ++i) run_rows(data.val_batch(), 0, m);
  return m;
}

Metrics Evaluator::training(const DataSource& data, int64_t iters) {
  settle_trainer();
  Metrics m;
  for (int64_t i = 0; i < iters; ++i) {
    const Batch b = data.train_batch(i);
    for (int64_t first = 0; first < b.batch_size; first += rows()) run_rows(b, first, m);
  }
  return m;
}

double Evaluator::run(DataSource& data, int64_t iters) { return validation(data, iters).loss.mean(); }

}  // namespace loom
