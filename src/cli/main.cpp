// The loom command: `loom params`, `loom train`. Parses flags and prints; the work is in train/.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "core/error.h"
#include "data/data.h"
#include "data/prepare.h"
#include "dist/comm.h"
#include "report/memory_html.h"
#include "report/memory_report.h"
#include "report/params.h"
#include "report/profile.h"
#include "run/run.h"
#include "sample/sample.h"
#include "train/config.h"
#include "train/loop.h"
#include "train/trainer.h"

namespace {

using namespace loom;

Config load(const std::string& path, const std::vector<std::string>& overrides) {
  return load_config(path.empty() ? kDefaultConfig : path, overrides);
}

int cmd_params(const std::string& path, const std::vector<std::string>& overrides) {
  const Config c = load(path, overrides);
  const nn::ModelGraph m = build_model(c, c.data.batch_size, /*train=*/false);
  fmt::print("{}", nn::summarize(m));
  return 0;
}

// --sweep key=v1,v2 (repeatable): every combination, one row each.
int cmd_memory(const std::string& path, const std::vector<std::string>& overrides, bool json,
               const std::vector<std::string>& sweeps, const std::string& budget_text, PlanOptions popts, int ranks) {
  const int64_t budget = budget_text.empty() ? 0 : parse_bytes(budget_text, "--budget");
  if (sweeps.empty()) {
    const MemoryReport r = memory_report(load(path, overrides), 15, popts, ranks);
    if (json) {
      nlohmann::json j = memory_report_json(r);
      if (budget) j["fits_budget"] = r.total_bytes <= budget;
      fmt::print("{}\n", j.dump(2));
    } else {
      fmt::print("{}", format_memory_report(r));
      if (budget) fmt::print("\nbudget {}: {}\n", gib(budget), r.total_bytes <= budget ? "fits" : "does NOT fit");
      if (ranks > 1) fmt::print("\n{}", format_shard_modes(load(path, overrides), ranks, popts));
    }
    return 0;
  }
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;
  for (const std::string& s : sweeps) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
      throw UserError("--sweep " + s, "expected key=v1,v2,...", "e.g. --sweep model.remat=none,MLP,Block");
    std::vector<std::string> vals;
    for (size_t a = eq + 1; a <= s.size();) {
      size_t b = s.find(',', a);
      if (b == std::string::npos) b = s.size();
      vals.push_back(s.substr(a, b - a));
      a = b + 1;
    }
    axes.emplace_back(s.substr(0, eq), vals);
  }
  // Values may themselves contain commas (model.remat=MLP,Attn): write them with '+' instead.
  std::vector<size_t> idx(axes.size(), 0);
  nlohmann::json rows = nlohmann::json::array();
  std::string header;
  for (const auto& [k, v] : axes) header += fmt::format("{:<26} ", k);
  if (!json)
    fmt::print("{}{:>11} {:>11} {:>11} {:>11} {:>9}{}\n", header, "total", "activations", "params+grad", "optimizer",
               "plan ms", budget ? "  fits " + gib(budget) : "");
  while (true) {
    std::vector<std::string> ov = overrides;
    std::string cols;
    nlohmann::json row;
    for (size_t a = 0; a < axes.size(); ++a) {
      std::string v = axes[a].second[idx[a]];
      std::replace(v.begin(), v.end(), '+', ',');
      ov.push_back(axes[a].first + "=" + v);
      cols += fmt::format("{:<26} ", v);
      row[axes[a].first] = v;
    }
    const MemoryReport r = memory_report(load(path, ov), 15, popts, ranks);
    if (json) {
      row["report"] = memory_report_json(r);
      if (budget) row["fits_budget"] = r.total_bytes <= budget;
      rows.push_back(row);
    } else {
      fmt::print("{}{:>11} {:>11} {:>11} {:>11} {:>9.1f}{}\n", cols, gib(r.total_bytes), gib(r.activations_bytes),
                 gib(r.params_bytes + r.grads_bytes), gib(r.optimizer_bytes), r.plan_ms,
                 budget ? (r.total_bytes <= budget ? "  yes" : "  NO") : "");
    }
    size_t a = 0;
    while (a < axes.size() && ++idx[a] == axes[a].second.size()) idx[a++] = 0;
    if (a == axes.size()) break;
  }
  if (json) fmt::print("{}\n", rows.dump(2));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  loom::dist::Launch launch(&argc, &argv);  // MPI, only when started by mpirun
  CLI::App app{
      "loom: train Transformer language models (and small MLPs) on one device, with every memory and speed "
      "technique measurable.\nConfigs are TOML; any key can be overridden as section.key=value."};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every subcommand");

