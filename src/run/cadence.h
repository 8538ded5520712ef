// When a periodic piece of a run (an evaluation, a checkpoint) is due: every `every` steps and
// always at the last step, train.steps (every <= 0: at the last step only).
#pragma once
#include <cstdint>

namespace loom {

struct Cadence {
  int64_t every = 0, steps = 0;

  bool due(int64_t step) const { return (every > 0 && step % every == 0) || step == steps; }
  // How many of the steps in (step, steps] are due: the ETA's count of what is still to come.
  int64_t left_after(int64_t step) const {
    if (step >= steps) return 0;
    if (every <= 0) return 1;
    return steps / every - step / every + (steps % every != 0 ? 1 : 0);
  }
};

}  // namespace loom
