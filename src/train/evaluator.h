// Evaluation: the model's forward program in eval mode (no dropout) over batches of one minibatch,
// summing the loss and the correct predictions. During training it shares the trainer's parameter
// buffers (no copy) and, when its arena fits in the trainer's, that arena too: it runs between
// training steps, when nothing in the trainer's arena is live. `loom eval` gives it buffers of its
// own and loads a checkpoint into them.
// Under data parallelism (the trainer's dist::Comm) every rank walks the same batches and runs its
// slice of each minibatch (the trainer's minibatch size), and the sums are gathered and added in
// rank order: the examples are those of one process, the loss equal to its value up to float32
// rounding of the partial sums. Under ZeRO-3 (optimizer.shard = params) it reads the parameters
// as the training program does: each layer's gathered from the trainer's chunks into the arena
// right before its use (train/param_gathers.h), so no rank holds them whole.
#pragma once
#include <memory>

#include "data/data.h"
#include "train/metrics.h"
#include "train/param_gathers.h"
#include "train/trainer.h"

namespace loom {

class Evaluator {
 public:
  // Shares `t`'s parameters, or their chunks (and its arena when large enough); `t` must outlive
  // it, and its steps must not run while evaluate calls do (each first settles `t`'s gathers in
  // flight, Trainer::settle_gathers).
  Evaluator(Trainer& t, Backend& be);
  // Owns its parameters (uninitialised: load them through executor(), e.g. io/param_io.h); one process.
  Evaluator(const Config& c, Backend& be);
  ~Evaluator();
  // The device bytes an Evaluator sharing a trainer's parameters adds beside it, planned for
  // c.device and c.threads with `ranks` ranks: its inputs, and its arena unless that fits in the
  // trainer's (`trainer_arena_bytes`), which holds its gathered parameters under ZeRO-3. `loom
  // memory` counts them.
  static int64_t planned_bytes(const Config& c, int ranks, int64_t trainer_arena_bytes);
  // Whether `loom train` with c evaluates as it trains, as far as a plan can tell: evaluation is on
  // (train.eval_interval > 0) and the data can have a validation split (token data; a split too
  // short for one window, which only the data shows, has none). `loom memory` counts planned_bytes
  // when this holds; `loom train` evaluates when it holds and its data has the split, and then tells
  // its Trainer, whose fit check counts them too.
  static bool during_training(const Config& c);
  // Mean loss per target (per target token for a language model: the trainer's normalisation,
  // train/trainer.h) over the validation batches of one evaluation (data.val_batches(iters): one
  // pass over chat data's rows, each once, whatever iters, optimizer.num_minibatches and the
  // ranks; `iters` batches of plain token data).
  double run(DataSource& data, int64_t iters);
  // "loss" and "accuracy" (sum, count; the counts are target tokens) over the validation batches
  // of one evaluation, as run, or over the first `iters` training batches
  // (data.train_batch(0..iters-1), each run minibatch by minibatch).
  Metrics validation(DataSource& data, int64_t iters);
  Metrics training(const DataSource& data, int64_t iters);
  Executor& executor() { return *exec_; }

 private:
  void build(Backend& be, const Executor::External* params, const Executor* arena_of);
  // Before an evaluation: no gather of the trainer's is in flight into the arena it may share.
  void settle_trainer();
  // Rows of one minibatch summed over the ranks.
  int64_t rows() const;
  // Adds the loss and correct count of the batch's rows [first, first + rows()): rank r runs its
  // slice of them, the ranks' sums are added in rank order.
  void run_rows(const Batch& b, int64_t first, Metrics& into);

  const Config& cfg_;
  dist::Comm& comm_;
  nn::ModelGraph model_;
  std::unique_ptr<Executor> exec_;
  Trainer* trainer_ = nullptr;  // the trainer it evaluates beside, if any
  ParamGathers gathers_;        // ZeRO-3: the parameters' gathers from trainer_'s chunks
};

}  // namespace loom
