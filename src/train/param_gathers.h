// ZeRO-3's all-gathers (optimizer.shard = params, train/trainer.h): a program planned with
// PlanOptions::gather_params reads each parameter only from its gathered buffers, and this fills
// them from the ranks' chunks. A buffer's gather starts before the buffer's first step, is polled
// between kernels and waited for right before the buffer's first use. The training program and the
// evaluation program (train/evaluator.h) both run their schedules through one, each over the same
// chunks: no rank ever holds a whole parameter outside a gathered buffer.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "dist/comm.h"
#include "runtime/executor.h"

namespace loom {

class ParamGathers {
 public:
  ParamGathers() = default;  // a program without gathered buffers
  // The gathers into `exec`'s gathered buffers (none unless its plan has PlanOptions::gather_params).
  // chunk(i): this rank's chunk (dist::chunk) of parameter i, Graph::params() order, which must stay
  // put while `exec` runs. `prefetch` (optimizer.gather_ahead > 0, which plans the first use's
  // buffers from step 0): those buffers' gathers are early, which start_early() starts ahead of a run.
  ParamGathers(dist::Comm& comm, const Executor& exec, const std::function<const float*(size_t)>& chunk, bool prefetch);
  ParamGathers(ParamGathers&&) = default;
  ParamGathers& operator=(ParamGathers&&) = default;
  ~ParamGathers();

  bool empty() const { return gathers_.empty(); }
  bool idle() const { return in_flight_.empty(); }  // no gather in flight
  // Before schedule step s: starts the gathers of the buffers that begin there (an early one
  // already started by start_early() is not started again) and waits for those first used there;
  // the others in flight then count as overlapping step s's kernel.
  void before_step(size_t s);
  // Completes the gathers in flight that have finished, without waiting. `overlapped`: some work
  // (a part of the optimizer's update) ran while they were in flight.
  void poll(bool overlapped = false);
  // Runs `exec`'s whole schedule with the gathers: before_step, the kernel, poll, step by step.
  void run(Executor& exec, const RunCtx& rc);
  // Starts the early gathers unless they are in flight or done for the next run.
  void start_early();
  // Waits for every gather in flight. The next run starts all of its gathers itself: call it before
  // the chunks change or another program overwrites the buffers (the arena shared by an evaluation).
  void settle();
  // The parameters (Graph::params() indices) of the early gathers.
  const std::vector<size_t>& early_params() const { return early_params_; }
  // Gathers started so far, and how many of the completed ones overlapped a kernel or the update.
  int64_t started() const { return started_; }
  int64_t overlapped() const { return overlapped_; }

 private:
  struct Gather {
    const float* mine;
    int64_t n;
    float* out;
    size_t use;
    bool early;
    std::unique_ptr<dist::Comm::Pending> pending;  // while in flight
    bool overlapped = false;                       // a kernel or a part of the update ran while it was in flight
  };
  dist::Comm* comm_ = nullptr;
  std::vector<Gather> gathers_;
  std::vector<std::vector<size_t>> start_at_;  // per schedule step: the gathers started before it
  std::vector<size_t> in_flight_;              // in the order they started
  std::vector<size_t> early_, early_params_;
  bool early_started_ = false;
  int64_t started_ = 0, overlapped_ = 0;
  void start(size_t k);
  // Waits for the gathers in flight first used at step `use` (the others are left alone: a kernel
  // runs before they are tested); without a step, completes those that have finished.
  void advance(std::optional<size_t> use);
};

}  // namespace loom
