// The closing sample of `loom train` (train.sample_tokens > 0): a few tokens from the run's last
// checkpoint with nanoGPT's sample.py defaults, printed after the summary. The run is done and
// saved by then, so a sample that cannot start is a line of output, not a failure.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

namespace loom {

void closing_sample(const std::string& run_dir, int64_t tokens, uint64_t seed, FILE* out);

}  // namespace loom
