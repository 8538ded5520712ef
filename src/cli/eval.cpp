// `loom eval RUN|CKPT|CONFIG [overrides] [--checkpoint DIR] [--iters N] [--train] [--json]`, or
// `loom eval RUN|CKPT|HF_DIR --choices FILE.jsonl [--json]` (run/eval.h, run/choices.h).
#include <memory>

#include "cli/command.h"
#include "run/eval.h"

namespace loom::cli {

namespace {
struct EvalArgs {
  EvalOptions eval;
  std::vector<std::string> overrides;
};
}  // namespace

CommandBody add_eval_command(CLI::App& sub) {
  auto a = std::make_shared<EvalArgs>();
  sub.add_option("target", a->eval.target,
                 "a run directory (its latest checkpoint), a ckpt_<step> or best/ directory, or a config file")
      ->required()
      ->transform(home_path());
  sub.add_option("overrides", a->overrides, "section.key=value overrides, e.g. data.dir=other_data");
  sub.add_option("--checkpoint", a->eval.checkpoint,
                 "with a config file: the checkpoint (or run directory) to evaluate (default runs/<config name>)")
      ->transform(home_path());
  sub.add_option("--iters", a->eval.iters, "batches per split (default train.eval_iters); chat data's val split is one pass over its rows")->check(integer_at_least(1));
  sub.add_flag("--train", a->eval.train, "also evaluate on the first N training batches");
  sub.add_flag("--json", a->eval.json, "print one JSON object");
  sub.add_option("--choices", a->eval.choices,
                 "multiple-choice questions (JSON Lines of context, choices, label): print acc and acc_norm as "
                 "lm-evaluation-harness defines them")
      ->transform(home_path());
  return [a] {
    EvalOptions o = a->eval;
    o.overrides = a->overrides;
    return run_eval(o);
  };
}

}  // namespace loom::cli
