// The pieces a run is made of, each on its own: the cadence of evaluations and checkpoints
// (run/cadence.h), the checkpoint hook (run/checkpoints.h), how a diverged run ends
// (run/divergence.h), the stop message and its launcher (run/stop.h), and output that a stop
// signal never waits on (train/console.h).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <sys/ioctl.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <thread>

#include "backend/registry.h"
#include "data/data.h"
#include "run/cadence.h"
#include "run/checkpoints.h"
#include "run/divergence.h"
#include "run/stop.h"
#include "train/config.h"
#include "train/console.h"
#include "train/loop.h"
#include "train/trainer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

// Against counting by hand: every step of (step, steps] that is a multiple of `every` or the last.
TEST(Cadence, DueStepsAndWhatIsLeftAgreeWithCounting) {
  for (int64_t steps : {1, 7, 12}) {
    for (int64_t every : {0, 1, 3, 4, 12, 20}) {
      const Cadence c{every, steps};
      for (int64_t step = 0; step <= steps; ++step) {
        int64_t left = 0;
        for (int64_t s = step + 1; s <= steps; ++s) left += (every > 0 && s % every == 0) || s == steps;
        EXPECT_EQ(c.left_after(step), left) << "every " << every << " steps " << steps << " after " << step;
      }
      EXPECT_TRUE(c.due(steps));
      if (every > 0 && every < steps) {
        EXPECT_TRUE(c.due(every));
      }
      if (steps > 1) {
        EXPECT_EQ(c.due(1), every == 1);
      }
    }
  }
}

TEST(Divergence, SaysWhatIsKeptAndHowToGoOn) {
  const auto kept = diverged_error("the loss is not finite at step 9", "runs/x", "x.toml", 8);
  EXPECT_STREQ(kept.what(),
               "runs/x: training diverged: the loss is not finite at step 9; the last checkpoint, step 8, "
               "is intact");
  EXPECT_NE(kept.hint().find("loom train --resume runs/x"), std::string::npos) << kept.hint();
  const auto none = diverged_error("w", "runs/x", "x.toml", -1);
  EXPECT_NE(std::string(none.what()).find("no checkpoint was written before it"), std::string::npos);
  EXPECT_EQ(none.hint().find("--resume"), std::string::npos) << none.hint();
  const auto nodir = diverged_error("w", "", "x.toml", 3);
  EXPECT_EQ(std::string(nodir.what()).rfind("x.toml: ", 0), 0u) << nodir.what();
  EXPECT_NE(std::string(nodir.what()).find("nothing was saved"), std::string::npos);
}

// A fake environment for the launcher's variables.
std::map<std::string, std::string> g_env;
const char* fake_env(const char* name) {
  const auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}

TEST(Stop, TheMessageNamesTheSignalAndTheResumeCommandWithItsLauncher) {
  g_env = {};
  EXPECT_EQ(launcher_prefix(fake_env), "");
  EXPECT_EQ(launcher_warning(fake_env), "") << "no launcher, no kill delay to warn of";
  g_env = {{"OMPI_COMM_WORLD_SIZE", "3"}};
  EXPECT_EQ(launcher_prefix(fake_env), "mpirun -np 3 ");
  EXPECT_NE(launcher_warning(fake_env).find("--mca odls_base_sigkill_timeout 30"), std::string::npos);
  g_env["OMPI_MCA_odls_base_sigkill_timeout"] = "30";
  EXPECT_EQ(launcher_warning(fake_env), "");

  EXPECT_EQ(stop_message(SIGINT, 12, 100, "runs/x", ""),
            "interrupted (Ctrl-C) at step 12/100: checkpoint saved; continue with `loom train --resume runs/x`\n");
  EXPECT_EQ(stop_message(SIGTERM, 12, 100, "runs/x", ""),
            "terminated (SIGTERM) at step 12/100: checkpoint saved; continue with `loom train --resume runs/x`\n");
  const std::string mpi = stop_message(SIGTERM, 12, 100, "runs/x", "mpirun -np 3 ");
  EXPECT_EQ(mpi.rfind("terminated (SIGTERM, which mpirun sends", 0), 0u) << mpi;
  EXPECT_NE(mpi.find("continue with `mpirun -np 3 loom train --resume runs/x`\n"), std::string::npos) << mpi;
  EXPECT_EQ(stop_message(SIGHUP, 1, 2, "", "").rfind("hung up (SIGHUP", 0), 0u);
  EXPECT_NE(stop_message(SIGHUP, 1, 2, "", "").find("nothing saved"), std::string::npos);
  EXPECT_EQ(stop_message(SIGINT, 1, 2, "r", "mpirun -np 2 ").rfind("interrupted (Ctrl-C)", 0), 0u);
}

