#include "run/closing_sample.h"

#include <fmt/format.h>

#include "core/error.h"
#include "sample/sample.h"

namespace loom {

void closing_sample(const std::string& run_dir, int64_t tokens, uint64_t seed, FILE* out) {
  SampleOptions so;  // nanoGPT's sample.py defaults (Sampling's): temperature 0.8, top-k 200
  so.checkpoint = run_dir;
  so.tokens = tokens;
  so.seed = seed;
  so.out = out;
  fmt::print(out, "\nsample ({} tokens, temperature {:g}, top-k {}; more with `loom sample {}`):\n", so.tokens,
             so.sampling.temperature, so.sampling.top_k, run_dir);
  std::fflush(out);
  try {
    run_sample(so);
  } catch (const UserError& e) {
    fmt::print(out, "no sample: {}{}\n", e.what(), e.hint().empty() ? "" : " (" + e.hint() + ")");
  }
}

}  // namespace loom
