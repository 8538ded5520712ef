// Validation loss: the model's forward program in eval mode (no dropout), sharing the trainer's
// parameter buffers (no copy), run over `eval_iters` validation batches. Under data parallelism
// every rank walks the same validation batches and evaluates its slice of each (the trainer's
// minibatch size), and the loss sums are summed over ranks: the examples are those of one process,
// the value equal to its value up to float32 rounding of the partial sums.
#pragma once
#include <memory>

#include "data/data.h"
#include "train/trainer.h"

namespace loom {

class Evaluator {
 public:
  Evaluator(const Trainer& t, Backend& be);
  ~Evaluator();
  // Mean loss per token over `iters` batches from `data` (validation split).
  double run(DataSource& data, int64_t iters);

 private:
  const Config& cfg_;
  dist::Comm& comm_;
  nn::ModelGraph model_;
  std::unique_ptr<Executor> exec_;
};

}  // namespace loom
