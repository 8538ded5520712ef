// A run directory that never loses work (run/run_dir.h, train/checkpoint.h): signals save and
// say how to resume, kills at any instant leave a loadable checkpoint, a second process is
// refused, divergence stops with the last good state, corrupted checkpoints are skipped by name,
// --overwrite validates first and deletes only loom's files, and resuming never destroys.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "backend/registry.h"
#include "io/safetensors.h"
#include "support/run_fixture.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"

namespace {

using namespace loom::testing;

// `loom ARGS` in the background, its output in `log`. Returns its pid.
pid_t spawn(const std::string& args, const fs::path& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string cmd = "exec " + std::string(LOOM_BINARY) + " " + args + " > " + log.string() + " 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Exit status of `pid` (128 + signal when killed by one).
int wait_status(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::string read(const fs::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), {}};
}

// Lines of metrics.jsonl (0 when missing).
size_t metric_lines(const fs::path& p) {
  std::ifstream f(p);
  size_t n = 0;
  for (std::string line; std::getline(f, line);) n += !line.empty();
  return n;
}

// Waits (up to two minutes, for a loaded machine) until the run has logged `n` lines.
void wait_for_lines(const fs::path& metrics, size_t n) {
  for (int i = 0; i < 12000 && metric_lines(metrics) < n; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GE(metric_lines(metrics), n) << metrics << " did not grow";
}

std::vector<int64_t> logged_steps(const fs::path& metrics) {
  std::vector<int64_t> out;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["step"].get<int64_t>());
  }
  return out;
}

std::string fmt_ckpt(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ckpt_%06lld", static_cast<long long>(step));
  return buf;
}

std::string train(const fs::path& out, const std::string& extra = {}) {
  return "train " + fixture().config.string() + " --out " + out.string() + " " + extra;
}

void expect_same_params(const fs::path& a, const fs::path& b) {
  const auto x = loom::read_safetensors((a / "model.safetensors").string());
  const auto y = loom::read_safetensors((b / "model.safetensors").string());
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(x[i].bytes == y[i].bytes) << x[i].name;
}

TEST(RunSafety, InterruptSavesAndResumesBitIdentically) {
  const fs::path out = scratch("sigint"), straight = scratch("sigint_straight");
  const pid_t pid = spawn(train(out, "train.steps=100000 train.eval_interval=0"), out.parent_path() / "sigint.log");
  wait_for_lines(out / "metrics.jsonl", 3);
  kill(pid, SIGINT);
  EXPECT_EQ(wait_status(pid), 130);
  const std::string log = read(out.parent_path() / "sigint.log");
  EXPECT_NE(log.find("interrupted (Ctrl-C) at step"), std::string::npos) << log;
  EXPECT_NE(log.find("loom train --resume " + out.string()), std::string::npos) << log;
  const std::vector<int64_t> steps = logged_steps(out / "metrics.jsonl");
  ASSERT_FALSE(steps.empty());
  const int64_t n = steps.back();
  ASSERT_TRUE(fs::exists(out / fmt_ckpt(n))) << log;
  // Continuing the interrupted run gives what an uninterrupted one gives.
  const std::string to = " train.steps=" + std::to_string(n + 3);
  Result r = run("train --resume " + out.string() + to);
  ASSERT_EQ(r.status, 0) << r.out;
  r = run(train(straight, "train.eval_interval=0" + to));
  ASSERT_EQ(r.status, 0) << r.out;
  expect_same_params(out / fmt_ckpt(n + 3), straight / fmt_ckpt(n + 3));
  EXPECT_EQ(logged_steps(out / "metrics.jsonl"), logged_steps(straight / "metrics.jsonl"));
}

TEST(RunSafety, TerminateExits143AndASecondSignalExitsAtOnce) {
  const fs::path out = scratch("sigterm");
  pid_t pid = spawn(train(out, "train.steps=100000"), out.parent_path() / "term.log");
  wait_for_lines(out / "metrics.jsonl", 2);
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_status(pid), 143) << read(out.parent_path() / "term.log");
  const size_t before = metric_lines(out / "metrics.jsonl");  // the resume keeps every one of these lines
  pid = spawn("train --resume " + out.string() + " train.steps=100000", out.parent_path() / "twice.log");
  wait_for_lines(out / "metrics.jsonl", before + 2);
  kill(pid, SIGINT);
  kill(pid, SIGINT);
  EXPECT_EQ(wait_status(pid), 130);
  // Whatever the second signal cut short, the run still resumes from an intact checkpoint.
  const Result r = run("train --resume " + out.string() + " train.steps=1");
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
}

