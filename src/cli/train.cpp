// `loom train [CONFIG] [overrides] [--steps N] [--out DIR] [--resume DIR] [--profile DIR] ...`:
// a whole run (run/run.h); `--help-config` lists every configuration key instead.
#include <unistd.h>

#include <memory>

#include "cli/command.h"
#include "run/run.h"

namespace loom::cli {

namespace {
struct TrainArgs {
  ConfigArgs config;
  RunOptions run;
  std::string init_from;
  bool help_config = false;
};
}  // namespace

CommandBody add_train_command(CLI::App& sub) {
  auto a = std::make_shared<TrainArgs>();
  a->config.add(sub, /*required=*/false, "section.key=value overrides, e.g. optimizer.num_minibatches=4");
  sub.add_option("--steps", a->run.steps, "optimizer steps (overrides train.steps)")->check(integer_at_least(0));
  sub.add_option("--log-every", a->run.log_every, "log every N steps (overrides train.log_every)")
      ->check(integer_at_least(1));
  sub.add_option("--out", a->run.out_dir,
                 "run directory for config.toml, metrics.jsonl and checkpoints (default runs/<config name> for "
                 "token data)")
      ->transform(home_path());
  sub.add_flag("--overwrite", a->run.overwrite, "replace the run already in --out");
  sub.add_option("--resume", a->run.resume, "continue the run in this directory (or ckpt_<step> directory)")
      ->transform(home_path());
  sub.add_option("--init-from", a->init_from,
                 "start from this model's parameters (model.init_from): a Hugging Face directory or a loom run");
  sub.add_option("--profile", a->run.profile_dir,
                 "profile a window of steps into DIR (trace.json, summary.json, memory.html)")
      ->transform(home_path());
  sub.add_option("--profile-steps", a->run.profile_steps,
                 "the window for --profile: FIRST:LAST, 1-based, inclusive (default 2:4)");
  sub.add_flag("--help-config", a->help_config, "list every configuration key with its type, default and choices");
  return [a] {
    if (a->help_config) return print_config_help();
    RunOptions run = a->run;
    run.config_path = a->config.path();
    run.overrides = a->config.overrides();
    if (!a->init_from.empty()) run.overrides.push_back("model.init_from=" + a->init_from);
    run.progress_bar = isatty(STDOUT_FILENO);
    return run_train(run);
  };
}

}  // namespace loom::cli
