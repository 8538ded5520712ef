#include "train/trainer.h"

#include <stdexcept>

#include "core/error.h"
#include "graph/autodiff.h"
#include "nn/mlp_classifier.h"
#include "train/init.h"

namespace loom {

nn::ModelGraph build_model(const Config& c, int64_t minibatch, bool train) {
  if (c.model.kind == "mlp_classifier") {
    nn::MlpClassifierSpec s;
    s.dtype = c.model.dtype;
    s.num_inputs = c.data.num_inputs;
    s.hidden_size = c.model.hidden_size;
    s.num_classes = c.model.num_classes;
    s.dropout_rate = static_cast<float>(c.model.dropout_rate);
    s.layer_norm_eps = static_cast<float>(c.model.layer_norm_eps);
    return nn::build_mlp_classifier(s, minibatch, train);
  }
  throw UserError("model.kind", "unknown model kind '" + c.model.kind + "'", "use mlp_classifier");
}

Trainer::Trainer(const Config& c, Backend& be) : cfg_(c), be_(be) {
  const int64_t mb = c.data.batch_size / c.optimizer.num_minibatches;
  model_ = build_model(c, mb, /*train=*/true);
  Graph& g = model_.graph;
  dloss_ = g.add_input("loss_seed", Shape{}, DType::f32);
  build_backward(g, model_.loss_sum, dloss_);
  MemoryPlan plan = plan_memory(g, default_schedule(g));
  if (Status s = Executor::create(be, g, std::move(plan), &exec_); !s) throw std::runtime_error(s.message());

  std::vector<float> host;
  for (const Param& p : g.params()) {
    init_param(g, p, c.seed, host);
    exec_->upload(p.value, host.data());
    OptimTensor t;
    t.param = static_cast<float*>(exec_->ptr(p.value));
    t.grad = static_cast<float*>(exec_->ptr(p.grad));
    t.n = g.value(p.value).shape.numel();
    for (float** m : {&t.mu, &t.nu}) {
      void* buf = be.allocate(static_cast<size_t>(t.n) * sizeof(float));
      if (!buf) throw std::runtime_error("could not allocate optimizer state for '" + g.value(p.value).name + "'");
      be.fill_zero(buf, static_cast<size_t>(t.n) * sizeof(float));
      opt_state_.push_back(buf);
      *m = static_cast<float*>(buf);
    }
    opt_.push_back(t);
  }
}

Trainer::~Trainer() {
  for (void* m : opt_state_) be_.deallocate(m);
}

Metrics Trainer::step(const Batch& batch) {
  const Graph& g = model_.graph;
  const int64_t nmb = cfg_.optimizer.num_minibatches;
  LOOM_ASSERT(batch.batch_size == cfg_.data.batch_size, "batch size differs from the configured one");
  for (const Param& p : g.params()) exec_->zero(p.grad);
  // d(loss_sum)/d(loss) for loss = mean over the whole batch: each minibatch's mean, averaged
  // over minibatches, is Σ/batch_size.
  const float seed = 1.0f / static_cast<float>(batch.batch_size);
  exec_->upload(dloss_, &seed);
  const size_t in_bytes = static_cast<size_t>(g.value(model_.inputs).bytes());
  const size_t lab_count = static_cast<size_t>(g.value(model_.labels).shape.numel());
  Metrics m;
  for (int64_t i = 0; i < nmb; ++i) {
    exec_->upload(model_.inputs, batch.inputs.data() + static_cast<size_t>(i) * in_bytes);
    exec_->upload(model_.labels, batch.labels.data() + static_cast<size_t>(i) * lab_count);
    exec_->run(RunCtx{cfg_.seed, static_cast<uint64_t>(step_), static_cast<uint32_t>(i)});
    float loss = 0;
    int32_t correct = 0;
    exec_->download(model_.loss_sum, &loss);
    exec_->download(model_.correct, &correct);
    m["loss"].sum += loss;
    m["loss"].count += model_.examples;
    m["accuracy"].sum += correct;
    m["accuracy"].count += model_.examples;
  }
  AdamHyper h;
  h.lr = static_cast<float>(cfg_.optimizer.learning_rate);
  h.b1 = static_cast<float>(cfg_.optimizer.b1);
  h.b2 = static_cast<float>(cfg_.optimizer.b2);
  h.eps = static_cast<float>(cfg_.optimizer.eps);
  h.count = step_ + 1;
  be_.adam_update(opt_, h);
  ++step_;
  return m;
}

std::vector<float> Trainer::param(const std::string& path) const {
  const ValueId v = model_.graph.input_by_name(path);
  LOOM_ASSERT(v != kNoValue, "no parameter " + path);
  std::vector<float> out(static_cast<size_t>(model_.graph.value(v).shape.numel()));
  exec_->download(v, out.data());
  return out;
}

std::vector<float> Trainer::grad(const std::string& path) const {
  const ValueId v = model_.graph.input_by_name(path);
  LOOM_ASSERT(v != kNoValue, "no parameter " + path);
  const ValueId gid = model_.graph.grad_of(v);
  std::vector<float> out(static_cast<size_t>(model_.graph.value(gid).shape.numel()));
  exec_->download(gid, out.data());
  return out;
}

}  // namespace loom
