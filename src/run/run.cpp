#include "run/run.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/registry.h"
#include "core/error.h"
#include "report/profile.h"
#include "sample/sample.h"
#include "train/checkpoint.h"
#include "train/distributed.h"
#include "train/evaluator.h"
#include "train/loop.h"

namespace loom {

namespace fs = std::filesystem;

namespace {

bool holds_run(const fs::path& dir) {
  if (!fs::exists(dir)) return false;
  if (fs::exists(dir / "config.toml") || fs::exists(dir / "metrics.jsonl") || fs::exists(dir / "best")) return true;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind("ckpt_", 0) == 0) return true;
  return false;
}

// Removes what a previous run wrote (and only that).
void clear_run(const fs::path& dir) {
  std::error_code ec;
  fs::remove(dir / "config.toml", ec);
  fs::remove(dir / "metrics.jsonl", ec);
  fs::remove_all(dir / "best", ec);
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("ckpt_", 0) == 0 || n.rfind(".ckpt_", 0) == 0 || n.rfind(".best", 0) == 0) fs::remove_all(e.path(), ec);
  }
}

void append_json(const std::string& path, const nlohmann::json& j) {
  if (path.empty()) return;
  std::ofstream f(path, std::ios::app);
  f << j.dump() << "\n";
}

// Where ranks other than 0 print: nowhere (rank 0 prints the log for the job).
FILE* null_output() {
  static FILE* f = std::fopen("/dev/null", "w");
  return f;
}

}  // namespace

