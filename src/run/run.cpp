#include "run/run.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "backend/registry.h"
#include "core/error.h"
#include "nn/models.h"
#include "report/ceiling.h"
#include "report/profile.h"
#include "run/run_dir.h"
#include "run/summary.h"
#include "sample/sample.h"
#include "train/checkpoint.h"
#include "train/console.h"
#include "train/distributed.h"
#include "train/evaluator.h"
#include "train/loop.h"
#include "train/model_source.h"

namespace loom {

namespace fs = std::filesystem;

namespace {

// SIGINT / SIGTERM. No thread that runs kernels ever handles them: oneDNN's JIT sgemm (Debian's
// 2.x; oneDNN issue 4845, fixed upstream in 2026) points rsp at a heap workspace while it runs, so
// a handler run on that thread pushes its signal frame onto the heap ("corrupted size vs.
// prev_size" aborts after Ctrl-C, about one run in fifteen here). They are blocked from the start
// of run_train, before its first parallel region creates the OpenMP threads (which inherit the
// mask), and one watcher thread takes them. While the loop runs (armed), the first asks it to stop
// after the current step (and its checkpoint) and a second exits at once; before and after the
// loop one exits at once, as the default action would.
std::atomic<int> g_signal{0};

class SignalWatcher {
 public:
  SignalWatcher() {
    g_signal = 0;
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
    thread_ = std::thread([this] {
      const timespec tick{.tv_sec = 0, .tv_nsec = 50'000'000};  // how long the destructor's join may wait
      while (!done_) {
        const int sig = sigtimedwait(&set_, nullptr, &tick);
        if (sig <= 0) continue;
        if (armed_ && g_signal != 0) {  // the user insisted: say what is left, then go
          static constexpr char msg[] =
              "\nloom: a second stop signal: exiting at once; the checkpoints already saved are intact (a save in "
              "progress is discarded)\n";
          [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
        }
        if (!armed_ || g_signal != 0) _exit(128 + sig);
        g_signal = sig;
      }
    });
  }
  ~SignalWatcher() {
    done_ = true;
    thread_.join();
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;
  void arm(bool on) { armed_ = on; }

 private:
  sigset_t set_{}, old_{};
  std::atomic<bool> armed_{false}, done_{false};
  std::thread thread_;
};

void write_config(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.parent_path() / ".config.toml.tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << kConfigHeader << '\n' << text;
    f.flush();
    if (!f) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw std::runtime_error("cannot write '" + path.string() + "' (disk full?)");
    }
  }
  fs::rename(tmp, path);
}

// Where ranks other than 0 print: nowhere (rank 0 prints the log for the job).
FILE* null_output() {
  static FILE* f = std::fopen("/dev/null", "w");
  return f;
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

}  // namespace

int run_train(const RunOptions& o) {
  const auto started = std::chrono::steady_clock::now();
  SignalWatcher signals;  // first: every thread made after it leaves the signals to it
  auto seconds_since = [](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Data parallelism (train/trainer.h): every rank reads the configuration, the data and a resumed
  // checkpoint itself, trains and evaluates its share; rank 0 alone prints and owns the run
  // directory (its lock, checkpoints, metrics).
  dist::Comm& comm = dist::world();
  const bool writer = comm.rank() == 0;
  FILE* const out = writer ? o.out : null_output();
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
    if (writer && (o.out_dir.empty() || fs::equivalent(o.out_dir, guess, guess_ec))) {
      rd = std::make_unique<RunDir>(guess);
      if (rd->holds_run()) rd->lock();
    }
    std::vector<std::string> skipped;
    ckpt = load_checkpoint(o.resume, &skipped);
    for (const std::string& s : skipped) fmt::print(out, "skipping a damaged checkpoint: {}\n", s);
    c = o.config_path.empty() ? config_from_toml_text(ckpt.state.config_toml, ckpt.path + "/state.json", o.overrides)
                              : load_config(o.config_path, o.overrides);
    const fs::path home = fs::path(ckpt.path).parent_path();
    std::error_code ec;
    resume_in_place = run_dir.empty() || fs::equivalent(run_dir, home, ec);
    if (resume_in_place) {
      run_dir = home;
      if (writer && !RunDir(run_dir).holds_run())
        throw UserError(ckpt.path, "is not inside a loom run directory, so there is no run to continue in place",
                        "give --out DIR to continue it as a new run in DIR");
    }
  } else {
    c = load_config(o.config_path.empty() ? kDefaultConfig : o.config_path, o.overrides);
    if (run_dir.empty() && c.data.kind == DataKind::tokens) run_dir = fs::path("runs") / fs::path(c.source).stem();
  }
  if (o.steps >= 0) c.train.steps = o.steps;
  if (o.log_every > 0) c.train.log_every = o.log_every;
  check_same_job(c, comm);
  check_same_resume(ckpt, comm);
  try {
    validate_config(c);
    minibatch_size(c, comm.size());
  } catch (const UserError& e) {
    throw dist::AgreedError(e);  // every rank checked the same configuration
  }

  // Refusals that need nothing built come first, and nothing on disk changes before the whole new
  // run (config, data, model, plan, allocation) has been validated below.
  std::error_code same_ec;
  if (writer && !run_dir.empty() && (!rd || !fs::equivalent(rd->path(), run_dir, same_ec))) {
    rd = std::make_unique<RunDir>(run_dir);
    // A second process is refused before it builds anything, and a run still going is named as
    // such (with its pid) before the generic refusal of a directory holding a run.
    if (fs::exists(run_dir)) rd->lock();
    if (!resume_in_place) rd->refuse_foreign_files();
    if (!resume_in_place && rd->holds_run() && !o.overwrite)
      throw UserError(
          run_dir.string(), "already holds a run (config.toml, metrics.jsonl or checkpoints)",
          "continue it with --resume " + run_dir.string() + ", replace it with --overwrite, or choose another --out");
  }
  if (c.train.tensorboard && run_dir.empty())
    throw UserError(c.source + ": train.tensorboard", "needs a run directory for its event file",
                    "give --out DIR (tensorboard --logdir DIR's parent then shows it)");
  const std::string metrics_file = !writer                         ? ""
                                   : !c.train.metrics_file.empty() ? c.train.metrics_file
                                   : run_dir.empty()               ? ""
                                                                   : (run_dir / "metrics.jsonl").string();

  set_num_threads(static_cast<int>(c.threads));
  auto be = make_backend(c.device);
  fmt::print(out, "loom train: {} ({}), device {} ({} threads), dtype {}, batch {} in {}{} minibatch{}{}\n", c.source,
             choice_name(c.model.kind), be->name(), num_threads(), dtype_name(c.model.dtype), c.data.batch_size,
             comm.size() == 1 ? "" : fmt::format("{} ranks × ", comm.size()), c.optimizer.num_minibatches,
             c.optimizer.num_minibatches == 1 ? "" : "es",
             run_dir.empty() ? "" : ", run directory " + run_dir.string());
  DataSource data(c.data, data_context(c));
  // On the heap so that it can go before the closing sample, which loads the checkpoint into
  // programs of its own: the run's peak stays the training's (`loom memory`), not the two together.
  const bool evaluates = Evaluator::during_training(c) && data.has_val();
  auto trainer = std::make_unique<Trainer>(c, *be, PlanOptions{}, &comm, evaluates);
  Trainer& t = *trainer;
  const MemoryPlan& p = t.plan();
  fmt::print(out, "program: {} nodes, {} parameters, activation arena {:.2f} MiB (live-bytes lower bound {:.2f} MiB)\n",
             p.schedule.size(), p.param_bytes / 4, p.arena_bytes / 1048576.0, p.lower_bound_bytes / 1048576.0);
  const std::string config_text = config_to_toml(c);
  double best_val = -1;
  if (!o.resume.empty()) {
    restore_checkpoint(t, ckpt);
    data.set_val_position(ckpt.state.val_position);
    best_val = ckpt.state.best_val_loss;
  } else if (!c.model.init_from.empty()) {  // fine-tuning: the parameters only
    const ModelSource src(c.model.init_from);
    // Token ids mean what the model learned only under its own tokenizer: data prepared with
    // another would train every embedding row on the wrong token.
    const std::unique_ptr<Tokenizer> model_tok = src.tokenizer();
    if (model_tok && data.tokenizer_json() && model_tok->to_json() != *data.tokenizer_json())
      throw UserError(c.data.dir + "/meta.json",
                      "the data's " + data.tokenizer_json()->value("kind", std::string("?")) +
                          " tokenizer is not the one of model.init_from (" + src.description() + ", its " +
                          model_tok->kind() + " tokenizer)",
                      "prepare the data with the model's own tokenizer: loom prepare hf " + c.model.init_from +
                          "/tokenizer.json INPUT OUTDIR");
    src.load_params(t.executor());
    fmt::print(o.out, "parameters from {}\n", src.description());
  }

  // Everything is valid: now the run directory changes, under its lock.
  if (rd) {
    rd->lock();
    if (resume_in_place) {
      remove_stale_checkpoint_files(run_dir.string());
      const RunDir::Forked forked = rd->fork_at(t.steps_done(), o.overwrite);
      if (!forked.names.empty())
        fmt::print(out, "resuming at step {}: what came after it {}: {}\n", t.steps_done(),
                   o.overwrite ? "is deleted (--overwrite)" : "is moved to " + forked.aside.string(),
                   fmt::join(forked.names, ", "));
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
  if (!o.resume.empty()) fmt::print(out, "resumed from {} at step {}\n", ckpt.path, t.steps_done());
  if (!o.resume.empty() && t.steps_done() >= c.train.steps)
    fmt::print(out, "{}\n", nothing_to_train(t.steps_done(), c.train.steps));
  MetricsLog metrics(metrics_file, c.train.tensorboard && writer ? run_dir.string() : "");
  if (metrics.tensorboard()) fmt::print(out, "TensorBoard events: {}\n", metrics.tensorboard()->path());

  std::unique_ptr<Evaluator> eval;
  if (evaluates) eval = std::make_unique<Evaluator>(t, *be);
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
  // This session's evaluations and checkpoints: their time (the summary, and the ETA's estimate of
  // those still to come) and the validation losses.
  double eval_s = 0, save_s = 0;
  int64_t evals = 0, saves = 0;
  double last_val = -1;
  int64_t last_val_step = 0;
  int64_t best_val_step = o.resume.empty() ? 0 : std::max<int64_t>(0, checkpoint_step((run_dir / "best").string()));
  // What is kept and how to go on, for a run that diverged (said once, for both ways of noticing).
  auto diverged = [&](const std::string& why) {
    const bool kept = !run_dir.empty() && saved_step >= 0;
    // Every rank sees the same losses and norms, so every rank raises it at the same step.
    return dist::AgreedError(run_dir.empty() ? c.source : run_dir.string(),
                             "training diverged: " + why + "; " +
                                 (run_dir.empty() ? std::string("there is no run directory, so nothing was saved")
                                  : kept          ? fmt::format("the last checkpoint, step {}, is intact", saved_step)
                                                  : std::string("no checkpoint was written before it")),
                             kept
                                 ? "resume with `loom train --resume " + run_dir.string() +
                                       "` and a lower optimizer.learning_rate (or optimizer.clip_norm = 1.0); "
                                       "train.on_nonfinite = skip goes on past such steps"
                                 : "lower optimizer.learning_rate, set optimizer.clip_norm = 1.0, or train in float32");
  };
  // Saves, and prunes only after a successful save. A state holding a NaN is never written: the
  // run stops with the checkpoints it has.
  auto save = [&](const std::string& name) {
    const auto t0 = std::chrono::steady_clock::now();
    const SaveResult sr = save_checkpoint(t, state(), (run_dir / name).string(), data.tokenizer_json());
    save_s += seconds_since(t0);
    ++saves;
    if (!sr.saved)
      throw diverged(fmt::format("tensor '{}' is not finite after step {} (not saved)", sr.nonfinite, t.steps_done()));
    if (name != "best") {
      saved_step = t.steps_done();
      if (writer) prune_checkpoints(run_dir.string(), c.train.keep_last);
    }
  };
  auto after_step = [&](int64_t step) {
    const bool last = step == c.train.steps;
    if (eval && (step % c.train.eval_interval == 0 || last)) {
      const auto t0 = std::chrono::steady_clock::now();
      const double vl = eval->run(data, c.train.eval_iters);
      eval_s += seconds_since(t0);
      ++evals;
      last_val = vl;
      last_val_step = step;
      const bool improved = std::isfinite(vl) && (best_val < 0 || vl < best_val);
      if (improved) best_val = vl, best_val_step = step;
      clear_status_line();
      fmt::print(out, "step {}: val loss {:.4f}{}\n", step, vl, improved ? " (best so far)" : "");
      std::fflush(out);
      // elapsed_s: this command's wall time so far (setup and evaluations included), for time to a loss.
      metrics.write({{"step", step}, {"val_loss", vl}, {"best_val_loss", best_val}, {"elapsed_s", seconds_since(started)}});
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
  lo.metrics = &metrics;
  lo.progress_bar = o.progress_bar && writer;
  lo.out = out;
  lo.after_step = after_step;
  // mpirun forwards a signal to every rank, each at its own moment: the ranks stop after the first
  // step that ends with any of them signalled, all at the same step.
  lo.should_stop = [&comm] {
    const int mine = g_signal;
    std::vector<int> all(static_cast<size_t>(comm.size()));
    comm.all_gather_bytes(&mine, sizeof mine, all.data());
    for (int sig : all) {
      if (sig == 0) continue;
      g_signal = sig;  // the message below names the signal
      return true;
    }
    return false;
  };
  // MFU on the log lines: model FLOPs against the cached matmul ceiling (report/ceiling.h).
  lo.model_flops_per_step = step_flops(t).model;
  lo.ceiling_flops_per_s = writer ? matmul_ceiling_flops(*be, c.model.dtype, out) : 0;  // only rank 0 logs
  // The ETA's share of evaluations and checkpoints still to come after `step`, at their mean time
  // so far; before the first evaluation, eval_iters forward passes of one minibatch at a third of
  // a training minibatch's time (forward ≈ 1/3 of forward + backward).
  lo.pending_seconds = [&](int64_t step, double step_s) {
    auto due = [&](int64_t every) {  // cadence points in (step, steps], the last step always one
      if (every <= 0 || step >= c.train.steps) return int64_t{0};
      return c.train.steps / every - step / every + (c.train.steps % every != 0 ? 1 : 0);
    };
    const int64_t evals_left = eval ? due(c.train.eval_interval) : 0;
    const int64_t save_every = c.train.checkpoint_interval > 0 ? c.train.checkpoint_interval
                               : eval                          ? c.train.eval_interval
                                                               : c.train.steps;
    const int64_t saves_left = run_dir.empty() ? 0 : due(save_every);
    const double per_eval = evals ? eval_s / static_cast<double>(evals)
                                  : static_cast<double>(c.train.eval_iters) * step_s /
                                        (3.0 * static_cast<double>(c.optimizer.num_minibatches));
    const double per_save = saves ? save_s / static_cast<double>(saves) : 0.0;
    return static_cast<double>(evals_left) * per_eval + static_cast<double>(saves_left) * per_save;
  };
  auto profiler = attach_train_profiler(t, o.profile_dir, o.profile_steps, lo, out);
  signals.arm(true);
  const LoopResult res = run_training(t, data, lo);
  signals.arm(false);
  if (profiler) profiler->finish();
  if (res.end == LoopEnd::diverged) throw diverged(res.why);
  if (res.end == LoopEnd::stopped) {
    const int sig = g_signal;
    if (!run_dir.empty() && saved_step != t.steps_done()) save(fmt::format("ckpt_{:06d}", t.steps_done()));
    fmt::print(out, "{} at step {}/{}{}\n", sig == SIGINT ? "interrupted (Ctrl-C)" : "terminated (SIGTERM)",
               t.steps_done(), c.train.steps,
               run_dir.empty()
                   ? " (no run directory: nothing saved)"
                   : fmt::format(": checkpoint saved; continue with `loom train --resume {}`", run_dir.string()));
    std::fflush(out);
    return 128 + sig;
  }
  // Part 1.1's accumulation experiment prints the tutorial's print_metrics block, named by its
  // minibatch count (the run's average, as the tutorial prints it); every run then says what it
  // reached and what it cost.
  const bool lm = nn::model_kind(c.model.kind).language_model;
  if (!lm && !res.total.empty())
    fmt::print(out, "{}", format_metrics(res.total, fmt::format("Minibatch {}", c.optimizer.num_minibatches)));
  if (res.steps_run > 0)
    fmt::print(out, "{}",
               format_run_summary({.first_step = t.steps_done() - res.steps_run + 1,
                                   .last_step = t.steps_done(),
                                   .total_steps = c.train.steps,
                                   .last_loss = res.last.metrics.at("loss").mean(),
                                   .last_val = last_val,
                                   .best_val = best_val,
                                   .last_val_step = last_val_step,
                                   .best_val_step = best_val_step,
                                   .items_per_step = static_cast<double>(t.model().examples *
                                                                         c.optimizer.num_minibatches * comm.size()),
                                   .tokens = lm,
                                   .wall_s = seconds_since(started),
                                   .step_s = res.step_seconds,
                                   .eval_s = eval_s,
                                   .save_s = save_s}));
  if (t.optimizer().scaler().enabled)
    fmt::print(out, "float16 loss scale {:g}, {} skipped step(s)\n", t.optimizer().scaler().scale,
               t.optimizer().scaler().skipped);
  if (c.train.sample_tokens > 0 && !run_dir.empty() && data.tokenizer_json() && writer) {
    profiler.reset();  // it holds the trainer
    eval.reset();
    trainer.reset();
    SampleOptions so;  // nanoGPT's sample.py defaults (Sampling's): temperature 0.8, top-k 200
    so.checkpoint = run_dir.string();
    so.tokens = c.train.sample_tokens;
    so.seed = c.seed;
    so.out = out;
    fmt::print(out, "\nsample ({} tokens, temperature {:g}, top-k {}; more with `loom sample {}`):\n", so.tokens,
               so.sampling.temperature, so.sampling.top_k, run_dir.string());
    std::fflush(out);
    try {
      run_sample(so);
    } catch (const UserError& e) {  // the run is done and saved: a sample that cannot start is not a failure
      fmt::print(out, "no sample: {}{}\n", e.what(), e.hint().empty() ? "" : " (" + e.hint() + ")");
    }
  }
  return 0;
}

}  // namespace loom
