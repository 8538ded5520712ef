// `loom sample CHECKPOINT [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] ...`
// (sample/sample.h).
#include <memory>

#include "cli/command.h"
#include "sample/sample.h"

namespace loom::cli {

CommandBody add_sample_command(CLI::App& sub) {
  auto o = std::make_shared<SampleOptions>();
  sub.add_option("checkpoint", o->checkpoint, "a ckpt_<step> directory, or a run directory (its latest checkpoint)")
      ->required();
  sub.add_option("--prompt", o->prompt, "text to continue (default: a newline, or <|endoftext|> for GPT-2)");
  sub.add_option("--tokens", o->tokens, "tokens to generate (default 256)")->check(integer_at_least(0));
  sub.add_option("--temperature", o->temperature, "softmax temperature; 0 = greedy (default 1.0)");
  sub.add_option("--top-k", o->top_k, "sample among the k most likely tokens; 0 = all (default 0)")
      ->check(integer_at_least(0));
  sub.add_option("--seed", o->seed, "random seed (default 0)");
  sub.add_option("--threads", o->threads, "CPU threads (default: the checkpoint's `threads`; 0 = all cores)")
      ->check(integer_at_least(0));
  sub.add_flag("--stats", o->stats, "print prefill and per-token decode times to stderr");
  return [o] { return run_sample(*o); };
}

}  // namespace loom::cli