int run_train(const RunOptions& o) {
  // Data parallelism (train/trainer.h): every rank trains and evaluates its share; rank 0 alone
  // prints and writes the run directory (checkpoints, metrics). Every rank reads the
  // configuration, the data and a resumed checkpoint itself.
  dist::Comm& comm = dist::world();
  const bool writer = comm.rank() == 0;
  FILE* const out = writer ? o.out : null_output();
  // Configuration: a file (or the default), or the checkpoint's own when resuming without one.
  Checkpoint ckpt;
  fs::path run_dir = o.out_dir;
  Config c;
  if (!o.resume.empty()) {
    ckpt = load_checkpoint(o.resume);
    c = o.config_path.empty() ? config_from_toml_text(ckpt.state.config_toml, ckpt.path + "/state.json", o.overrides)
                              : load_config(o.config_path, o.overrides);
    if (run_dir.empty()) run_dir = fs::path(ckpt.path).parent_path();
  } else {
    c = load_config(o.config_path.empty() ? kDefaultConfig : o.config_path, o.overrides);
    if (run_dir.empty() && c.data.kind == "tokens") run_dir = fs::path("runs") / fs::path(c.source).stem();
  }
  if (o.steps >= 0) c.train.steps = o.steps;
  if (o.log_every > 0) c.train.log_every = o.log_every;
  check_same_job(c, comm);
  try {
    validate_config(c);
    minibatch_size(c, comm.size());
  } catch (const UserError& e) {
    throw dist::AgreedError(e);  // every rank checked the same configuration
  }

  if (!run_dir.empty() && o.resume.empty() && writer) {
    if (holds_run(run_dir)) {
      if (!o.overwrite)
        throw UserError(
            run_dir.string(), "already holds a run (config.toml, metrics.jsonl or checkpoints)",
            "continue it with --resume " + run_dir.string() + ", replace it with --overwrite, or choose another --out");
      clear_run(run_dir);
    }
    fs::create_directories(run_dir);
  }
  const std::string metrics_file = !writer                         ? ""
                                   : !c.train.metrics_file.empty() ? c.train.metrics_file
                                   : run_dir.empty()               ? ""
                                                                   : (run_dir / "metrics.jsonl").string();

  set_num_threads(static_cast<int>(c.threads));
  auto be = make_backend(c.device);
  fmt::print(out, "loom train: {} ({}), device {} ({} threads), dtype {}, batch {} in {}{} minibatch{}{}\n", c.source,
             c.model.kind, be->name(), num_threads(), dtype_name(c.model.dtype), c.data.batch_size,
             comm.size() == 1 ? "" : fmt::format("{} ranks × ", comm.size()), c.optimizer.num_minibatches,
             c.optimizer.num_minibatches == 1 ? "" : "es",
             run_dir.empty() ? "" : ", run directory " + run_dir.string());
  DataSource data(c.data, data_context(c));
  Trainer t(c, *be, {}, &comm);
  const MemoryPlan& p = t.plan();
  fmt::print(out, "program: {} nodes, {} parameters, activation arena {:.2f} MiB (live-bytes lower bound {:.2f} MiB)\n",
             p.schedule.size(), p.param_bytes / 4, p.arena_bytes / 1048576.0, p.lower_bound_bytes / 1048576.0);
  const std::string config_text = config_to_toml(c);
  double best_val = -1;
  if (!o.resume.empty()) {
    restore_checkpoint(t, ckpt);
    data.set_val_position(ckpt.state.val_position);
    best_val = ckpt.state.best_val_loss;
    fmt::print(out, "resumed from {} at step {}\n", ckpt.path, t.steps_done());
  }
  if (!run_dir.empty() && writer) {
    std::ofstream(run_dir / "config.toml") << "# effective configuration of this run (loom train)\n" << config_text;
  }

  std::unique_ptr<Evaluator> eval;
  if (c.train.eval_interval > 0 && data.has_val()) eval = std::make_unique<Evaluator>(t, *be);
  auto state = [&] {
    const LossScaler& sc = t.optimizer().scaler();
    return CheckpointState{config_text, t.steps_done(), t.optimizer().count(), sc.scale, sc.tracker,
                           sc.skipped,  c.seed,         data.val_position(),   best_val};
  };
  auto save = [&](const std::string& name) {
    save_checkpoint(t, state(), (run_dir / name).string(), data.tokenizer_json());
  };
  auto after_step = [&](int64_t step) {
    const bool last = step == c.train.steps;
    if (eval && (step % c.train.eval_interval == 0 || last)) {
      const double vl = eval->run(data, c.train.eval_iters);
      const bool improved = best_val < 0 || vl < best_val;
      if (improved) best_val = vl;
      fmt::print(out, "step {}: val loss {:.4f}{}\n", step, vl, improved ? " (best so far)" : "");
      std::fflush(out);
      append_json(metrics_file, {{"step", step}, {"val_loss", vl}, {"best_val_loss", best_val}});
      if (improved && !run_dir.empty()) save("best");
    }
    if (run_dir.empty()) return;
    const bool periodic = c.train.checkpoint_interval > 0 ? step % c.train.checkpoint_interval == 0
                                                          : (eval && step % c.train.eval_interval == 0);
    if (periodic || last) {
      save(fmt::format("ckpt_{:06d}", step));  // every rank: sharded optimizer state is gathered
      if (writer) prune_checkpoints(run_dir.string(), c.train.keep_last);
    }
  };

  LoopOptions lo;
  lo.steps = c.train.steps;
  lo.log_every = c.train.log_every;
  lo.metrics_file = metrics_file;
  lo.progress_bar = o.progress_bar && writer;
  lo.out = out;
  lo.after_step = after_step;
  const auto profiler = attach_train_profiler(t, o.profile_dir, o.profile_steps, lo, out);
  const Metrics total = run_training(t, data, lo);
  if (profiler) profiler->finish();
  if (!total.empty()) {
    const std::string title = c.model.kind == "mlp_classifier"
                                  ? fmt::format("Minibatch {}", c.optimizer.num_minibatches)
                                  : fmt::format("Final metrics - {}", t.model().name);
    fmt::print(out, "{}", format_metrics(total, title));
  }
  if (t.optimizer().scaler().enabled)
    fmt::print(out, "float16 loss scale {:g}, {} skipped step(s)\n", t.optimizer().scaler().scale,
               t.optimizer().scaler().skipped);
  if (c.train.sample_tokens > 0 && !run_dir.empty() && data.tokenizer_json() && writer) {
    // nanoGPT's sample.py defaults: temperature 0.8, top-k 200.
    SampleOptions so;
    so.checkpoint = run_dir.string();
    so.tokens = c.train.sample_tokens;
    so.temperature = 0.8;
    so.top_k = 200;
    so.seed = c.seed;
    so.out = out;
    fmt::print(out, "\nsample ({} tokens, temperature 0.8, top-k 200; more with `loom sample {}`):\n", so.tokens,
               run_dir.string());
    std::fflush(out);
    run_sample(so);
    fmt::print(out, "\n");
  }
  return 0;
}

}  // namespace loom