  std::string config;
  std::vector<std::string> overrides;
  int64_t steps = -1, log_every = 0;

  auto* params = app.add_subcommand("params", "print the parameter table and count of a model (runs nothing)");
  params->add_option("config", config, "config file (TOML)")->required();
  params->add_option("overrides", overrides, "section.key=value overrides");

  auto* train = app.add_subcommand("train", "train a model");
  train->add_option("config", config, std::string("config file (TOML); default ") + kDefaultConfig);
  train->add_option("overrides", overrides, "section.key=value overrides, e.g. optimizer.num_minibatches=4");
  train->add_option("--steps", steps, "optimizer steps (overrides train.steps)");
  train->add_option("--log-every", log_every, "log every N steps (overrides train.log_every)");
  RunOptions run;
  train->add_option("--out", run.out_dir,
                    "run directory for config.toml, metrics.jsonl and checkpoints (default runs/<config name> for "
                    "token data)");
  train->add_flag("--overwrite", run.overwrite, "replace the run already in --out");
  train->add_option("--resume", run.resume, "continue the run in this directory (or ckpt_<step> directory)");
  train->add_option("--profile", run.profile_dir,
                    "profile a window of steps into DIR (trace.json, summary.json, memory.html)");
  train->add_option("--profile-steps", run.profile_steps,
                    "the window for --profile: FIRST:LAST, 1-based, inclusive (default 2:4)");
  bool help_config = false;
  train->add_flag("--help-config", help_config, "list every configuration key with its type and default");

  auto* prepare =
      app.add_subcommand("prepare", "tokenize a text file into train.bin, val.bin and meta.json (nanoGPT layout)");
  std::string prep_kind, prep_input, prep_out, prep_vocab;
  double val_fraction = 0.1;
  prepare->add_option("tokenizer", prep_kind, "char (sorted unique characters) or gpt2 (byte-level BPE)")
      ->required()
      ->check(CLI::IsMember({"char", "gpt2"}));
  prepare->add_option("input", prep_input, "UTF-8 text file")->required();
  prepare->add_option("outdir", prep_out, "output directory")->required();
  prepare->add_option("--val-fraction", val_fraction, "fraction of the text held out for validation (default 0.1)");
  prepare->add_option("--vocab", prep_vocab, "gpt2: directory with encoder.json and vocab.bpe");

  auto* memory =
      app.add_subcommand("memory", "plan a training run and print its device memory, without running anything");
  memory->add_option("config", config, std::string("config file (TOML); default ") + kDefaultConfig);
  memory->add_option("overrides", overrides, "section.key=value overrides, e.g. model.remat=none");
  bool mem_json = false;
  std::vector<std::string> sweeps;
  std::string budget;
  memory->add_flag("--json", mem_json, "print the report as JSON");
  memory->add_option("--sweep", sweeps,
                     "key=v1,v2,... : one row per combination (repeatable); write commas inside a value as '+', "
                     "e.g. model.remat=none,MLP+Attn,Block");
  memory->add_option("--budget", budget, "device memory to fit in, e.g. 24GiB: marks which rows fit");
  bool no_inplace = false;
  memory->add_flag("--no-inplace", no_inplace, "plan without in-place buffer reuse (to see what it saves)");
  int mem_ranks = 1;
  memory->add_option("--ranks", mem_ranks, "plan one rank of N (mpirun -np N): its share of the batch and state")
      ->check(CLI::PositiveNumber);
  std::string mem_html;
  memory->add_option("--html", mem_html, "also write the memory viewer (one self-contained HTML page) to FILE");

