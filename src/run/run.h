// `loom train`: a whole run — configuration, run directory, data, training loop, validation,
// checkpoints (periodic, best, final), resume, and the final metrics block.
//
// Run directory (--out DIR; default runs/<config name> when training on token data, none for
// the tutorials' fixed random batches): config.toml (the effective configuration),
// metrics.jsonl, ckpt_<step>/ (the last train.keep_last), best/ (best validation loss).
// A directory that already holds a run is refused unless --overwrite; --resume DIR continues it.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace loom {

// The default main job: nanoGPT's CPU recipe on tiny Shakespeare (needs `loom prepare char
// data/tinyshakespeare.txt data/shakespeare_char` first; scripts/main.sh does it).
inline constexpr const char* kDefaultConfig = "configs/shakespeare_char.toml";

struct RunOptions {
  std::string config_path;  // "" with resume: the checkpoint's own configuration
  std::vector<std::string> overrides;
  int64_t steps = -1;     // overrides train.steps when >= 0
  int64_t log_every = 0;  // overrides train.log_every when > 0
  std::string out_dir;
  bool overwrite = false;
  std::string resume;  // a run directory or a ckpt_<step> directory
  bool progress_bar = false;
  std::string profile_dir;    // --profile: record a window of steps there (report/profile.h)
  std::string profile_steps;  // --profile-steps a:b ("" = 2:4)
  FILE* out = stdout;
};

int run_train(const RunOptions& o);

}  // namespace loom