// A closed terminal or a dropped SSH session (SIGHUP) stops a run as SIGTERM does: saved, 129.
TEST(RunSafety, HangUpSavesAndExits129) {
  const fs::path out = scratch("sighup");
  const pid_t pid = spawn(train(out, "train.steps=100000 train.eval_interval=0"), out.parent_path() / "hup.log");
  wait_for_lines(out / "metrics.jsonl", 2);
  kill(pid, SIGHUP);
  EXPECT_EQ(wait_status(pid), 129);
  const std::string log = read(out.parent_path() / "hup.log");
  EXPECT_NE(log.find("hung up (SIGHUP"), std::string::npos) << log;
  const std::vector<int64_t> steps = logged_steps(out / "metrics.jsonl");
  ASSERT_FALSE(steps.empty());
  EXPECT_TRUE(fs::exists(out / fmt_ckpt(steps.back()))) << log;
}

// A reader that stopped reading (stdout and stderr a full pipe nobody reads, as a paused SSH
// session) cannot lose the closing line: it is in the run directory, and removed once the run
// goes on.
TEST(RunSafety, TheClosingLineIsInTheRunDirectoryWhenNobodyReads) {
  const fs::path out = scratch("unread");
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    const std::string cmd = "exec " + std::string(LOOM_BINARY) + " " +
                            train(out, "train.steps=100000 train.eval_interval=0 train.log_every=1");
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  // Read while the run starts; then read no more, and fill what is left of the pipe.
  std::thread drain([&] {
    char buf[4096];
    while (metric_lines(out / "metrics.jsonl") < 2 && ::read(fds[0], buf, sizeof buf) > 0) {
    }
  });
  wait_for_lines(out / "metrics.jsonl", 2);
  drain.join();
  const int fill = open(("/proc/self/fd/" + std::to_string(fds[0])).c_str(), O_WRONLY | O_NONBLOCK);
  ASSERT_GE(fill, 0);
  const std::string block(4096, '.');
  while (write(fill, block.data(), block.size()) > 0) {
  }
  close(fill);
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_status(pid), 143);
  close(fds[0]);
  const std::string note = read(out / "loom-stopped.txt");
  EXPECT_EQ(note.rfind("terminated (SIGTERM) at step ", 0), 0u) << note;
  EXPECT_NE(note.find("continue with `loom train --resume " + out.string() + "`"), std::string::npos) << note;
  const std::vector<int64_t> steps = logged_steps(out / "metrics.jsonl");
  ASSERT_FALSE(steps.empty());
  EXPECT_NE(note.find(" at step " + std::to_string(steps.back()) + "/"), std::string::npos) << note;
  EXPECT_TRUE(fs::exists(out / fmt_ckpt(steps.back())));
  const Result r = run("train --resume " + out.string() + " train.steps=" + std::to_string(steps.back() + 1));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(fs::exists(out / "loom-stopped.txt")) << "the run went on";
}

// SIGINT and SIGTERM are taken by one watcher thread, never by a thread running kernels: oneDNN's
// JIT sgemm points rsp at the heap while it runs, and a handler on that thread corrupted the heap
// (run/run.cpp). So every thread of a training process blocks both but the watcher, whose
// sigtimedwait unblocks them while it waits.
TEST(RunSafety, NoKernelThreadHandlesTheStopSignals) {
  const fs::path out = scratch("sigmask");
  const pid_t pid = spawn(train(out, "train.steps=100000 train.eval_interval=0"), out.parent_path() / "mask.log");
  wait_for_lines(out / "metrics.jsonl", 2);
  int blocking = 0, taking = 0;
  for (const auto& task : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    std::ifstream status(task.path() / "status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("SigBlk:", 0) != 0) continue;
      const unsigned long long blocked = std::stoull(line.substr(7), nullptr, 16);
      const unsigned long long both = (1ull << (SIGINT - 1)) | (1ull << (SIGTERM - 1));
      ((blocked & both) == both ? blocking : taking) += 1;
    }
  }
  EXPECT_GE(blocking, 1) << "the main thread runs kernels";
  EXPECT_LE(taking, 1) << "only the watcher takes the signals";
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_status(pid), 143) << read(out.parent_path() / "mask.log");
}

