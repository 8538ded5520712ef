#include "run/stop.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

#include "train/console.h"

namespace loom {

std::string launcher_prefix(const char* (*getenv_fn)(const char*)) {
  const char* np = getenv_fn("OMPI_COMM_WORLD_SIZE");
  return np ? fmt::format("mpirun -np {} ", np) : "";
}

std::string launcher_warning(const char* (*getenv_fn)(const char*)) {
  if (!getenv_fn("OMPI_COMM_WORLD_SIZE") || getenv_fn("OMPI_MCA_odls_base_sigkill_timeout")) return "";
  return "warning: mpirun kills the ranks 1 s after it passes on a Ctrl-C, SIGTERM or SIGHUP, which can cut the "
         "final checkpoint short; start the job with `mpirun --mca odls_base_sigkill_timeout 30 ...` (README, "
         "\"More than one process or machine\")\n";
}

std::string stop_message(int sig, int64_t step, int64_t steps, const std::string& run_dir,
                         const std::string& launcher) {
  const char* what = sig == SIGTERM && !launcher.empty()
                         ? "terminated (SIGTERM, which mpirun sends every rank for a Ctrl-C, SIGTERM or SIGHUP alike)"
                     : sig == SIGINT ? "interrupted (Ctrl-C)"
                     : sig == SIGHUP ? "hung up (SIGHUP: the terminal or session closed)"
                                     : "terminated (SIGTERM)";
  return fmt::format(
      "{} at step {}/{}{}\n", what, step, steps,
      run_dir.empty() ? " (no run directory: nothing saved)"
                      : fmt::format(": checkpoint saved; continue with `{}loom train --resume {}`", launcher, run_dir));
}

void write_without_waiting(int fd, std::string_view text) {
  struct stat st = {};
  if (::fstat(fd, &st) != 0) return;
  int to = fd;
  if (!S_ISREG(st.st_mode)) {
    // A new open file description of the same pipe or terminal: O_NONBLOCK on it is its own.
    to = ::open(fmt::format("/proc/self/fd/{}", fd).c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (to < 0) return;  // a socket cannot be reopened: better nothing than a wait
  }
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(to, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  if (to != fd) ::close(to);
}

bool closing_line_on_out(FILE* out, bool under_launcher) {
  if (under_launcher || !out || fileno(out) < 0) return false;
  struct stat a = {}, b = {};
  if (::fstat(fileno(out), &a) != 0 || ::fstat(STDERR_FILENO, &b) != 0) return true;
  return a.st_dev != b.st_dev || a.st_ino != b.st_ino;
}

void print_closing_line(const std::string& line, FILE* requested_out, FILE* out, bool under_launcher) {
  if (closing_line_on_out(requested_out, under_launcher)) fmt::print(out, "{}", line);
  std::fflush(out);
  write_without_waiting(STDERR_FILENO, line);
}

StopSignals::StopSignals(dist::Comm& comm, bool under_launcher) : comm_(comm), under_launcher_(under_launcher) {
  sigemptyset(&set_);
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set_, sig);
  pthread_sigmask(SIG_BLOCK, &set_, &old_);
  thread_ = std::thread([this] {
    const timespec tick{.tv_sec = 0, .tv_nsec = 50'000'000};  // how long the destructor's join may wait
    while (!done_) {
      const int sig = sigtimedwait(&set_, nullptr, &tick);
      if (sig <= 0) continue;
      std::lock_guard<std::mutex> lock(mutex_);
      if (!armed_) _exit(128 + sig);
      if (received_ != 0) {
        if (under_launcher_) continue;  // the launcher repeats itself, and enforces its own deadline
        static constexpr char msg[] =
            "\nloom: a second stop signal: exiting at once; the checkpoints already saved are intact (a save in "
            "progress is discarded)\n";
        [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
        _exit(128 + received_);
      }
      abandon_blocked_output();
      received_ = sig;
    }
  });
}

int StopSignals::disarm() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;
  return received_;
}

StopSignals::~StopSignals() {
  done_ = true;
  thread_.join();
  pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

bool StopSignals::stop_requested() {
  const int mine = received_;
  std::vector<int> all(static_cast<size_t>(comm_.size()));
  comm_.all_gather_bytes(&mine, sizeof mine, all.data());
  for (const int code : all) {
    if (code == 0) continue;
    agreed_ = code;
    return true;
  }
  return false;
}

}  // namespace loom
