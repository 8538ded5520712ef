// The training step (docs/ARCHITECTURE.md, "Train step"):
//   zero grads; for each minibatch: upload its slice, set the loss seed 1/batch_size, run the
//   forward+backward program (gradients accumulate in place), read loss and accuracy;
//   then one fused optimizer pass updates params and moments in place.
// Params, grads and optimizer state are persistent fp32 buffers on the backend: never copied,
// never duplicated (the tutorial's buffer donation).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "nn/model.h"
#include "runtime/executor.h"
#include "train/config.h"
#include "train/data.h"
#include "train/metrics.h"

namespace loom {

// Builds the configured model for one minibatch (train: dropout on).
nn::ModelGraph build_model(const Config& c, int64_t minibatch, bool train);

class Trainer {
 public:
  // Builds, differentiates and plans the program and initialises the train state.
  // Throws UserError for configuration problems; a Status failure (allocation) becomes a
  // std::runtime_error with the message.
  Trainer(const Config& c, Backend& be);
  ~Trainer();

  // One optimizer step on `batch`; returns the step's metrics.
  Metrics step(const Batch& batch);

  int64_t steps_done() const { return step_; }
  const nn::ModelGraph& model() const { return model_; }
  const MemoryPlan& plan() const { return exec_->plan(); }
  Executor& executor() { return *exec_; }
  // Host copies of parameters (by path) and their gradients from the last step.
  std::vector<float> param(const std::string& path) const;
  std::vector<float> grad(const std::string& path) const;

 private:
  Config cfg_;
  Backend& be_;
  nn::ModelGraph model_;
  ValueId dloss_ = kNoValue;
  std::unique_ptr<Executor> exec_;
  std::vector<OptimTensor> opt_;
  std::vector<void*> opt_state_;
  int64_t step_ = 0;
};

}  // namespace loom
