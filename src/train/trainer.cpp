#include "train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "core/error.h"
#include "graph/passes/autodiff.h"
#include "graph/passes/remat.h"
#include "nn/init.h"
#include "nn/mlp_classifier.h"
#include "nn/transformer.h"

namespace loom {

namespace {
// model.remat: "", "none", or a comma-separated subset of MLP, Attn, Block.
void parse_remat(const std::string& s, nn::TransformerSpec& t) {
  if (s.empty() || s == "none") return;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(start, end - start);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (item == "MLP")
      t.remat_mlp = true;
    else if (item == "Attn")
      t.remat_attn = true;
    else if (item == "Block")
      t.remat_block = true;
    else
      throw UserError("model.remat", "unknown remat region '" + item + "'",
                      "use none, or a comma-separated subset of MLP, Attn, Block");
    start = end + 1;
  }
}
}  // namespace

nn::ModelGraph build_model(const Config& c, int64_t minibatch, bool train) {
  if (c.model.kind == "mlp_classifier") {
    nn::MlpClassifierSpec s;
    s.dtype = c.model.dtype;
    s.num_inputs = c.data.num_inputs;
    s.hidden_size = c.model.hidden_size;
    s.num_classes = c.model.num_classes;
    s.dropout_rate = static_cast<float>(c.model.dropout_rate);
    s.layer_norm_eps = static_cast<float>(c.model.layer_norm_eps);
    if (!c.model.remat.empty() && c.model.remat != "none") {
      if (c.model.remat != "MLP")
        throw UserError("model.remat", "the mlp_classifier has one remat region, 'MLP' (its hidden block)",
                        "use model.remat=MLP or none");
      s.remat = true;
    }
    return nn::build_mlp_classifier(s, minibatch, train);
  }
  if (c.model.kind == "transformer")
    return nn::build_transformer(transformer_spec(c), minibatch, c.data.seq_len, train);
  throw UserError("model.kind", "unknown model kind '" + c.model.kind + "'", "use mlp_classifier or transformer");
}

nn::TransformerSpec transformer_spec(const Config& c) {
  nn::TransformerSpec s;
  s.dtype = c.model.dtype;
  s.softmax_dtype = c.model.softmax_dtype;
  s.hidden_size = c.model.hidden_size;
  s.num_layers = c.model.num_layers;
  s.head_dim = c.model.head_dim;
  s.mlp_expansion = c.model.mlp_expansion;
  s.vocab_size = c.model.vocab_size;
  s.num_outputs = c.model.num_outputs;
  s.max_seq_len = c.model.max_seq_len;
  s.dropout_rate = static_cast<float>(c.model.dropout_rate);
  s.layer_norm_eps = static_cast<float>(c.model.layer_norm_eps);
  s.causal_mask = c.model.causal_mask;
  s.attn_first = c.model.block_order == "attn_first";
  s.use_bias = c.model.use_bias;
  s.tie_embeddings = c.model.tie_embeddings;
  s.gpt2_init = c.model.init == "gpt2";
  s.embed_dropout = c.model.embed_dropout;
  parse_remat(c.model.remat, s);
  return s;
}

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
  p.model = build_model(c, minibatch_size(c, ranks), /*train=*/true);
  Graph& g = p.model.graph;
  p.dloss = g.add_input("loss_seed", Shape{}, DType::f32);
  p.num_forward = build_backward(g, p.model.loss_sum, p.dloss);
  RematPolicy policy{c.model.remat_policy, {}};
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

Trainer::Trainer(const Config& c, Backend& be, PlanOptions plan_options, dist::Comm* comm)
    : cfg_(c),
      be_(be),
      prog_(build_train_program(c, comm ? comm->size() : 1)),
      comm_(comm ? *comm : dist::single_process()) {
  const Graph& g = prog_.model.graph;
  MemoryPlan plan = plan_memory(g, prog_.schedule, plan_options);
  if (Status s = Executor::create(be, g, std::move(plan), &exec_); !s) throw std::runtime_error(s.message());
  for (const auto& [v, bytes] : prog_.model.constants) exec_->upload(v, bytes.data());
  std::vector<float> host;
  for (const Param& p : g.params()) {
    init_param(g, p, c.seed, host);
    exec_->upload(p.value, host.data());
  }
  opt_ = std::make_unique<Optimizer>(c.optimizer, c.model.dtype, be, g, *exec_);
  // Gradients by their last writer's position in the schedule (0: never written), so that the
  // buckets become final one after another during the backward.
  std::vector<size_t> written(g.values().size(), 0);
  for (size_t s = 0; s < prog_.schedule.size(); ++s) {
    const Node& n = g.node(prog_.schedule[s]);
    if ((op_info(n.op).flags & kOpWritesInput0) && g.value(n.in[0]).kind == ValueKind::grad) written[n.in[0]] = s + 1;
  }
  std::vector<size_t> order(g.params().size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return written[g.params()[a].grad] < written[g.params()[b].grad]; });
  std::vector<dist::FloatSpan> grads;
  for (size_t i : order) grads.push_back({opt_->tensors()[i].grad, opt_->tensors()[i].n});
  reducer_ = std::make_unique<dist::BucketReducer>(comm_, std::move(grads),
                                                   c.train.bucket_kib * 1024 / static_cast<int64_t>(sizeof(float)));
  for (size_t b = 0; b < reducer_->num_buckets(); ++b)
    bucket_ready_.push_back(written[g.params()[order[reducer_->last(b) - 1]].grad]);
  bucket_span_.assign(reducer_->num_buckets(), -1);
  reducer_->set_on_complete([this](size_t b) {
    if (recorder_) recorder_->end_span(bucket_span_[b]);
  });
}

