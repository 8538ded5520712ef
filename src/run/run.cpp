#include "run/run.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/registry.h"
#include "core/error.h"
#include "nn/models.h"
#include "report/profile.h"
#include "run/run_dir.h"
#include "sample/sample.h"
#include "train/checkpoint.h"
#include "train/evaluator.h"
#include "train/loop.h"
#include "train/model_source.h"

namespace loom {

namespace fs = std::filesystem;

namespace {

// SIGINT / SIGTERM: the first asks the loop to stop after the current step (and its checkpoint);
// a second one exits at once. Only async-signal-safe work happens in the handler.
volatile sig_atomic_t g_signal = 0;

void on_signal(int sig) {
  if (g_signal != 0) _exit(128 + sig);
  g_signal = sig;
}

// Installs the handlers for the lifetime of a run and restores the previous ones after it.
class SignalGuard {
 public:
  SignalGuard() {
    g_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalGuard() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

 private:
  struct sigaction old_int_ {
  }, old_term_{};
};

void append_json(const std::string& path, const nlohmann::json& j) {
  if (path.empty()) return;
  std::ofstream f(path, std::ios::app);
  f << j.dump() << "\n";
  f.flush();
  if (!f) throw std::runtime_error("cannot write metrics file '" + path + "' (disk full?)");
}

void write_config(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.parent_path() / ".config.toml.tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << "# effective configuration of this run (loom train)\n" << text;
    f.flush();
    if (!f) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw std::runtime_error("cannot write '" + path.string() + "' (disk full?)");
    }
  }
  fs::rename(tmp, path);
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

}  // namespace

int run_train(const RunOptions& o) {
  // Configuration: a file (or the default), or the checkpoint's own when resuming without one.
  Checkpoint ckpt;
  fs::path run_dir = o.out_dir;
  bool resume_in_place = false;
  Config c;
  std::unique_ptr<RunDir> rd;
  if (!o.resume.empty()) {
    // Continuing a run in place: take its lock before reading it, so a run still going is
    // reported as such (with its pid) rather than as whatever state its files are in.
    const fs::path given(o.resume);
    const fs::path guess = fs::exists(given / "state.json") ? given.parent_path() : given;
    std::error_code guess_ec;
    if (o.out_dir.empty() || fs::equivalent(o.out_dir, guess, guess_ec)) {
      rd = std::make_unique<RunDir>(guess);
      if (rd->holds_run()) rd->lock();
    }
    std::vector<std::string> skipped;
    ckpt = load_checkpoint(o.resume, &skipped);
    for (const std::string& s : skipped) fmt::print(o.out, "skipping a damaged checkpoint: {}\n", s);
    c = o.config_path.empty() ? config_from_toml_text(ckpt.state.config_toml, ckpt.path + "/state.json", o.overrides)
                              : load_config(o.config_path, o.overrides);
    const fs::path home = fs::path(ckpt.path).parent_path();
    std::error_code ec;
    resume_in_place = run_dir.empty() || fs::equivalent(run_dir, home, ec);
    if (resume_in_place) {
      run_dir = home;
      if (!RunDir(run_dir).holds_run())
        throw UserError(ckpt.path, "is not inside a loom run directory, so there is no run to continue in place",
                        "give --out DIR to continue it as a new run in DIR");
    }
  } else {
    c = load_config(o.config_path.empty() ? kDefaultConfig : o.config_path, o.overrides);
    if (run_dir.empty() && c.data.kind == DataKind::tokens) run_dir = fs::path("runs") / fs::path(c.source).stem();
  }
  if (o.steps >= 0) c.train.steps = o.steps;
  if (o.log_every > 0) c.train.log_every = o.log_every;
  validate_config(c);

  // Refusals that need nothing built come first, and nothing on disk changes before the whole new
  // run (config, data, model, plan, allocation) has been validated below.
  std::error_code same_ec;
  if (!run_dir.empty() && (!rd || !fs::equivalent(rd->path(), run_dir, same_ec))) {
    rd = std::make_unique<RunDir>(run_dir);
    if (!resume_in_place && rd->holds_run() && !o.overwrite)
      throw UserError(
          run_dir.string(), "already holds a run (config.toml, metrics.jsonl or checkpoints)",
          "continue it with --resume " + run_dir.string() + ", replace it with --overwrite, or choose another --out");
    if (fs::exists(run_dir)) rd->lock();  // a second process is refused before it builds anything
  }
  const std::string metrics_file = !c.train.metrics_file.empty() ? c.train.metrics_file
                                   : run_dir.empty()             ? ""
                                                                 : (run_dir / "metrics.jsonl").string();

  set_num_threads(static_cast<int>(c.threads));
  auto be = make_backend(c.device);
  fmt::print(o.out, "loom train: {} ({}), device {} ({} threads), dtype {}, batch {} in {} minibatch{}{}\n", c.source,
             choice_name(c.model.kind), be->name(), num_threads(), dtype_name(c.model.dtype), c.data.batch_size,
             c.optimizer.num_minibatches, c.optimizer.num_minibatches == 1 ? "" : "es",
             run_dir.empty() ? "" : ", run directory " + run_dir.string());
  DataSource data(c.data, data_context(c));
  Trainer t(c, *be);
  const MemoryPlan& p = t.plan();
  fmt::print(o.out,
             "program: {} nodes, {} parameters, activation arena {:.2f} MiB (live-bytes lower bound {:.2f} MiB)\n",
             p.schedule.size(), p.param_bytes / 4, p.arena_bytes / 1048576.0, p.lower_bound_bytes / 1048576.0);
  const std::string config_text = config_to_toml(c);
  double best_val = -1;
  if (!o.resume.empty()) {
    restore_checkpoint(t, ckpt);
    data.set_val_position(ckpt.state.val_position);
    best_val = ckpt.state.best_val_loss;
  } else if (!c.model.init_from.empty()) {  // fine-tuning: the parameters only
    const ModelSource src(c.model.init_from);
    src.load_params(t.executor());
    fmt::print(o.out, "parameters from {}\n", src.description());
  }

  // Everything is valid: now the run directory changes, under its lock.
  if (rd) {
    rd->lock();
    if (resume_in_place) {
      remove_stale_checkpoint_files(run_dir.string());
      const std::vector<std::string> moved = rd->fork_at(t.steps_done(), o.overwrite);
      if (!moved.empty())
        fmt::print(o.out, "resuming at step {}: the later {} {} {}\n", t.steps_done(),
                   moved.size() == 1 ? "checkpoint" : "checkpoints", fmt::join(moved, ", "),
                   o.overwrite ? "were deleted (--overwrite)" : "were moved to " + (run_dir / "superseded").string());
      rd->truncate_metrics(t.steps_done());
    } else {
      if (rd->holds_run()) rd->clear_owned();
      rd->write_marker(ckpt.path);
      // A run seeded from another one starts its metrics with the history up to the checkpoint.
      const fs::path src_metrics = fs::path(ckpt.path).parent_path() / "metrics.jsonl";
      if (!o.resume.empty() && metrics_file == (run_dir / "metrics.jsonl").string() && fs::exists(src_metrics)) {
        std::ofstream f(metrics_file, std::ios::trunc);
        f << metrics_up_to(read_text(src_metrics), t.steps_done());
        f.flush();
        if (!f) throw std::runtime_error("cannot write metrics file '" + metrics_file + "' (disk full?)");
      }
    }
    write_config(run_dir / "config.toml", config_text);
  }
  if (!o.resume.empty()) fmt::print(o.out, "resumed from {} at step {}\n", ckpt.path, t.steps_done());

  std::unique_ptr<Evaluator> eval;
  if (c.train.eval_interval > 0 && data.has_val()) eval = std::make_unique<Evaluator>(t, *be);
  auto state = [&] {
    const LossScaler& sc = t.optimizer().scaler();
    return CheckpointState{.config_toml = config_text,
                           .step = t.steps_done(),
                           .opt_count = t.optimizer().count(),
                           .loss_scale = sc.scale,
                           .scaler_tracker = sc.tracker,
                           .scaler_skipped = sc.skipped,
                           .scaler_consecutive = sc.consecutive,
                           .seed = c.seed,
                           .val_position = data.val_position(),
                           .best_val_loss = best_val};
  };
  int64_t saved_step = o.resume.empty() ? -1 : t.steps_done();
  // What is kept and how to go on, for a run that diverged (said once, for both ways of noticing).
  auto diverged = [&](const std::string& why) {
    const bool kept = !run_dir.empty() && saved_step >= 0;
    return UserError(run_dir.empty() ? c.source : run_dir.string(),
                     "training diverged: " + why + "; " +
                         (run_dir.empty() ? std::string("there is no run directory, so nothing was saved")
                          : kept          ? fmt::format("the last checkpoint, step {}, is intact", saved_step)
                                          : std::string("no checkpoint was written before it")),
                     kept ? "resume with `loom train --resume " + run_dir.string() +
                                "` and a lower optimizer.learning_rate (or optimizer.clip_norm = 1.0); "
                                "train.on_nonfinite = skip goes on past such steps"
                          : "lower optimizer.learning_rate, set optimizer.clip_norm = 1.0, or train in float32");
  };
  // Saves, and prunes only after a successful save. A state holding a NaN is never written: the
  // run stops with the checkpoints it has.
  auto save = [&](const std::string& name) {
    const SaveResult sr = save_checkpoint(t, state(), (run_dir / name).string(), data.tokenizer_json());
    if (!sr.saved)
      throw diverged(fmt::format("tensor '{}' is not finite after step {} (not saved)", sr.nonfinite, t.steps_done()));
    if (name != "best") {
      saved_step = t.steps_done();
      prune_checkpoints(run_dir.string(), c.train.keep_last);
    }
  };
  auto after_step = [&](int64_t step) {
    const bool last = step == c.train.steps;
    if (eval && (step % c.train.eval_interval == 0 || last)) {
      const double vl = eval->run(data, c.train.eval_iters);
      const bool improved = std::isfinite(vl) && (best_val < 0 || vl < best_val);
      if (improved) best_val = vl;
      fmt::print(o.out, "step {}: val loss {:.4f}{}\n", step, vl, improved ? " (best so far)" : "");
      std::fflush(o.out);
      append_json(metrics_file, {{"step", step}, {"val_loss", vl}, {"best_val_loss", best_val}});
      if (improved && !run_dir.empty()) save("best");
    }
    if (run_dir.empty()) return;
    const bool periodic = c.train.checkpoint_interval > 0 ? step % c.train.checkpoint_interval == 0
                                                          : (eval && step % c.train.eval_interval == 0);
    if (periodic || last) save(fmt::format("ckpt_{:06d}", step));
  };

  LoopOptions lo;
  lo.steps = c.train.steps;
  lo.log_every = c.train.log_every;
  lo.metrics_file = metrics_file;
  lo.progress_bar = o.progress_bar;
  lo.out = o.out;
  lo.after_step = after_step;
  lo.should_stop = [] { return g_signal != 0; };
  const SignalGuard signals;
  const auto profiler = attach_train_profiler(t, o.profile_dir, o.profile_steps, lo, o.out);
  const LoopResult res = run_training(t, data, lo);
  if (profiler) profiler->finish();
  if (res.end == LoopEnd::diverged) throw diverged(res.why);
  if (res.end == LoopEnd::stopped) {
    const int sig = g_signal;
    if (!run_dir.empty() && saved_step != t.steps_done()) save(fmt::format("ckpt_{:06d}", t.steps_done()));
    fmt::print(o.out, "\n{} at step {}/{}{}\n", sig == SIGINT ? "interrupted (Ctrl-C)" : "terminated (SIGTERM)",
               t.steps_done(), c.train.steps,
               run_dir.empty()
                   ? " (no run directory: nothing saved)"
                   : fmt::format(": checkpoint saved; continue with `loom train --resume {}`", run_dir.string()));
    std::fflush(o.out);
    return 128 + sig;
  }
  const Metrics& total = res.total;
  if (!total.empty()) {
    // The tutorials' titles: Part 1.1's accumulation experiment names its minibatch count.
    const std::string title = nn::model_kind(c.model.kind).language_model
                                  ? fmt::format("Final metrics - {}", t.model().name)
                                  : fmt::format("Minibatch {}", c.optimizer.num_minibatches);
    fmt::print(o.out, "{}", format_metrics(total, title));
  }
  if (t.optimizer().scaler().enabled)
    fmt::print(o.out, "float16 loss scale {:g}, {} skipped step(s)\n", t.optimizer().scaler().scale,
               t.optimizer().scaler().skipped);
  if (c.train.sample_tokens > 0 && !run_dir.empty() && data.tokenizer_json()) {
    // nanoGPT's sample.py defaults: temperature 0.8, top-k 200.
    SampleOptions so;
    so.checkpoint = run_dir.string();
    so.tokens = c.train.sample_tokens;
    so.temperature = 0.8;
    so.top_k = 200;
    so.seed = c.seed;
    so.out = o.out;
    fmt::print(o.out, "\nsample ({} tokens, temperature 0.8, top-k 200; more with `loom sample {}`):\n", so.tokens,
               run_dir.string());
    std::fflush(o.out);
    run_sample(so);
    fmt::print(o.out, "\n");
  }
  return 0;
}

}  // namespace loom
