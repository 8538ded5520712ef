// `loom sample CHECKPOINT [--prompt TEXT | --prompt-file FILE | --chat MESSAGE|-] [--tokens N]
// [--num-samples N] [--temperature T] [--top-k K] [--top-p P] ...`
// (sample/sample.h, sample/chat.h).
#include <memory>

#include "cli/command.h"
#include "sample/sample.h"

namespace loom::cli {

CommandBody add_sample_command(CLI::App& sub) {
  auto o = std::make_shared<SampleOptions>();
  sub.add_option("checkpoint", o->checkpoint, "a ckpt_<step> directory, or a run directory (its latest checkpoint)")
      ->required()
      ->transform(home_path());
  CLI::Option* prompt =
      sub.add_option("--prompt", o->prompt, "text to continue (default: a newline, or <|endoftext|> for GPT-2)");
  sub.add_option("--prompt-file", o->prompt_file, "read the text to continue from FILE")
      ->excludes(prompt)
      ->transform(home_path());
  sub.add_option("--chat", o->chat,
                 "answer MESSAGE as the model's chat template asks, stopping at the end of its turn; - reads a "
                 "conversation from stdin, one message per line")
      ->excludes(prompt);
  sub.add_option("--system", o->system, "with --chat: the system message");
  sub.add_option("--template", o->template_path,
                 "with --chat: a Jinja chat template instead of the checkpoint's tokenizer_config.json")
      ->transform(home_path());
  sub.add_option("--tokens", o->tokens, "tokens to generate per sample (default 256; with --chat, the most per reply)")
      ->check(integer_at_least(0));
  sub.add_option("--context", o->context,
                 "positions of context the KV cache holds, from 2 to the model's max_seq_len (default: all); "
                 "bounds the cache's memory for long-context checkpoints");
  sub.add_option("--num-samples", o->num_samples, "samples to generate, each from the prompt (default 1)")
      ->check(integer_at_least(1));
  sub.add_option("--temperature", o->sampling.temperature,
                 "softmax temperature; 0 = greedy (default 0.8, as nanoGPT and the sample after training)");
  sub.add_option("--top-k", o->sampling.top_k, "sample among the k most likely tokens; 0 = all (default 200)")
      ->check(integer_at_least(0));
  sub.add_option("--top-p", o->sampling.top_p,
                 "then among the most likely tokens holding this share of the probability (nucleus; default 1 = off)");
  sub.add_option("--seed", o->seed, "random seed (default 0)");
  sub.add_option("--threads", o->threads, "CPU threads (default: the checkpoint's `threads`; 0 = all cores)")
      ->check(integer_at_least(0));
  sub.add_flag("--stats", o->stats, "print prefill and decode tokens/s to stderr");
  sub.add_flag_callback(
      "--token-prefill", [o] { o->prefill = Prefill::token; },
      "feed the prompt through the one-token decoder instead of one batched pass (slower; no prefill program)");
  return [o] { return run_sample(*o); };
}

}  // namespace loom::cli
