#include "run/run.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <vector>

#include "backend/registry.h"
#include "core/clock.h"
#include "nn/models.h"
#include "report/ceiling.h"
#include "report/params.h"
#include "report/profile.h"
#include "run/checkpoints.h"
#include "run/closing_sample.h"
#include "run/divergence.h"
#include "run/evaluation.h"
#include "run/open_run.h"
#include "run/stop.h"
#include "run/summary.h"
#include "train/console.h"
#include "train/loop.h"

namespace loom {

namespace {

const char* env(const char* name) { return std::getenv(name); }

// Where ranks other than 0 print: nowhere (rank 0 prints the log for the job).
FILE* null_output() {
  static FILE* f = std::fopen("/dev/null", "w");
  return f;
}

// Rank 0's output: o.out through a stream that a terminal nobody reads cannot block once a stop
// signal came (train/console.h); closed (flushed) when the run returns, and flushed, dropping what
// a reader does not take at once, when a rank ends the job (dist::set_before_abort).
struct Output {
  FILE* f;
  bool owned = false;
  // `own_fd`: under a launcher, whose daemon gives each rank an output of its own.
  Output(FILE* to, bool own_fd) : f(to ? to : null_output()) {
    if (!to || fileno(to) < 0) return;
    std::fflush(to);
    if (FILE* g = open_guarded_output(fileno(to), own_fd)) f = g, owned = true;
    if (owned) dist::set_before_abort(&abandon_blocked_output);
  }
  ~Output() {
    if (!owned) return;
    dist::set_before_abort(nullptr);
    // A hook that throws (a save that meets a full disk) leaves the progress bar drawn on f: erased
    // now, so that the error printed next neither lands on it nor writes to a closed stream.
    clear_status_line();
    std::fclose(f);
  }
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;
};

// The opening lines: what runs where, and the launcher's warning (run/stop.h). `c` is the
// trainer's configuration, with model.remat = auto resolved (its minibatch count among it).
void print_start(const OpenedRun& run, const Config& c, const Backend& be, int ranks, FILE* out) {
  fmt::print(out, "loom train: {} ({}), device {} ({} threads), dtype {}, batch {} in {}{} minibatch{}{}\n", c.source,
             choice_name(c.model.kind), be.name(), num_threads(), dtype_name(c.model.dtype), c.data.batch_size,
             ranks == 1 ? "" : fmt::format("{} ranks × ", ranks), c.optimizer.num_minibatches,
             c.optimizer.num_minibatches == 1 ? "" : "es",
             run.dir.empty() ? "" : ", run directory " + run.dir.string());
  if (!run.dir.empty()) fmt::print(out, "{}", launcher_warning(env));
}

// The model's parameters are counted from its graph: the plan's parameter bytes are this rank's
// (none of them under optimizer.shard = params, where they live in the trainer's chunks) and in
// the parameters' dtypes.
void print_program(const Trainer& t, FILE* out) {
  const MemoryPlan& p = t.plan();
  fmt::print(out, "program: {} nodes, {} parameters, activation arena {:.2f} MiB (live-bytes lower bound {:.2f} MiB)\n",
             p.schedule.size(), nn::count_params(t.model().graph), p.arena_bytes / 1048576.0,
             p.lower_bound_bytes / 1048576.0);
}

// The loop's hooks in the order given, leaving out those the run does not have (nullptr).
std::vector<StepHook*> present(std::initializer_list<StepHook*> hooks) {
  std::vector<StepHook*> v;
  for (StepHook* h : hooks)
    if (h) v.push_back(h);
  return v;
}

// What the run reached and what it cost (run/summary.h). Part 1.1's accumulation experiment
// first prints the tutorial's print_metrics block, named by its minibatch count (the run's
// average, as the tutorial prints it).
void print_summary(const LoopResult& res, const Trainer& t, const ValidationRecord& val, double wall_s, double eval_s,
                   double save_s, FILE* out) {
  const Config& c = t.config();
  const bool lm = nn::model_kind(c.model.kind).language_model;
  if (!lm && !res.total.empty())
    fmt::print(out, "{}", format_metrics(res.total, fmt::format("Minibatch {}", c.optimizer.num_minibatches)));
  if (res.steps_run > 0)
    fmt::print(out, "{}",
               format_run_summary({.first_step = t.steps_done() - res.steps_run + 1,
                                   .last_step = t.steps_done(),
                                   .total_steps = c.train.steps,
                                   .last_loss = res.last.metrics.loss.mean(),
                                   .last_val = val.last,
                                   .best_val = val.best,
                                   .last_val_step = val.last_step,
                                   .best_val_step = val.best_step,
                                   .run_trained = res.run_trained,
                                   .session_trained = res.trained,
                                   .tokens = lm,
                                   .wall_s = wall_s,
                                   .step_s = res.step_seconds,
                                   .eval_s = eval_s,
                                   .save_s = save_s}));
  if (t.optimizer().scaler().enabled)
    fmt::print(out, "float16 loss scale {:g}, {} skipped step(s)\n", t.optimizer().scaler().scale,
               t.optimizer().scaler().skipped);
}

}  // namespace

int run_train(const RunOptions& o) {
  const auto started = std::chrono::steady_clock::now();
  // Data parallelism (train/trainer.h): every rank reads the configuration, the data and a resumed
  // checkpoint itself, trains and evaluates its share; rank 0 alone prints and owns the run
  // directory (its lock, checkpoints, metrics).
  dist::Comm& comm = dist::world();
  const bool writer = comm.rank() == 0;
  const std::string launcher = launcher_prefix(env);
  StopSignals stop(comm, !launcher.empty());  // first: every thread made after it leaves the signals to it
  const Output output(writer ? o.out : nullptr, !launcher.empty());
  FILE* const out = output.f;

  // 1. The run directory: opened or resumed, locked; nothing on disk changes before all is valid.
  OpenedRun run = open_run(o, comm, out);
  const Config& c = run.config;
  set_num_threads(static_cast<int>(c.threads));
  auto be = make_backend(c.device);

  // 2. The trainer, on the heap so that it can go before the closing sample, which loads the
  // checkpoint into programs of its own: the run's peak stays the training's (`loom memory`).
  DataSource data(c.data, data_context(c));
  const bool evaluates = Evaluator::during_training(c) && data.has_val();
  auto trainer = std::make_unique<Trainer>(c, *be, PlanOptions{}, &comm, evaluates);
  Trainer& t = *trainer;
  print_start(run, t.config(), *be, comm.size(), out);
  print_program(t, out);
  const std::string config_text = config_to_toml(c);
  start_run(run, t, data, o.overwrite, config_text, out);
  MetricsLog metrics(run.metrics_file, c.train.tensorboard && writer ? run.dir.string() : "");
  if (metrics.tensorboard()) fmt::print(out, "TensorBoard events: {}\n", metrics.tensorboard()->path());

  // 3. The loop and its hooks, in the order they run at each step.
  const ValidationRecord so_far = validation_so_far(run.ckpt, run.dir);
  CheckpointHook checkpoints(t, data, run.dir.string(), config_text, checkpoint_cadence(c.train, evaluates),
                             run.resumed() ? t.steps_done() : -1, so_far.best);
  auto profiler = make_train_profiler(t, o.profile_dir, o.profile_steps, out);
  auto eval =
      evaluates ? std::make_unique<EvaluationHook>(t, *be, data, checkpoints, metrics, so_far, started, out) : nullptr;
  const LoopOptions lo{.steps = c.train.steps,
                       .log_every = c.train.log_every,
                       .metrics = &metrics,
                       // Open MPI gives every rank a terminal of its own, whatever mpirun's output is
                       // (a log file): with several ranks the step lines are plain, as torchrun's are.
                       .progress_bar = o.progress_bar && writer && comm.size() == 1,
                       .out = out,
                       .hooks = present({profiler.get(), eval.get(), &checkpoints, &stop}),
                       // MFU on the log lines: model FLOPs against the cached matmul ceiling (report/ceiling.h).
                       .model_flops_per_step = step_flops(t).model,
                       .ceiling_flops_per_s = writer ? matmul_ceiling_flops(*be, c.model.dtype, out) : 0};
  stop.arm();
  const LoopResult res = run_training(t, data, lo);
  // A signal after the last step's agreement (whose checkpoint, due at the last step, is saved)
  // still ends the run as the signal asks. Stopped, the handler stays armed: a late copy of the
  // signal must not cut the save short.
  const int late = res.end == LoopEnd::stopped ? 0 : stop.disarm();
  if (profiler) profiler->finish();

  // 4. The report.
  if (res.end == LoopEnd::diverged) throw diverged_error(res.why, run.dir.string(), c.source, checkpoints.saved_step());
  if (res.end == LoopEnd::stopped || late != 0) {
    const int sig = late != 0 ? late : stop.signal();
    if (late == 0) checkpoints.save_current();
    if (!writer) return 128 + sig;
    // The closing line where no reader can lose it (run/stop.h).
    const std::string line = stop_message(sig, t.steps_done(), c.train.steps, run.dir.string(), launcher);
    if (run.rd) run.rd->write_stop_note(line);
    print_closing_line(line, o.out, out, !launcher.empty());
    return 128 + sig;
  }
  print_summary(res, t, eval ? eval->record() : so_far, seconds_since(started), eval ? eval->seconds() : 0,
                checkpoints.seconds(), out);
  if (c.train.sample_tokens > 0 && !run.dir.empty() && data.tokenizer_json() && writer) {
    profiler.reset();  // each holds the trainer
    eval.reset();
    trainer.reset();
    closing_sample(run.dir.string(), c.train.sample_tokens, c.seed, out);
  }
  return 0;
}

}  // namespace loom