TEST(RunSafety, KillsAtRandomInstantsLeaveALoadableCheckpoint) {
  const fs::path out = scratch("kills");
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> delay_ms(20, 400);
  const std::string args = " train.steps=100000 train.checkpoint_interval=1 train.keep_last=2 train.eval_interval=2";
  ASSERT_EQ(run(train(out, "train.steps=2 train.checkpoint_interval=1")).status, 0);
  // Odd kills wait for the process to log a step first (past start-up, where the saves are);
  // even ones may land in start-up. A kill counts as in training when a step was logged before it.
  int in_training = 0;
  const auto last_step = [&] {
    const std::vector<int64_t> steps = logged_steps(out / "metrics.jsonl");
    return steps.empty() ? int64_t{0} : steps.back();
  };
  for (int i = 0; i < 12; ++i) {
    const int64_t before = last_step();
    const pid_t pid = spawn("train --resume " + out.string() + args, out.parent_path() / "kill.log");
    if (i % 2) wait_for_lines(out / "metrics.jsonl", metric_lines(out / "metrics.jsonl") + 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    kill(pid, SIGKILL);
    wait_status(pid);
    in_training += last_step() > before;
  }
  EXPECT_GE(in_training, 6) << "the kills must land in training, not only in start-up";
  const Result r = run("train --resume " + out.string() + " train.steps=1");  // loads, verifies, exits
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("skipping a damaged checkpoint"), std::string::npos) << r.out;
  // best/ is always whole: it loads for sampling.
  if (fs::exists(out / "best")) {
    const Result s = run("sample " + (out / "best").string() + " --tokens 5 --prompt T");
    EXPECT_EQ(s.status, 0) << s.out;
  }
}

TEST(RunSafety, ASecondProcessIsRefusedWithTheHoldersPid) {
  const fs::path out = scratch("lock");
  const pid_t pid = spawn(train(out, "train.steps=100000"), out.parent_path() / "lock.log");
  wait_for_lines(out / "metrics.jsonl", 2);
  const auto before = read(out / "config.toml");
  for (const std::string& args : {"train --resume " + out.string(), train(out, "--overwrite"), train(out, "")}) {
    const Result r = run(args);
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_NE(r.out.find("in use by another loom process (pid " + std::to_string(pid) + ")"), std::string::npos)
        << r.out;
  }
  EXPECT_EQ(read(out / "config.toml"), before);
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_status(pid), 143);
}

TEST(RunSafety, Float32DivergenceStopsWithTheLastGoodCheckpoint) {
  const fs::path out = scratch("diverge32");
  const std::string huge = " optimizer.learning_rate=1e30 optimizer.schedule=constant train.checkpoint_interval=1";
  Result r = run(train(out, "train.eval_interval=0" + huge));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("training diverged"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("is intact"), std::string::npos) << r.out;
  // Every checkpoint left is finite and loads; none is from the diverged step.
  const auto cks = logged_steps(out / "metrics.jsonl");
  ASSERT_FALSE(cks.empty());
  r = run("train --resume " + out.string() + " train.steps=1");
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  // With on_nonfinite = skip the run goes on, counts the skipped steps, and stops after
  // max_skipped_steps in a row.
  const fs::path skip = scratch("diverge32_skip");
  r = run(train(skip, "train.eval_interval=0 train.on_nonfinite=skip train.max_skipped_steps=3" + huge));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("3 steps in a row were skipped"), std::string::npos) << r.out;
  std::ifstream f(skip / "metrics.jsonl");
  int64_t skipped = 0;
  for (std::string line; std::getline(f, line);) skipped = nlohmann::json::parse(line).value("skipped_steps", skipped);
  EXPECT_EQ(skipped, 3);
}

