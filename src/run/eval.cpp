#include "run/eval.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/registry.h"
#include "core/error.h"
#include "data/data.h"
#include "io/param_io.h"
#include "nn/models.h"
#include "run/choices.h"
#include "train/checkpoint.h"
#include "train/evaluator.h"

namespace loom {

namespace fs = std::filesystem;

int run_eval(const EvalOptions& o) {
  if (!o.choices.empty()) {
    if (!o.overrides.empty() || !o.checkpoint.empty() || o.train || o.iters >= 0)
      throw UserError("--choices", "takes a run, checkpoint or Hugging Face directory alone",
                      "leave out overrides, --checkpoint, --train and --iters");
    return run_choices(o.target, o.choices, o.json, o.out);
  }
  Config c;
  Checkpoint ck;
  std::vector<std::string> skipped;
  if (fs::is_directory(o.target)) {
    if (!o.checkpoint.empty())
      throw UserError("--checkpoint " + o.checkpoint, "is for a config file; " + o.target + " is a directory",
                      "evaluate the checkpoint directly: loom eval " + o.checkpoint);
    ck = load_checkpoint(o.target, &skipped, /*with_optimizer=*/false);
    c = config_from_toml_text(ck.state.config_toml, (fs::path(ck.path) / "state.json").string(), o.overrides);
  } else {
    c = load_config(o.target, o.overrides);
    const std::string dir =
        !o.checkpoint.empty() ? o.checkpoint : (fs::path("runs") / fs::path(o.target).stem()).string();
    if (!fs::exists(dir))
      throw UserError(o.target, "has no checkpoint to evaluate: " + dir + " does not exist",
                      "train it first (loom train " + o.target +
                          "), give --checkpoint DIR, or evaluate a run "
                          "directory: loom eval RUN");
    ck = load_checkpoint(dir, &skipped, /*with_optimizer=*/false);
    const Config stored = config_from_toml_text(ck.state.config_toml, (fs::path(ck.path) / "state.json").string());
    const std::string diff = first_config_difference(config_to_toml(stored), config_to_toml(c), "model.");
    if (!diff.empty())
      throw UserError(ck.path, "was written for a different model: " + diff + " differs from " + o.target,
                      "evaluate it with its own configuration: loom eval " + ck.path);
  }
  for (const std::string& s : skipped) fmt::print(stderr, "skipping a damaged checkpoint: {}\n", s);
  validate_config(c);
  const int64_t iters = o.iters >= 0 ? o.iters : c.train.eval_iters;

  set_num_threads(static_cast<int>(c.threads));
  const std::unique_ptr<Backend> be = make_backend(c.device);
  DataSource data(c.data, data_context(c));
  if (!data.has_val() && !o.train)
    throw UserError("data.kind = " + std::string(choice_name(c.data.kind)), "has no validation split",
                    "add --train to evaluate on training batches, or evaluate on token data (data.kind = tokens)");
  Evaluator ev(c, *be);
  load_checkpoint_params(ev.executor(), ck);  // a LoRA run's: its base, then its adapters

  std::vector<std::pair<const char*, Metrics>> splits;
  if (data.has_val()) splits.emplace_back("val", ev.validation(data, iters));
  if (o.train) splits.emplace_back("train", ev.training(data, iters));
  const bool lm = nn::model_kind(c.model.kind).language_model;
  // Chat data's validation is one pass over its rows (train/evaluator.h), whatever `iters` says.
  const bool one_pass = data.has_val() && rows_of_examples(c.data);
  if (o.json) {
    nlohmann::json j = {{"checkpoint", ck.path}, {"step", ck.state.step}, {"iters", iters}, {"val_one_pass", one_pass}};
    for (const auto& [name, m] : splits)
      j[name] = {{"loss", m.loss.mean()},
                 {"accuracy", m.accuracy.mean()},
                 {lm ? "tokens" : "examples", m.loss.count}};
    fmt::print(o.out, "{}\n", j.dump(2));
    return 0;
  }
  const std::string batches = fmt::format("{} batch{}", iters, iters == 1 ? "" : "es");
  if (one_pass)
    fmt::print(o.out, "loom eval: {} (step {}), val in one pass over its rows{}\n", ck.path, ck.state.step,
               o.train ? ", train in " + batches : "");
  else
    fmt::print(o.out, "loom eval: {} (step {}), {} per split\n", ck.path, ck.state.step, batches);
  for (const auto& [name, m] : splits)
    fmt::print(o.out, "{:<5}  loss {:.4f}  accuracy {:.4f}  ({} {})\n", name, m.loss.mean(),
               m.accuracy.mean(), m.loss.count, lm ? "tokens" : "examples");
  return 0;
}

}  // namespace loom