Trainer::~Trainer() = default;

StepReport Trainer::step(const Batch& batch) {
  const auto t0 = std::chrono::steady_clock::now();
  ScopedSpan step_span(recorder_, SpanKind::train_step, step_ + 1);
  const Graph& g = prog_.model.graph;
  const int64_t nmb = cfg_.optimizer.num_minibatches;
  const int64_t ranks = comm_.size();
  const auto first = static_cast<uint32_t>(comm_.rank() * nmb);  // this rank's first global minibatch
  LOOM_ASSERT(batch.batch_size == cfg_.data.batch_size, "batch size differs from the configured one");
  for (ValueId grad : prog_.zero_grads) exec_->zero(grad);  // the others are assigned in minibatch `first`
  // Seed of d(loss_sum): the loss is the mean over every example (token) of the global batch —
  // each minibatch's mean, averaged over all minibatches of all ranks, is
  // Σ / (examples per minibatch × minibatches × ranks) — times the fp16 loss scale.
  const auto seed = static_cast<float>(opt_->loss_scale() / static_cast<double>(prog_.model.examples * nmb * ranks));
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
    const RunCtx rc{.seed = cfg_.seed, .step = static_cast<uint64_t>(step_), .minibatch = mb, .first_minibatch = first};
    if (i + 1 < nmb)
      exec_->run(rc);
    else
      run_last_minibatch(rc);
    exec_->download(prog_.model.loss_sum, &results[mb].loss);
    exec_->download(prog_.model.correct, &results[mb].correct);
  }
  reducer_->finish();
  // Every rank's results in global minibatch order, summed as one process sums its minibatches.
  comm_.all_gather_bytes(&results[first], static_cast<size_t>(nmb) * sizeof(MinibatchResult), results.data());
  StepReport r;
  for (const MinibatchResult& m : results) {
    r.metrics["loss"].sum += m.loss;
    r.metrics["loss"].count += prog_.model.examples;
    r.metrics["accuracy"].sum += m.correct;
    r.metrics["accuracy"].count += prog_.model.examples;
  }
  {
    ScopedSpan optimizer_span(recorder_, SpanKind::optimizer, step_ + 1);
    r.opt = opt_->step();
  }
  ++step_;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// The last minibatch with the gradient buckets started as they become final, and advanced
// between kernels while the rest of the backward runs.
void Trainer::run_last_minibatch(const RunCtx& rc) {
  const size_t nodes = prog_.schedule.size();
  if (reducer_->num_buckets() == 0) return exec_->run(rc);
  size_t s = 0;
  for (size_t b = 0; b <= reducer_->num_buckets(); ++b) {
    const size_t until = b < reducer_->num_buckets() ? bucket_ready_[b] : nodes;
    for (; s < until; ++s) {
      exec_->run_steps(rc, s, s + 1);
      reducer_->progress();
    }
    if (b == reducer_->num_buckets()) break;
    bucket_span_[b] = recorder_ ? recorder_->begin_span(SpanKind::communication, static_cast<int64_t>(b)) : -1;
    reducer_->start(b);
  }
}

void Trainer::restore_progress(int64_t step, int64_t opt_count, double loss_scale, int64_t scaler_tracker,
                               int64_t scaler_skipped) {
  step_ = step;
  opt_->set_count(opt_count);
  LossScaler& sc = opt_->scaler();
  if (sc.enabled) sc.scale = loss_scale;
  sc.tracker = scaler_tracker;
  sc.skipped = scaler_skipped;
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