TEST(RunSafety, Float16DivergenceStops) {
  const fs::path out = scratch("diverge16");
  const Result r = run(train(out,
                             "model.dtype=float16 optimizer.learning_rate=1e30 optimizer.schedule=constant "
                             "train.checkpoint_interval=1 train.eval_interval=0"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("training diverged"), std::string::npos) << r.out;
}

// Flips a bit inside the last tensor's data of a safetensors file: its checksum fails.
void damage_last_tensor(const fs::path& file) {
  auto bytes = file_bytes(file);
  bytes[bytes.size() - 3] ^= 0x40;
  std::ofstream(file, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

TEST(RunSafety, CorruptedTensorBytesAreSkippedByName) {
  const fs::path out = scratch("corrupt_bytes");
  ASSERT_EQ(run(train(out, "train.steps=10 train.checkpoint_interval=5 train.eval_interval=0")).status, 0);
  damage_last_tensor(out / "ckpt_000010" / "model.safetensors");
  Result r = run("train --resume " + (out / "ckpt_000010").string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("fails its checksum"), std::string::npos) << r.out;
  r = run("train --resume " + out.string() + " train.steps=12");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("skipping a damaged checkpoint: ckpt_000010"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("at step 5"), std::string::npos) << r.out;
}

// Damage a checksum cannot see, a file gone or a header whose shape was rewritten (its bytes
// intact), is skipped as damage by name; resuming from the checkpoint itself names it.
TEST(RunSafety, AnIncompleteCheckpointIsSkippedByName) {
  const fs::path out = scratch("incomplete");
  ASSERT_EQ(run(train(out, "train.steps=4 train.checkpoint_interval=2 train.eval_interval=0")).status, 0);
  const fs::path no_moments = scratch("incomplete_moments"), reshaped = scratch("incomplete_shape");
  fs::copy(out, no_moments, fs::copy_options::recursive);
  fs::copy(out, reshaped, fs::copy_options::recursive);
  fs::remove(no_moments / "ckpt_000004" / "optimizer.safetensors");
  Result r = run("train --resume " + (no_moments / "ckpt_000004").string() + " --steps 6");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find((no_moments / "ckpt_000004" / "optimizer.safetensors").string() + ": is missing"),
            std::string::npos)
      << r.out;
  r = run("train --resume " + no_moments.string() + " --steps 6");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("skipping a damaged checkpoint: ckpt_000004: " +
                       (no_moments / "ckpt_000004" / "optimizer.safetensors").string() + ": is missing"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("at step 2"), std::string::npos) << r.out;
  // The embedding [vocab 20, hidden 32] said to be [32, 20]: the same bytes, another tensor.
  const fs::path model = reshaped / "ckpt_000004" / "model.safetensors";
  auto bytes = file_bytes(model);
  std::string text(bytes.begin(), bytes.end());
  const size_t at = text.find("[20,32]");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 7, "[32,20]");
  std::ofstream(model, std::ios::binary | std::ios::trunc) << text;
  r = run("train --resume " + reshaped.string() + " --steps 6");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("skipping a damaged checkpoint: ckpt_000004: " + model.string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("but its state.json's model makes it float32 [20, 32]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("at step 2"), std::string::npos) << r.out;
}

// model.init_from = RUN takes its newest checkpoint that verifies, as --resume does, says which and
// names each one it skipped.
TEST(RunSafety, InitFromARunSkipsADamagedCheckpointAndNamesTheOneLoaded) {
  const fs::path out = scratch("init_from_damaged");
  ASSERT_EQ(run(train(out, "train.steps=4 train.checkpoint_interval=2 train.eval_interval=0")).status, 0);
  damage_last_tensor(out / "ckpt_000004" / "model.safetensors");
  const std::string tune = " train.steps=1 train.eval_interval=0 model.init_from=";
  const fs::path from_run = scratch("init_from_run"), from_two = scratch("init_from_two");
  const Result r = run(train(from_run, tune + out.string()));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("parameters from the loom checkpoint " + (out / "ckpt_000002").string() +
                       " (skipping a damaged checkpoint: ckpt_000004: "),
            std::string::npos)
      << r.out;
  ASSERT_EQ(run(train(from_two, tune + (out / "ckpt_000002").string())).status, 0);
  EXPECT_EQ(logged_losses(from_run / "metrics.jsonl"), logged_losses(from_two / "metrics.jsonl"));
}

// loom sample and loom export of a run take its newest checkpoint that verifies, as --resume does,
// and name each one they skip; so do they and model.init_from when the newest checkpoint's
// state.json does not read (they take the configuration from it first).
TEST(RunSafety, SampleAndExportOfARunSkipADamagedCheckpointByName) {
  const fs::path out = scratch("sample_damaged");
  ASSERT_EQ(run(train(out, "train.steps=4 train.checkpoint_interval=2 train.eval_interval=0")).status, 0);
  const std::string two = (out / "ckpt_000002").string(), sample = " --tokens 4 --temperature 0 --prompt T";
  const Result older = run("sample " + two + sample);
  ASSERT_EQ(older.status, 0) << older.out;
  damage_last_tensor(out / "ckpt_000004" / "model.safetensors");
  Result r = run("sample " + out.string() + sample);
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string skipped = "skipping a damaged checkpoint: ckpt_000004: ";
  EXPECT_EQ(r.out.rfind("loom sample: " + skipped, 0), 0u) << r.out;
  EXPECT_EQ(r.out.substr(r.out.find('\n') + 1), older.out) << "the older checkpoint's sample";
  r = run("export hf " + out.string() + " " + (scratch("export_damaged") / "hf").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.rfind(skipped, 0), 0u) << r.out;
  EXPECT_NE(r.out.find("exported " + two + " as "), std::string::npos) << r.out;

  std::ofstream(out / "ckpt_000004" / "state.json", std::ios::trunc) << "{";
  r = run("sample " + out.string() + sample);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.rfind("loom sample: " + skipped + (out / "ckpt_000004" / "state.json").string(), 0), 0u) << r.out;
  r = run(train(scratch("init_from_bad_state"), " train.steps=1 train.eval_interval=0 model.init_from=" + out.string()));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("parameters from the loom checkpoint " + two + " (" + skipped), std::string::npos) << r.out;
}

