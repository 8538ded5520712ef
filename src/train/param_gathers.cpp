#include "train/param_gathers.h"

#include <algorithm>
#include <climits>

#include "core/error.h"

namespace loom {

ParamGathers::ParamGathers(dist::Comm& comm, const Executor& exec, const std::function<const float*(size_t)>& chunk,
                           bool prefetch)
    : comm_(&comm) {
  const Graph& g = exec.graph();
  const MemoryPlan& plan = exec.plan();
  start_at_.resize(plan.schedule.size());
  std::vector<size_t> param_of(g.values().size());
  for (size_t i = 0; i < g.params().size(); ++i) param_of[static_cast<size_t>(g.params()[i].value)] = i;
  int32_t first_use = INT32_MAX;
  for (const BufferInfo& b : plan.buffers)
    if (b.gathered) first_use = std::min(first_use, b.first_use);
  for (const BufferInfo& b : plan.buffers)
    if (b.gathered) {
      const size_t i = param_of[static_cast<size_t>(b.value)];
      const bool early = prefetch && b.first_use == first_use;
      if (early) {
        LOOM_ASSERT(b.first == 0, "with a prefetch the plan holds the first use's buffers from step 0");
        early_.push_back(gathers_.size());
        early_params_.push_back(i);
      }
      start_at_[static_cast<size_t>(b.first)].push_back(gathers_.size());
      gathers_.push_back(Gather{.mine = chunk(i),
                                .n = g.value(b.value).shape.numel(),
                                .out = static_cast<float*>(exec.buffer_ptr(b)),
                                .use = static_cast<size_t>(b.first_use),
                                .early = early,
                                .pending = nullptr});
    }
}

ParamGathers::~ParamGathers() {
  try {
    settle();      // every rank started them: they complete
  } catch (...) {  // NOLINT(bugprone-empty-catch): a failed rank ends the job anyway
  }
}

void ParamGathers::before_step(size_t s) {
  if (s < start_at_.size())
    for (size_t k : start_at_[s])
      if (!(early_started_ && gathers_[k].early)) start(k);
  if (s == 0) early_started_ = false;  // the early gathers' buffers (live from step 0) are this run's
  advance(s);
  for (size_t k : in_flight_) gathers_[k].overlapped = true;  // in flight while this kernel runs
}

void ParamGathers::poll(bool overlapped) {
  if (overlapped)
    for (size_t k : in_flight_) gathers_[k].overlapped = true;
  advance(std::nullopt);
}

void ParamGathers::run(Executor& exec, const RunCtx& rc) {
  for (size_t s = 0; s < exec.plan().schedule.size(); ++s) {
    before_step(s);
    exec.run_steps(rc, s, s + 1);
    poll();
  }
  LOOM_ASSERT(idle(), "a gathered buffer that no step reads");
}

void ParamGathers::start_early() {
  if (early_started_) return;
  for (size_t k : early_) start(k);
  early_started_ = !early_.empty();
}

void ParamGathers::settle() {
  for (size_t k : in_flight_)
    while (!gathers_[k].pending->test()) {
    }
  advance(std::nullopt);
  early_started_ = false;
}

void ParamGathers::start(size_t k) {
  Gather& x = gathers_[k];
  x.pending = comm_->start_all_gather(x.mine, x.n, x.out);
  x.overlapped = false;
  in_flight_.push_back(k);
  ++started_;
}

void ParamGathers::advance(std::optional<size_t> use) {
  size_t kept = 0;
  for (size_t k : in_flight_) {
    Gather& x = gathers_[k];
    if (use && x.use == *use)
      while (!x.pending->test()) {
      }
    else if (use || !x.pending->test()) {
      in_flight_[kept++] = k;
      continue;
    }
    x.pending.reset();
    overlapped_ += x.overlapped;
  }
  in_flight_.resize(kept);
}

}  // namespace loom