  auto* profile =
      app.add_subcommand("profile", "run a few training steps and write a trace, a summary and the memory viewer");
  profile->add_option("config", config, std::string("config file (TOML); default ") + kDefaultConfig);
  profile->add_option("overrides", overrides, "section.key=value overrides, e.g. model.dtype=bfloat16");
  ProfileCommand prof;
  profile->add_option("--steps", prof.steps, "profiled steps (default 3)");
  profile->add_option("--warmup", prof.warmup, "steps run first and not recorded (default 1)");
  profile->add_option("--out", prof.out_dir, "output directory (default profile)");
  profile->add_flag("--no-ceiling", prof.no_ceiling, "skip measuring the matmul ceiling (about a second)");
  profile->add_option("--overhead", prof.overhead_pairs,
                      "instead of profiling, time N steps with recording off and N with it on, alternating");

  auto* sample =
      app.add_subcommand("sample", "generate text from a checkpoint, streaming it as it is produced (KV cache)");
  SampleOptions samp;
  sample
      ->add_option("checkpoint", samp.checkpoint, "a ckpt_<step> directory, or a run directory (its latest checkpoint)")
      ->required();
  sample->add_option("--prompt", samp.prompt, "text to continue (default: a newline, or <|endoftext|> for GPT-2)");
  sample->add_option("--tokens", samp.tokens, "tokens to generate (default 256)");
  sample->add_option("--temperature", samp.temperature, "softmax temperature; 0 = greedy (default 1.0)");
  sample->add_option("--top-k", samp.top_k, "sample among the k most likely tokens; 0 = all (default 0)");
  sample->add_option("--seed", samp.seed, "random seed (default 0)");
  sample->add_option("--threads", samp.threads, "CPU threads (default: the checkpoint's `threads`; 0 = all cores)");
  sample->add_flag("--stats", samp.stats, "print prefill and per-token decode times to stderr");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // A first positional that looks like an override (has '=') is an override, not a config path.
  if (config.find('=') != std::string::npos) {
    overrides.insert(overrides.begin(), config);
    config.clear();
  }
  try {
    if (help_config) {
      fmt::print("configuration keys:\n{}", config_help());
      return 0;
    }
    if (params->parsed()) return cmd_params(config, overrides);
    if (train->parsed()) {
      run.config_path = config;
      run.overrides = overrides;
      run.steps = steps;
      run.log_every = log_every;
      run.progress_bar = isatty(STDOUT_FILENO);
      return run_train(run);
    }
    if (prepare->parsed()) return run_prepare(prep_kind, prep_input, prep_out, val_fraction, prep_vocab);
    if (memory->parsed() && !mem_html.empty()) write_memory_html(load(config, overrides), mem_html);
    if (memory->parsed())
      return cmd_memory(config, overrides, mem_json, sweeps, budget, PlanOptions{!no_inplace, true}, mem_ranks);
    if (profile->parsed()) return profile_command(load(config, overrides), prof);
    if (sample->parsed()) return run_sample(samp);
  } catch (const UserError& e) {
    std::fflush(stdout);
    fmt::print(stderr, "loom: error: {}\n", e.what());
    if (!e.hint().empty()) fmt::print(stderr, "  fix: {}\n", e.hint());
    return dist::fail_job(2);
  } catch (const std::invalid_argument& e) {
    std::fflush(stdout);
    fmt::print(stderr, "loom: error: {}\n", e.what());
    return dist::fail_job(2);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "loom: failed: {}\n", e.what());
    return dist::fail_job(1);
  }
  return 0;
}
