// Stopping an mpirun job saves it (run/stop.h): Ctrl-C, SIGTERM and SIGHUP sent to mpirun itself,
// at random instants after the loop got going, finish the step on every rank, save one
// checkpoint (Open MPI passes each of them on to every rank as a SIGTERM, and exits 1 itself);
// continuing the stopped job gives what an uninterrupted one gives. mpirun runs with the kill
// delay the README asks for (odls_base_sigkill_timeout; 5 s here, the README says 30): on a loaded
// machine a step alone can take longer than Open MPI's default second. With it, Open MPI 4.1 no
// longer forwards the ranks' output by the time they stop: the closing line is checked where it
// always is, in the run directory (loom-stopped.txt). A round lasts about twice the delay, as
// mpirun waits it out before passing the signal on and again before it exits. Three rounds, one
// per signal; LOOM_STOP_MPI_ROUNDS=N runs N (a longer stress run by hand).
// In tests/dist (ctest label dist) as it runs mpirun: the sanitizer build runs that label without
// leak detection (scripts/test.sh), since Open MPI's plugins leave start-up allocations behind.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "io/safetensors.h"
#include "support/run_fixture.h"

namespace {

using namespace loom::testing;

bool have_mpirun() { return std::system("command -v mpirun > /dev/null 2>&1") == 0; }

size_t lines(const fs::path& p) {
  std::ifstream f(p);
  size_t n = 0;
  for (std::string line; std::getline(f, line);) n += !line.empty();
  return n;
}

int64_t last_step(const fs::path& metrics) {
  int64_t step = 0;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) step = nlohmann::json::parse(line)["step"].get<int64_t>();
  return step;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

std::string read(const fs::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), {}};
}

// mpirun itself (its pid is the one returned) with two ranks of `loom args`, as a user starts it.
pid_t spawn_job(const std::string& args, const fs::path& log) {
  const std::string loom = LOOM_BINARY;
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    const std::string cmd = "exec mpirun --oversubscribe --allow-run-as-root --mca odls_base_sigkill_timeout 5 -np 2 " + loom + " " + args;
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

void expect_same_params(const fs::path& a, const fs::path& b) {
  const auto x = loom::read_safetensors((a / "model.safetensors").string());
  const auto y = loom::read_safetensors((b / "model.safetensors").string());
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(x[i].bytes == y[i].bytes) << x[i].name;
}

std::string fmt_ckpt(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ckpt_%06lld", static_cast<long long>(step));
  return buf;
}

TEST(StopMpi, SignalsToMpirunAtRandomInstantsSaveAndResumeLikeAnUninterruptedJob) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (openmpi-bin)";
  const fs::path out = scratch("mpi_stop"), straight = scratch("mpi_straight"), status = scratch("mpi_status");
  const std::string cfg = " threads=1 train.eval_interval=0 train.checkpoint_interval=4 train.keep_last=2";
  std::mt19937 rng(29);
  std::uniform_int_distribution<int> delay_ms(0, 300);
  const int signals[] = {SIGINT, SIGTERM, SIGHUP};
  const char* rounds_env = std::getenv("LOOM_STOP_MPI_ROUNDS");
  const int rounds = rounds_env ? std::atoi(rounds_env) : 3;
  for (int i = 0; i < rounds; ++i) {
    const int sig = signals[i % 3];
    const size_t before = lines(out / "metrics.jsonl");
    const std::string args =
        i == 0 ? "train " + fixture().config.string() + " --out " + out.string() + cfg + " train.steps=100000"
               : "train --resume " + out.string() + cfg + " train.steps=100000";
    const fs::path log = status / "job.log";
    const pid_t pid = spawn_job(args, log);
    // The loop got past start-up: two more steps logged than before (a hang guard of two minutes).
    for (int w = 0; w < 12000 && lines(out / "metrics.jsonl") < before + 2; ++w)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_GE(lines(out / "metrics.jsonl"), before + 2) << "round " << i << ": " << read(log);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    kill(pid, sig);
    int st = 0;
    waitpid(pid, &st, 0);
    std::string text = read(log);
    EXPECT_EQ(text.find("warning: mpirun kills"), std::string::npos) << "the kill delay is given: no warning";
    // Open MPI 4's mpirun exits 1 when it was signalled, whatever its ranks returned.
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << "round " << i << " (signal " << sig << ")";
    text = text.substr(text.size() > 2000 ? text.size() - 2000 : 0);  // the failure messages show the end
    EXPECT_LE(count(text, "continue with `mpirun -np 2 loom train --resume "), 1u) << "rank 0 alone: " << text;
    const int64_t n = last_step(out / "metrics.jsonl");  // the step every rank stopped after
    EXPECT_TRUE(fs::exists(out / fmt_ckpt(n))) << "round " << i << ": " << text;
    // mpirun no longer forwards the ranks' output by then: the closing line is in the run directory.
    const std::string note = read(out / "loom-stopped.txt");
    EXPECT_EQ(note.rfind("terminated (SIGTERM, which mpirun sends every rank", 0), 0u) << "round " << i << ": " << note;
    EXPECT_NE(note.find(" at step " + std::to_string(n) +
                        "/100000: checkpoint saved; continue with `mpirun -np 2 "
                        "loom train --resume " +
                        out.string() + "`\n"),
              std::string::npos)
        << "round " << i << ": " << note;
  }
  // Continuing the stopped job gives what an uninterrupted one gives.
  const int64_t n = last_step(out / "metrics.jsonl");
  const std::string to = " train.steps=" + std::to_string(n + 2);
  const std::string mpi = "mpirun --oversubscribe --allow-run-as-root -np 2 " + std::string(LOOM_BINARY);
  ASSERT_EQ(std::system((mpi + " train --resume " + out.string() + cfg + to + " > /dev/null 2>&1").c_str()), 0);
  ASSERT_EQ(std::system((mpi + " train " + fixture().config.string() + " --out " + straight.string() + cfg + to +
                         " > /dev/null 2>&1")
                            .c_str()),
            0);
  expect_same_params(out / fmt_ckpt(n + 2), straight / fmt_ckpt(n + 2));
}

}  // namespace
