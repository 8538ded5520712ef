// Stopping a run by signal, as a hook of the training loop (train/loop.h): Ctrl-C (SIGINT),
// SIGTERM and SIGHUP (a closed terminal, a dropped SSH session) finish the current step, save
// one checkpoint and end the run with 128 + the signal and one message naming the signal and
// the exact command that continues the run, its launcher included (`mpirun -np 2 loom train
// --resume R`).
//
// No thread that runs kernels ever handles these signals: oneDNN's JIT sgemm (Debian's 2.x;
// oneDNN issue 4845, fixed upstream in 2026) points rsp at a heap workspace while it runs, so a
// handler run on that thread pushes its signal frame onto the heap ("corrupted size vs.
// prev_size" aborts after Ctrl-C). They are blocked from the construction of StopSignals, before
// the first parallel region creates the OpenMP threads (which inherit the mask), and one watcher
// thread takes them. While armed (the loop runs), the first signal asks for a stop after the
// current step and abandons terminal output that would block (train/console.h), so nothing
// waits on a terminal nobody reads; a second one exits at once in a single process. Under a
// launcher a repeat is ignored: Open MPI turns Ctrl-C, SIGTERM and SIGHUP into a SIGTERM to every
// rank and enforces its own deadline with SIGKILL. Unarmed, a signal exits at once, as the default
// action would.
//
// Ranks receive a signal each at its own moment, so they agree over the communicator after every
// step: the loop stops after the first step at whose end any rank was signalled, on every rank.
#pragma once
#include <signal.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "dist/comm.h"
#include "train/loop.h"

namespace loom {

// How the job was started, from the launcher's environment: "" for a single process, else the
// prefix of the command that starts it the same way ("mpirun -np 4 ").
std::string launcher_prefix(const char* (*getenv_fn)(const char*));

// The one line a stopped run prints, e.g. "terminated (SIGTERM) at step 12/100: checkpoint saved;
// continue with `mpirun -np 2 loom train --resume runs/x`". `run_dir` "" = nothing was saved.
// Under mpirun the ranks only ever see a SIGTERM, whatever mpirun itself received: the message
// says so rather than guess.
std::string stop_message(int sig, int64_t step, int64_t steps, const std::string& run_dir, const std::string& launcher);

// Under Open MPI without a longer kill delay (odls_base_sigkill_timeout, in seconds; Open MPI's
// default of 1 s may cut a save short): the start-up warning naming the option, else "".
std::string launcher_warning(const char* (*getenv_fn)(const char*));

// Writes `text` to `fd` without ever waiting for its reader: what a pipe or terminal cannot take
// at once is dropped (a reopened, non-blocking description of it, so the flag is not shared with
// the shell's). A regular file takes it all.
void write_without_waiting(int fd, std::string_view text);

// Where a stopped run's closing line goes, so that no reader can lose it: into the run directory
// (RunDir::kStopNote, by the caller), on stderr without waiting, and on `out` as well when that
// is another file and no launcher forwards both to one terminal (one line, not two).
bool closing_line_on_out(FILE* out, bool under_launcher);

// Prints a stopped run's closing line on stderr without waiting and on `out` (the stream given
// as `requested_out`, guarded) when closing_line_on_out says so; the run directory's note is the
// caller's.
void print_closing_line(const std::string& line, FILE* requested_out, FILE* out, bool under_launcher);

class StopSignals : public StepHook {
 public:
  StopSignals(dist::Comm& comm, bool under_launcher);
  ~StopSignals() override;
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  void arm() { armed_ = true; }
  // From now on a signal exits at once. Returns the signal that came while armed, after the last
  // stop_requested() (0: none): the run must still end as that signal asks.
  int disarm();
  // The agreement: every rank's signal, gathered; true when any rank has one.
  bool stop_requested() override;
  // The signal that ended the loop (the first signalled rank's, in rank order), 0 when none.
  int signal() const { return agreed_; }

 private:
  dist::Comm& comm_;
  bool under_launcher_;
  sigset_t set_{}, old_{};
  std::mutex mutex_;  // a signal is either taken while armed or exits, never lost in between
  std::atomic<int> received_{0};
  int agreed_ = 0;
  bool armed_ = false;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace loom
