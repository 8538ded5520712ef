// Profiling a training run (docs/profiling.md): what `loom profile` and `loom train --profile` do.
//
// The profiled steps run with an OpRecorder on the trainer (runtime/recorder.h): the step marks
// train_step / minibatch / optimizer spans and the executor times every node. Afterwards the
// recording is written to DIR:
//   trace.json    Chrome Trace Event format (Perfetto, chrome://tracing): spans and ops, the memory
//                 counter tracks (runtime/profiler.h)
//   summary.json  median step time, time per phase, top ops, GFLOP/s and GB/s per op kind, the
//                 step's FLOP/s as a fraction of the measured matmul ceiling (also printed)
//   memory.html   the memory viewer of the plan (report/memory_html.h)
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "data/data.h"
#include "runtime/profiler.h"
#include "runtime/recorder.h"
#include "train/loop.h"
#include "train/trainer.h"

namespace loom {

struct ProfileOptions {
  int64_t steps = 3;            // profiled steps
  int64_t warmup = 1;           // steps run first and not recorded (page faults, BLAS buffers, caches)
  std::string out_dir;          // created if missing
  bool measure_ceiling = true;  // time the backend's matmul ceiling once (about a second)
  FILE* log = stdout;           // progress and the summary; nullptr = quiet
};

// The machine's other load while the profiled steps ran: the whole machine's busy CPU time
// (/proc/stat) minus this process's own (/proc/self/stat), in CPUs; for a window too short for
// those clock ticks (under 50 ms), the 1-minute load average less loom's threads. Step times taken while other
// processes competed for loom's cores measure the contention, not loom, so the summary says so.
struct MachineLoad {
  bool measured = false;      // /proc was readable
  double other_cpus = 0;      // mean CPUs busy with other processes during the window
  int cpus = 0;               // online CPUs
  int threads = 0;            // loom's threads
  double loadavg = 0;         // /proc/loadavg's 1-minute figure at the end
  bool from_loadavg = false;  // other_cpus is the load average's estimate (a short window)
  // Other work took cores loom's threads needed: more than a quarter CPU of it, and not enough
  // idle cores for both.
  bool contended() const { return measured && other_cpus > 0.25 && other_cpus + threads > cpus + 0.1; }
};
// Start() before the window, stop() after it.
class LoadSampler {
 public:
  void start();
  MachineLoad stop() const;

 private:
  double busy_ = 0, total_ = 0, own_ = 0;
  bool ok_ = false;
};
// One line: "machine load during the profile: 0.1 CPUs of 16 busy with other processes ..." and,
// when contended, a warning saying which figures not to trust.
std::string format_machine_load(const MachineLoad& l);

struct ProfileOutput {
  ProfileSummary summary;
  MachineLoad load;
  std::string trace_path, summary_path, html_path;
};

// `loom profile`: builds a trainer for `c` on `be`, runs the warm-up steps, records the profiled
// steps (step k trains on data.train_batch(k), made before the step's span opens) and writes
// DIR/{trace.json, summary.json, memory.html}.
ProfileOutput run_profile(const Config& c, Backend& be, const DataSource& data, const ProfileOptions& o);

// Writes the three files of a finished recording of `t`'s steps (the recorder must be detached or
// idle) and prints the summary to `log` (when set). Measures the matmul ceiling when asked. The
// trace's time 0 is `origin_us` (the recorder's clock; < 0: the first event).
//
// Under data parallelism every rank calls it (it gathers): rank r writes DIR/rank<r>/ (its trace
// as process r + 1, "loom rank r"), and rank 0 also DIR/trace.json, every rank's trace in one
// file, their clocks aligned at `origin_us`, which each rank takes right after a common barrier.
ProfileOutput write_profile(const Trainer& t, const OpRecorder& rec, const std::string& out_dir, bool measure_ceiling,
                            FILE* log, const MachineLoad& load = {}, double origin_us = -1);

// A preallocated recorder big enough for `steps` steps of `t` (every node of every minibatch).
std::unique_ptr<OpRecorder> make_step_recorder(const Trainer& t, int64_t steps);

// `--profile-steps a:b`: steps a..b, 1-based and inclusive, numbered as the training log numbers
// them ("3:5" = steps 3, 4, 5; "4" = step 4 only). Throws UserError naming the flag.
struct StepWindow {
  int64_t first = 2, last = 4;
};
StepWindow parse_step_window(const std::string& text);

// `loom train --profile DIR`: records a window of a real run, as a hook of the training loop
// (LoopOptions::hooks, called with each step's 1-based number); call finish() after the loop; the files are written once the window's last step ran (or at finish() when the
// run was shorter).
class TrainProfiler : public StepHook {
 public:
  TrainProfiler(Trainer& t, std::string out_dir, StepWindow w, FILE* log = stdout);
  ~TrainProfiler();
  TrainProfiler(const TrainProfiler&) = delete;
  TrainProfiler& operator=(const TrainProfiler&) = delete;
  void before_step(int64_t step) override;
  void after_step(int64_t step) override;
  void finish();
  bool written() const { return written_; }

 private:
  Trainer& t_;
  std::string dir_;
  StepWindow w_;
  FILE* log_;
  std::unique_ptr<OpRecorder> rec_;
  LoadSampler load_;
  double origin_us_ = -1;
  bool written_ = false;
};

// `loom train --profile DIR --profile-steps a:b`: when `dir` is set, a TrainProfiler for the window
// (`window` "" = 2:4, leaving step 1 as warm-up). nullptr when `dir` is empty.
std::unique_ptr<TrainProfiler> make_train_profiler(Trainer& t, const std::string& dir, const std::string& window,
                                                   FILE* log);

// `loom profile --overhead N`: the recorder's cost. After `warmup` steps, runs N pairs of steps,
// alternating recording off and on (so load drifts hit both alike), and returns both medians.
struct OverheadResult {
  double off_ms = 0, on_ms = 0;
  double overhead() const { return off_ms > 0 ? on_ms / off_ms - 1 : 0; }
};
OverheadResult measure_overhead(const Config& c, Backend& be, const DataSource& data, int64_t pairs, int64_t warmup);

// `loom profile`: loads nothing itself; sets threads and the backend from `c`, then run_profile.
struct ProfileCommand {
  int64_t steps = 3, warmup = 1;
  std::string out_dir = "profile";
  bool no_ceiling = false;
  int64_t overhead_pairs = 0;  // > 0: measure the recorder's overhead instead of profiling
};
int profile_command(Config c, const ProfileCommand& cmd);

// Bytes of the optimizer's moments (what the "memory" counter adds besides params and grads).
int64_t optimizer_state_bytes(const Trainer& t);

}  // namespace loom
