// The train.* keys (core/config_key.h rows over TrainConfig) and their checks.
#include "train/config.h"
#include "train/fit.h"

namespace loom {

using namespace keys;

#define REF(member) LOOM_KEY_REF(TrainConfig, member)

const std::vector<KeySpec<TrainConfig>>& train_keys() {
  static const std::vector<KeySpec<TrainConfig>> keys = {
      integer<TrainConfig>("train.steps", "optimizer steps to run", REF(steps)),
      integer<TrainConfig>("train.log_every", "log every N steps", REF(log_every)),
      path<TrainConfig>("train.metrics_file",
                        "JSONL file with one object per logged step (empty: RUN/metrics.jsonl for runs with --out)",
                        REF(metrics_file)),
      boolean<TrainConfig>("train.tensorboard",
                           "also write the logged numbers as a TensorBoard event file in the run directory "
                           "(tensorboard --logdir runs/)",
                           REF(tensorboard)),
      integer<TrainConfig>("train.eval_interval", "evaluate the validation loss every N steps (0 = never)",
                           REF(eval_interval)),
      integer<TrainConfig>("train.eval_iters",
                           "validation batches (of one minibatch) per evaluation of plain token data; chat data is "
                           "evaluated in one pass over its val split",
                           REF(eval_iters)),
      integer<TrainConfig>("train.checkpoint_interval",
                           "save a checkpoint every N steps (0 = at evaluations and at the end)",
                           REF(checkpoint_interval)),
      integer<TrainConfig>("train.keep_last", "checkpoints to keep (the best one is kept apart)", REF(keep_last)),
      integer<TrainConfig>("train.sample_tokens", "after training, print a sample of this many tokens (0 = none)",
                           REF(sample_tokens)),
      choice<TrainConfig>("train.on_nonfinite", "what a NaN or infinite loss or gradient norm does (float32/bfloat16)",
                          REF(on_nonfinite)),
      integer<TrainConfig>(
          "train.max_skipped_steps",
          "stop after this many skipped steps in a row, in any dtype (float16 overflow included; 0 = never)",
          REF(max_skipped_steps)),
      integer<TrainConfig>(
          "train.bucket_kib",
          "more than one rank (mpirun): gradients are summed over ranks in buckets of this many KiB, each as "
          "soon as the backward has written it (no effect on the result)",
          REF(bucket_kib)),
      size<TrainConfig>("train.memory_budget",
                        "bytes a rank may plan, e.g. 20GiB: model.remat = auto chooses a plan within it, any other "
                        "run is refused above it (empty: the memory available to each rank on this machine)",
                        REF(memory_budget)),
      number<TrainConfig>(
          "train.collective_timeout",
          "more than one rank: seconds a rank waits for the others in a collective before it asks which are "
          "alive, names those that are not (stopped, dead, unreachable) and ends the job; a rank saving a "
          "checkpoint answers that it is busy, so a long save never trips it",
          REF(collective_timeout)),
  };
  return keys;
}

#undef REF

void validate_train(const TrainConfig& c) {
  check_key(c.eval_interval >= 0, "train.eval_interval", "must be >= 0", "0 disables evaluation");
  check_key(c.eval_iters >= 1, "train.eval_iters", "must be >= 1", "e.g. 20");
  check_key(c.checkpoint_interval >= 0, "train.checkpoint_interval", "must be >= 0", "0 saves at evaluations");
  check_key(c.keep_last >= 1, "train.keep_last", "must be >= 1", "e.g. 3");
  check_key(c.sample_tokens >= 0, "train.sample_tokens", "must be >= 0", "e.g. 200");
  check_key(c.bucket_kib >= 1, "train.bucket_kib", "must be >= 1", "e.g. 4096 (4 MiB)");
  check_key(c.max_skipped_steps >= 0, "train.max_skipped_steps", "must be >= 0", "e.g. 25 (0 = never stop)");
  if (!c.memory_budget.empty()) parse_bytes(c.memory_budget, "train.memory_budget");
  check_key(c.steps >= 0, "train.steps", "must be >= 0", "e.g. 5");
  check_key(c.log_every >= 1, "train.log_every", "must be >= 1", "e.g. 1");
}

}  // namespace loom
