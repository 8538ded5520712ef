#include "train/evaluator.h"

#include <stdexcept>
#include <vector>

namespace loom {

Evaluator::Evaluator(const Trainer& t, Backend& be) : cfg_(t.config()), comm_(t.comm()) {
  model_ = build_model(cfg_, minibatch_size(cfg_, comm_.size()), /*train=*/false);
  Executor::External params;
  const Graph& tg = t.model().graph;
  for (const Param& p : tg.params()) params[tg.value(p.value).name] = t.executor().ptr(p.value);
  MemoryPlan plan = plan_memory(model_.graph, default_schedule(model_.graph));
  if (Status s = Executor::create(be, model_.graph, std::move(plan), &exec_, &params); !s)
    throw std::runtime_error(s.message());
  for (const auto& [v, bytes] : model_.constants) exec_->upload(v, bytes.data());
}

Evaluator::~Evaluator() = default;

double Evaluator::run(DataSource& data, int64_t iters) {
  double sum = 0;
  int64_t count = 0;
  const Graph& g = model_.graph;
  const size_t in_bytes = static_cast<size_t>(g.value(model_.inputs).bytes());
  const size_t lab_count = static_cast<size_t>(g.value(model_.labels).shape.numel());
  const auto rank = static_cast<size_t>(comm_.rank());
  std::vector<float> losses(static_cast<size_t>(comm_.size()));
  for (int64_t i = 0; i < iters; ++i) {
    const Batch b = data.val_batch();
    exec_->upload(model_.inputs, b.inputs.data() + rank * in_bytes);
    exec_->upload(model_.labels, b.labels.data() + rank * lab_count);
    exec_->run(RunCtx{cfg_.seed, 0, 0});
    exec_->download(model_.loss_sum, &losses[rank]);
    comm_.all_gather_bytes(&losses[rank], sizeof(float), losses.data());
    for (float loss : losses) sum += loss;
    count += model_.examples * comm_.size();
  }
  return count ? sum / static_cast<double>(count) : 0.0;
}

}  // namespace loom