TEST(RunSafety, OverwriteValidatesFirstAndDeletesOnlyLoomsFiles) {
  const fs::path out = scratch("overwrite");
  ASSERT_EQ(run(train(out, "train.steps=5")).status, 0);
  fs::create_directories(out / "ckpt_photos");
  std::ofstream(out / "ckpt_photos" / "cat.jpg") << "meow";
  std::ofstream(out / "notes.txt") << "mine";
  const auto metrics = read(out / "metrics.jsonl");
  // A mistake in the new run changes nothing of the old one.
  Result r = run(train(out, "train.steps=5 --overwrite data.dir=" + (out / "nowhere").string()));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(read(out / "metrics.jsonl"), metrics);
  EXPECT_TRUE(fs::exists(out / "ckpt_000005"));
  r = run(train(out, "train.steps=3 --overwrite"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(fs::exists(out / "ckpt_000005"));
  EXPECT_TRUE(fs::exists(out / "ckpt_000003"));
  EXPECT_EQ(read(out / "ckpt_photos" / "cat.jpg"), "meow");
  EXPECT_EQ(read(out / "notes.txt"), "mine");
  EXPECT_NE(read(out / "loom-run.json").find("run_id"), std::string::npos);
  // A mistake in a new run leaves no directory behind.
  r = run(train(out.parent_path() / "never_made", "data.dir=" + (out / "nowhere").string()));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_FALSE(fs::exists(out.parent_path() / "never_made"));
}

// A save never replaces what loom did not write under a checkpoint's name (put there while the run
// trains: a resume refuses one before it starts, RunDirOwner): it fails naming it, the entry stays
// as it was and nothing staged is left (by renameat2's exchange and, in
// run.safety_with_plain_rename, by plain renames).
TEST(RunSafety, ASaveNeverReplacesAUsersEntry) {
  auto be = loom::make_backend(loom::Device::cpu);
  const loom::Config c = loom::default_config(
      {"device=cpu", "data.kind=random_tokens", "data.batch_size=2", "data.seq_len=8", "data.vocab_size=12",
       "model.kind=transformer", "model.block_order=attn_first", "model.hidden_size=16", "model.head_dim=8",
       "model.num_layers=1", "model.vocab_size=12", "model.num_outputs=12", "model.max_seq_len=8"});
  const loom::Trainer t(c, *be);
  const fs::path out = scratch("users_entry"), mine = out / "ckpt_000004";
  for (const bool dir : {false, true}) {
    fs::remove_all(mine);
    if (dir) fs::create_directory(mine);
    std::ofstream(dir ? mine / "notes.txt" : mine) << "USERDATA\n";
    try {
      loom::save_checkpoint(t, loom::CheckpointState{.config_toml = loom::config_to_toml(c), .step = 4}, mine.string());
      ADD_FAILURE() << "saved over " << mine;
    } catch (const loom::UserError& e) {
      EXPECT_NE(std::string(e.what()).find(mine.string() + ": is not a checkpoint loom wrote"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(read(dir ? mine / "notes.txt" : mine), "USERDATA\n");
    for (const auto& e : fs::directory_iterator(out)) EXPECT_EQ(e.path(), mine) << "left behind";
  }
}

// Pruning (train.keep_last) removes loom's checkpoints only: a symbolic link named like one, even
// to a loom checkpoint, stays.
TEST(RunSafety, PruningLeavesASymbolicLinkAlone) {
  const fs::path out = scratch("prune_link"), elsewhere = scratch("prune_link_target");
  ASSERT_EQ(run(train(out, "train.steps=2 train.keep_last=1")).status, 0);
  fs::copy(out / "ckpt_000002", elsewhere / "ckpt", fs::copy_options::recursive);
  fs::create_directory_symlink(elsewhere / "ckpt", out / "ckpt_000001");
  const Result r = run("train --resume " + out.string() + " train.steps=4 train.keep_last=1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(fs::exists(out / "ckpt_000002")) << "pruned";
  EXPECT_TRUE(fs::is_symlink(out / "ckpt_000001"));
  EXPECT_TRUE(fs::exists(elsewhere / "ckpt" / "state.json"));
}

TEST(RunSafety, ResumingFromAnEarlierCheckpointForksInsteadOfOverwriting) {
  const fs::path out = scratch("fork");
  ASSERT_EQ(run(train(out, "train.checkpoint_interval=5 train.keep_last=5")).status, 0);  // 20 steps
  const auto later = file_bytes(out / "ckpt_000020" / "model.safetensors");
  const Result r = run("train --resume " + (out / "ckpt_000010").string() + " train.steps=15");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("ckpt_000015, ckpt_000020"), std::string::npos) << r.out;
  // The later checkpoints are kept aside, byte for byte.
  fs::path aside;
  for (const auto& e : fs::directory_iterator(out / "superseded")) aside = e.path();
  ASSERT_FALSE(aside.empty());
  EXPECT_EQ(file_bytes(aside / "ckpt_000020" / "model.safetensors"), later);
  EXPECT_TRUE(fs::exists(aside / "metrics.jsonl"));
  // The log says where they went, the metrics lines included.
  EXPECT_NE(r.out.find("is moved to " + aside.string() + ": ckpt_000015, ckpt_000020"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lines after step 10"), std::string::npos) << r.out;
  // No step is logged twice, and the run ends at 15.
  const auto steps = logged_steps(out / "metrics.jsonl");
  EXPECT_EQ(std::set<int64_t>(steps.begin(), steps.end()).size(), steps.size());
  EXPECT_EQ(steps.back(), 15);
  EXPECT_FALSE(fs::exists(out / "ckpt_000020"));
}

TEST(RunSafety, ResumeIntoANewDirectoryLeavesTheSourceAlone) {
  const fs::path src = scratch("seed_src"), dst = scratch("seed_dst") / "new";
  ASSERT_EQ(run(train(src, "train.steps=10 train.checkpoint_interval=5")).status, 0);
  const auto before = read(src / "metrics.jsonl");
  const Result r =
      run("train --resume " + (src / "ckpt_000005").string() + " --out " + dst.string() + " train.steps=8");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read(src / "metrics.jsonl"), before);
  EXPECT_TRUE(fs::exists(src / "ckpt_000010"));
  EXPECT_TRUE(fs::exists(dst / "ckpt_000008"));
  EXPECT_NE(read(dst / "loom-run.json").find("seeded_from"), std::string::npos);
  const auto steps = logged_steps(dst / "metrics.jsonl");
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.front(), 1);  // the history up to the checkpoint comes along
  EXPECT_EQ(steps.back(), 8);
}

// Inputs that used to slip through: each is a clear error naming the file or key, exit 2, and
// no run directory appears.
TEST(RunSafety, BadInputsAreRefusedBeforeAnythingIsWritten) {
  const fs::path d = scratch("inputs");
  std::ofstream(d / "empty.toml");
  std::ofstream(d / "inf.toml") << "[optimizer]\nlearning_rate = inf\n";
  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      {"train " + d.string(), "is a directory"},
      {"train " + (d / "empty.toml").string(), "sets no key"},
      {"train " + (d / "inf.toml").string(), "optimizer.learning_rate"},
      {train(d / "run", "model.tie_embeddings=false model.num_outputs=4"), "model.num_outputs is 4"},
      {train(d / "run", "seed=-1"), "seed"},
      {train(d / "run", "data.batch_size=4000000 model.max_seq_len=4096 data.seq_len=4096"), "GiB are available"},
  };
  for (const Case& c : cases) {
    const Result r = run(c.args);
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_FALSE(fs::exists(d / "run")) << c.args;
  }
}

}  // namespace
