// `loom eval CONFIG_OR_RUN`: the loss and accuracy of a checkpoint, without training — on the
// validation split (the first `iters` batches, from its start, so two calls agree) and, with
// --train, on the first `iters` training batches (nanoGPT's estimate_loss reports both).
//   RUN or CKPT   a run directory (its latest checkpoint) or a ckpt_<step>/best directory: the
//                 checkpoint's own configuration, with the overrides (e.g. data.dir=other/ to
//                 evaluate on other data of the same vocabulary)
//   CONFIG        a TOML file with the overrides; the checkpoint is --checkpoint DIR or the latest
//                 in the run directory `loom train CONFIG` writes by default (runs/<config name>);
//                 its model must be the config's
// With --choices FILE.jsonl: multiple-choice acc and acc_norm of a run, checkpoint or Hugging Face
// directory instead (run/choices.h).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace loom {

struct EvalOptions {
  std::string target;  // a run, checkpoint or config path
  std::vector<std::string> overrides;
  std::string checkpoint;  // with a config: the checkpoint to evaluate
  int64_t iters = -1;      // batches per split; -1 = train.eval_iters
  bool train = false;      // also the training batches
  bool json = false;       // one JSON object instead of the table
  std::string choices;     // a multiple-choice file (run/choices.h) to score instead of the loss
  std::FILE* out = stdout;
};

int run_eval(const EvalOptions& o);

}  // namespace loom