// A signal that comes after the loop's last look (between the last step and the end of the
// loop) is not swallowed: disarming returns it, and the run ends as it asks.
// In a child process: a stop signal abandons blocked output for the whole process.
TEST(Stop, ASignalAfterTheLastStepIsReturnedWhenDisarming) {
  const pid_t child = fork();
  if (child == 0) {
    StopSignals stop(dist::single_process(), false);
    stop.arm();
    if (stop.stop_requested()) _exit(1);
    kill(getpid(), SIGTERM);  // blocked here: the watcher thread takes it
    for (int i = 0; i < 2000 && !stop.stop_requested(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    _exit(stop.disarm() == SIGTERM ? 0 : 2);
  }
  int st = 0;
  ASSERT_EQ(waitpid(child, &st, 0), child);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
}

// A pipe nobody reads: a write waits for the reader until a stop abandons it, then returns
// having dropped what did not fit. (A stream that kept waiting hangs this test.)
TEST(GuardedOutput, AStopSignalUnblocksAWriteNobodyReads) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::FILE* f = open_guarded_output(fds[1]);
  ASSERT_NE(f, nullptr);
  const std::string line(1000, 'x');
  std::atomic<bool> returned{false};
  std::thread writer([&] {
    for (int i = 0; i < 1000; ++i) std::fprintf(f, "%s\n", line.c_str());  // 1 MB into a 64 KiB pipe
    std::fflush(f);
    returned = true;
  });
  // It is blocked: the pipe fills and stays full.
  while (true) {
    int queued = 0;
    ASSERT_EQ(ioctl(fds[0], FIONREAD, &queued), 0);
    if (queued >= 60000) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(returned) << "the writer did not wait for the reader";
  abandon_blocked_output();
  writer.join();
  EXPECT_TRUE(returned);
  // What was written is whole lines' bytes from the start: nothing interleaved or reordered.
  char buf[4096];
  const ssize_t n = read(fds[0], buf, sizeof buf);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, 1000), line);
  std::fclose(f);
  close(fds[0]);
  close(fds[1]);
}

// ckpt_<step>/ at the cadence and at the last step, best/ on request, and a stop between cadence
// points saves the step it stopped at (once).
TEST(CheckpointHook, SavesAtItsCadenceAndWhenAskedToStop) {
  const fs::path dir = fs::temp_directory_path() / ("loom_test_hooks_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const Config c =
      default_config({"model.hidden_size=16", "data.batch_size=8", "data.num_inputs=4", "train.keep_last=100"});
  auto be = make_backend(Device::cpu);
  Trainer t(c, *be);
  const DataSource data(c.data, data_context(c));
  CheckpointHook ck(t, data, dir.string(), config_to_toml(c), Cadence{3, 7}, -1, -1);
  LoopOptions o;
  o.steps = 5;
  o.out = std::tmpfile();
  o.hooks = {&ck};
  run_training(t, data, o);
  EXPECT_TRUE(fs::exists(dir / "ckpt_000003"));
  EXPECT_FALSE(fs::exists(dir / "ckpt_000005")) << "5 is neither a multiple of 3 nor the last of 7";
  EXPECT_EQ(ck.saved_step(), 3);
  ck.save_current();  // a stop after step 5
  EXPECT_TRUE(fs::exists(dir / "ckpt_000005"));
  EXPECT_EQ(ck.saved_step(), 5);
  ck.save_best(1.5);
  EXPECT_TRUE(fs::exists(dir / "best"));
  EXPECT_EQ(ck.saved_step(), 5) << "best/ is not the run's latest checkpoint";
  o.steps = 7;
  run_training(t, data, o);
  EXPECT_TRUE(fs::exists(dir / "ckpt_000006"));
  EXPECT_TRUE(fs::exists(dir / "ckpt_000007")) << "the last step is always saved";
  std::fclose(o.out);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom
