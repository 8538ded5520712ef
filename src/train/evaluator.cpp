#include "train/evaluator.h"

#include <stdexcept>

#include "nn/models.h"

namespace loom {

Evaluator::Evaluator(const Trainer& t, Backend& be) : cfg_(t.config()) {
  const int64_t mb = cfg_.data.batch_size / cfg_.optimizer.num_minibatches;
  model_ = nn::build_model(cfg_.model, model_input(cfg_, mb), /*train=*/false);
  Executor::External params;
  const Graph& tg = t.model().graph;
  for (const Param& p : tg.params()) params[tg.value(p.value).name] = t.executor().ptr(p.value);
  MemoryPlan plan = plan_program(be, model_.graph, default_schedule(model_.graph));
  if (Status s = Executor::create(be, model_.graph, std::move(plan), &exec_, &params); !s)
    throw std::runtime_error(s.message());
  for (const auto& [v, bytes] : model_.constants) exec_->upload(v, bytes.data());
}

Evaluator::~Evaluator() = default;

double Evaluator::run(DataSource& data, int64_t iters) {
  double sum = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < iters; ++i) {
    const Batch b = data.val_batch();
    exec_->upload(model_.inputs, b.inputs.data());
    exec_->upload(model_.labels, b.labels.data());
    exec_->run(RunCtx{.seed = cfg_.seed, .step = 0, .minibatch = 0});
    float loss = 0;
    exec_->download(model_.loss_sum, &loss);
    sum += loss;
    count += model_.examples;
  }
  return count ? sum / static_cast<double>(count) : 0.0;
}

}  // namespace loom
