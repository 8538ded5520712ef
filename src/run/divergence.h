// How a diverged run ends (the loop found a non-finite loss or gradient norm, or a checkpoint
// about to be written held a NaN): one error, raised by every rank at the same step since every
// rank sees the same losses and norms, saying what is kept and how to go on.
#pragma once
#include <cstdint>
#include <string>

#include "dist/comm.h"

namespace loom {

// `why`: what was not finite and where. `run_dir` "" = the run has no directory (`source`, its
// configuration, names it); `saved_step` < 0 = no checkpoint was written this session or before.
dist::AgreedError diverged_error(const std::string& why, const std::string& run_dir, const std::string& source,
                                 int64_t saved_step);

}  // namespace loom
