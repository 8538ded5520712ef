// Data parallelism over Open MPI (dist/comm.h, train/trainer.h): each case launches jobs with
// `mpirun --oversubscribe --allow-run-as-root -np N` and `threads = 1` per rank, as a user would,
// and checks what the job promises: the collectives are exact, N ranks train like one process
// with N× the minibatches, a repeat is bit-identical, a mismatched configuration or a failed or
// killed rank ends the job with a message naming it (never a hang), checkpoints resume with any
// rank count, and two hosts (network namespaces) train like one. Skips (with a message) where
// mpirun is not installed, and the two-host case where network namespaces cannot be made.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "io/safetensors.h"
#include "support/chat_dir.h"
#include "support/files.h"
#include "support/run_fixture.h"
#include "support/run_loom.h"

namespace fs = std::filesystem;
using loom::testing::RunResult;

namespace {

// Two runs that differ only in how the global batch is split (N ranks × M minibatches against one
// process with N·M) differ in the order of float32 additions of the gradient (per-rank sums first)
// and nothing else. Measured here after 20 AdamW steps (each case prints its numbers): about 77 %
// of the parameter and Adam moment elements differ, the worst by 4.6e-7 of its tensor's largest
// magnitude (a few float32 ulps); the logged losses by at most 5.1e-8 relative (under one ulp).
// The bound leaves 10× room.
constexpr double kTol = 5e-6;

// A hang guard, not a performance bound: a job that has not ended by then is reported as hung.
constexpr double kHangSeconds = 120;

bool have_mpirun() { return std::system("command -v mpirun > /dev/null 2>&1") == 0; }

#define REQUIRE_MPIRUN()                                                                                   \
  if (!have_mpirun())                                                                                      \
  GTEST_SKIP() << "mpirun not found: the data-parallel tests need Open MPI (openmpi-bin, libopenmpi-dev; " \
                  "scripts/install-deps.sh installs them)"

RunResult shell(const std::string& cmd) {
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  const int st = pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// `timeout`: a job that hangs fails its test (mpirun passes the TERM on to its ranks).
std::string mpirun(int np) {
  return "timeout " + std::to_string(static_cast<int>(kHangSeconds)) +
         " mpirun --oversubscribe --allow-run-as-root -np " + std::to_string(np) + " ";
}

// `loom args` on `np` ranks (np = 0: one process without mpirun).
RunResult loom_on(int np, const std::string& args) {
  return np == 0 ? loom::testing::run_loom(args) : shell(mpirun(np) + LOOM_BINARY + " " + args);
}

using loom::testing::file_bytes;
using loom::testing::fixture;
using loom::testing::scratch;

// support/run_fixture.h's dataset and tiny GPT, here with 1 minibatch of 8 sequences, validation
// every 10 steps and 1 thread per rank (kBase, given on every command line).
const std::string kBase =
    " threads=1 optimizer.num_minibatches=1 data.batch_size=8 train.eval_interval=10 train.eval_iters=2 ";

std::string train_args(const fs::path& out, const std::string& overrides = {}) {
  return "train " + fixture().config.string() + kBase + "--out " + out.string() + " --overwrite " + overrides;
}

// The values of `key` in a run's metrics.jsonl, in order.
std::vector<double> logged(const fs::path& run, const char* key) {
  std::vector<double> out;
  std::ifstream f(run / "metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains(key)) out.push_back(j[key].get<double>());
  }
  return out;
}

std::vector<double> train_losses(const fs::path& run) { return logged(run, "loss"); }

// A checkpoint's files: the parameters, then the optimizer state.
const char* const kCheckpointFiles[] = {"model.safetensors", "optimizer.safetensors"};

std::vector<loom::StTensor> tensors(const fs::path& ckpt) {
  std::vector<loom::StTensor> all;
  for (const char* file : kCheckpointFiles)
    for (loom::StTensor& t : loom::read_safetensors((ckpt / file).string())) all.push_back(std::move(t));
  return all;
}

// Both checkpoints' files hold the same bytes.
void expect_same_files(const fs::path& a_ckpt, const fs::path& b_ckpt) {
  for (const char* file : kCheckpointFiles)
    EXPECT_TRUE(file_bytes(a_ckpt / file) == file_bytes(b_ckpt / file)) << a_ckpt << " and " << b_ckpt << ": " << file;
}

// Every parameter and optimizer moment of two checkpoints within kTol of its tensor's largest
// magnitude; prints how many elements differ at all and the worst difference.
void expect_close(const fs::path& a_ckpt, const fs::path& b_ckpt) {
  const auto a = tensors(a_ckpt), b = tensors(b_ckpt);
  ASSERT_EQ(a.size(), b.size());
  size_t differing = 0, total = 0;
  double worst = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    ASSERT_EQ(a[t].name, b[t].name);
    ASSERT_EQ(a[t].bytes.size(), b[t].bytes.size());
    const auto* x = reinterpret_cast<const float*>(a[t].bytes.data());
    const auto* y = reinterpret_cast<const float*>(b[t].bytes.data());
    const size_t n = a[t].bytes.size() / sizeof(float);
    double scale = 0, diff = 0;
    for (size_t i = 0; i < n; ++i) {
      scale = std::max(scale, static_cast<double>(std::fabs(x[i])));
      diff = std::max(diff, std::fabs(static_cast<double>(x[i]) - y[i]));
      differing += x[i] != y[i];
    }
    total += n;
    if (scale > 0) worst = std::max(worst, diff / scale);
    EXPECT_LE(diff, kTol * scale) << a[t].name;
  }
  std::printf("  %zu of %zu parameter and moment elements differ; worst difference %.3g of its tensor's largest\n",
              differing, total, worst);
}

void expect_losses_close(const std::vector<double>& a, const std::vector<double>& b) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], kTol * std::fabs(a[i])) << "logged loss " << i;
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::fabs(a[i]));
  }
  std::printf("  losses: worst relative difference %.3g\n", worst);
}

void expect_identical(const fs::path& a_run, const fs::path& b_run, const std::string& ckpt) {
  EXPECT_EQ(train_losses(a_run), train_losses(b_run));
  expect_same_files(a_run / ckpt, b_run / ckpt);
}

TEST(Dist, CollectivesAreExactInAnyRankCount) {
  REQUIRE_MPIRUN();
  for (int np : {0, 2, 3}) {
    const RunResult r = shell((np ? mpirun(np) : std::string()) + LOOM_DIST_WORKER);
    EXPECT_EQ(r.status, 0) << np << " ranks:\n" << r.out;
    EXPECT_EQ(count(r.out, "all collectives exact"), static_cast<size_t>(std::max(np, 1))) << r.out;
  }
}

// Ranks that all wait, each in another collective, are a deadlock no answer to "alive?" reveals:
// the deadline finds it from the collectives the ranks name, and ends the job naming them.
TEST(Dist, RanksWaitingInDifferentCollectivesEndTheJobNamingThem) {
  REQUIRE_MPIRUN();
  const RunResult r = shell(mpirun(2) + LOOM_DIST_WORKER + " mismatch");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.status, 124) << "the job hung until the hang guard ended it:\n" << r.out;
  EXPECT_EQ(r.out.find("completed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the ranks wait in different collectives"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 0 (host "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(") waits in a broadcast (collective #0)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(") waits in a sum over ranks (collective #0)"), std::string::npos) << r.out;
}

// A root that sends its broadcast late, while the rank waiting for it is asking it whether it
// is alive, runs ahead into the next collectives before that rank sees its own complete: the two
// name different collectives, which is no deadlock, and the job completes.
TEST(Dist, ARootThatRunsAheadOfARankStillAskingIsNoDeadlock) {
  REQUIRE_MPIRUN();
  const RunResult r = shell(mpirun(2) + LOOM_DIST_WORKER + " late_root");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(count(r.out, "the late broadcast completed with 'late'"), 2u) << r.out;
  EXPECT_EQ(r.out.find("different collectives"), std::string::npos) << r.out;
}

// A rank that ends the job at its deadline first flushes its buffered log (without waiting for
// a reader that stopped reading): the log's last line is not lost with the process.
TEST(Dist, TheDeadlinesEndFlushesTheLog) {
  REQUIRE_MPIRUN();
  const fs::path log = scratch("deadline_log") / "log.txt";
  const RunResult r = shell(mpirun(2) + LOOM_DIST_WORKER + " deadline_log " + log.string());
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("waited 1 s in a barrier"), std::string::npos) << r.out;
  const std::vector<unsigned char> text = file_bytes(log);
  EXPECT_EQ(std::string(text.begin(), text.end()), "the last line before the deadline\n") << r.out;
}

TEST(Dist, RanksTrainLikeOneProcessWithAsManyMoreMinibatches) {
  REQUIRE_MPIRUN();
  for (int m : {1, 2}) {
    const fs::path one = scratch("one_" + std::to_string(m)), two = scratch("two_" + std::to_string(m));
    RunResult r = loom_on(0, train_args(one, "optimizer.num_minibatches=" + std::to_string(2 * m)));
    ASSERT_EQ(r.status, 0) << r.out;
    r = loom_on(2, train_args(two, "optimizer.num_minibatches=" + std::to_string(m)));
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("2 ranks × " + std::to_string(m) + " minibatch"), std::string::npos) << r.out;
    std::printf("2 ranks × %d minibatches against 1 process × %d:\n", m, 2 * m);
    expect_losses_close(train_losses(one), train_losses(two));
    expect_close(one / "ckpt_000020", two / "ckpt_000020");
  }
}

// One normalisation (train/trainer.h): on chat data whose loss masks leave each minibatch a
// different number of targets (examples of random lengths, the prompt half of each masked), one
// process with 1 and with 4 minibatches and 2 ranks with 2 each train alike to float32 rounding:
// every step divides by the targets of the whole global batch. Dropout is off (its keys follow
// the minibatch index).
TEST(Dist, MaskedTargetsTrainAlikeWithAnyMinibatchesAndRanks) {
  REQUIRE_MPIRUN();
  const fs::path data = scratch("chat_data");
  loom::testing::ChatSplitData split[2];
  uint64_t z = 12345;
  for (int s = 0; s < 2; ++s) {
    split[s].docs = {0};
    while (split[s].tokens.size() < (s == 0 ? 3000u : 600u)) {
      z = z * 6364136223846793005ull + 1442695040888963407ull;
      const auto len = static_cast<size_t>(4 + (z >> 33) % 40);
      for (size_t i = 0; i < len; ++i) {
        split[s].tokens.push_back(static_cast<uint16_t>(1 + (z >> (i % 50)) % 19));
        split[s].mask.push_back(i >= len / 2 ? 1 : 0);
      }
      split[s].docs.push_back(split[s].tokens.size());  // one padded row per example
    }
  }
  std::ifstream meta(fixture().data / "meta.json");
  loom::testing::write_chat_dir(data, split[0], split[1], 20, nlohmann::json::parse(meta)["tokenizer"]);
  const std::string common = "data.dir=" + data.string() + " model.dropout_rate=0 optimizer.num_minibatches=";
  const fs::path one = scratch("chat_1x1"), four = scratch("chat_1x4"), ranks = scratch("chat_2x2");
  for (const auto& [np, out, m] : {std::tuple{0, one, 1}, std::tuple{0, four, 4}, std::tuple{2, ranks, 2}}) {
    const RunResult r = loom_on(np, train_args(out, common + std::to_string(m)));
    ASSERT_EQ(r.status, 0) << r.out;
  }
  for (const fs::path& other : {four, ranks}) {
    std::printf("%s against 1 process × 1 minibatch:\n", other.filename().c_str());
    expect_losses_close(train_losses(one), train_losses(other));
    expect_close(one / "ckpt_000020", other / "ckpt_000020");
    // The validation loss is one pass over the val split whatever the minibatches and ranks.
    const std::vector<double> val = logged(one, "val_loss"), val_other = logged(other, "val_loss");
    ASSERT_EQ(val.size(), 2u);
    ASSERT_EQ(val_other.size(), val.size());
    for (size_t i = 0; i < val.size(); ++i) EXPECT_NEAR(val_other[i], val[i], 1e-5 * val[i]) << "evaluation " << i;
  }
}

TEST(Dist, SameRankCountIsBitIdenticalWhateverTheBuckets) {
  REQUIRE_MPIRUN();
  // The default bucket holds every gradient of this model; 1 KiB buckets (about 30 of them) are
  // summed one by one while the backward runs. Two ranks cannot tell an order-dependent sum from a
  // fixed one (x0 + x1 == x1 + x0 in float32); three can ((x0 + x1) + x2 and x0 + (x1 + x2) differ
  // in some elements), and MPI's own reductions pick their order by message size.
  for (int np : {2, 3}) {
    const std::string tag = std::to_string(np);
    const fs::path a = scratch("repeat_a" + tag), b = scratch("repeat_b" + tag), c = scratch("repeat_c" + tag);
    const std::string split =
        np == 2 ? "optimizer.num_minibatches=2 " : "data.batch_size=6 optimizer.num_minibatches=2 ";
    for (const auto& [out, buckets] : {std::pair{a, ""}, std::pair{b, ""}, std::pair{c, "train.bucket_kib=1"}}) {
      const RunResult r = loom_on(np, train_args(out, split + buckets));
      ASSERT_EQ(r.status, 0) << r.out;
    }
    expect_identical(a, b, "ckpt_000020");
    expect_identical(a, c, "ckpt_000020");
    // Only rank 0 writes: one line per logged step, not one per rank.
    EXPECT_EQ(train_losses(a).size(), 20u);
  }
}

TEST(Dist, ShardedOptimizerStateTrainsLikeUnsharded) {
  REQUIRE_MPIRUN();
  // ZeRO-1 with 1 KiB buckets (parameters cut across ranks and buckets): each rank updates its
  // elements with the same summed gradients. Without clipping nothing else differs: bit-identical.
  // With clipping the norm is summed from per-rank parts, which may round differently.
  for (const char* clip : {"0", "1.0"}) {
    const fs::path none = scratch(std::string("shard_none_") + clip),
                   state = scratch(std::string("shard_state_") + clip);
    for (const auto& [out, mode] : {std::pair{none, "none"}, std::pair{state, "state"}}) {
      const RunResult r = loom_on(2, train_args(out, std::string("optimizer.clip_norm=") + clip +
                                                         " train.bucket_kib=1 optimizer.shard=" + mode));
      ASSERT_EQ(r.status, 0) << r.out;
    }
    std::printf("optimizer.shard = state against none, clip_norm %s:\n", clip);
    expect_losses_close(train_losses(none), train_losses(state));
    expect_close(none / "ckpt_000020", state / "ckpt_000020");
    if (std::string(clip) == "0") expect_identical(none, state, "ckpt_000020");
  }
}

TEST(Dist, ShardedGradientsTrainLikeUnshardedAndRepeatBitForBit) {
  REQUIRE_MPIRUN();
  // ZeRO-2 with 2 minibatches per rank, 1 KiB buckets and clipping on (the fixture's clip_norm 1.0
  // is below every step's norm, checked below): each minibatch's gradients are summed over ranks
  // before the minibatches are, so it equals none to float32 rounding (measured: within 3.1e-7 of
  // each tensor's largest magnitude, losses within 2.5e-8 relative; kTol leaves 10×), and a
  // repeat is bit-identical. Here the gradients live in the trainer's arena, which the evaluation
  // program borrows between steps: the same run without evaluation trains to the same bits.
  const fs::path none = scratch("grads_none"), grads = scratch("grads_a"), again = scratch("grads_b"),
                 quiet = scratch("grads_no_eval");
  for (const auto& [out, mode, more] :
       {std::tuple{none, "none", ""}, std::tuple{grads, "state+grads", ""}, std::tuple{again, "state+grads", ""},
        std::tuple{quiet, "state+grads", " train.eval_interval=0"}}) {
    const std::string overrides =
        std::string("optimizer.num_minibatches=2 train.bucket_kib=1 optimizer.shard=") + mode + more;
    const RunResult r = loom_on(2, train_args(out, overrides));
    ASSERT_EQ(r.status, 0) << r.out;
  }
  EXPECT_FALSE(logged(grads, "val_loss").empty()) << "the run evaluated";
  EXPECT_TRUE(logged(quiet, "val_loss").empty());
  expect_identical(grads, quiet, "ckpt_000020");
  for (double norm : logged(grads, "grad_norm")) EXPECT_GT(norm, 1.0) << "clipping must act at every step";
  std::printf("optimizer.shard = state+grads against none, 2 minibatches per rank, clipped:\n");
  expect_losses_close(train_losses(none), train_losses(grads));
  expect_close(none / "ckpt_000020", grads / "ckpt_000020");
  expect_identical(grads, again, "ckpt_000020");
}

TEST(Dist, ShardedParametersTrainLikeUnshardedAndRepeatBitForBit) {
  REQUIRE_MPIRUN();
  // ZeRO-3 (optimizer.shard = params) at 2 and 3 ranks, 2 minibatches per rank, clipped: each rank
  // keeps a chunk of every parameter and gathers the whole one before its uses; the gradients are
  // reduce-scattered per minibatch as under state+grads, so it equals none to float32 rounding,
  // and a repeat is bit-identical.
  for (const int np : {2, 3}) {
    const std::string batch = fmt::format(" data.batch_size={} ", 4 * np);
    const fs::path none = scratch(fmt::format("params_none_{}", np)), params = scratch(fmt::format("params_a_{}", np)),
                   again = scratch(fmt::format("params_b_{}", np));
    for (const auto& [out, mode] : {std::pair{none, "none"}, std::pair{params, "params"}, std::pair{again, "params"}}) {
      const RunResult r = loom_on(np, train_args(out, batch + "optimizer.num_minibatches=2 train.eval_interval=0 "
                                                              "optimizer.shard=" + std::string(mode)));
      ASSERT_EQ(r.status, 0) << r.out;
    }
    for (double norm : logged(params, "grad_norm")) EXPECT_GT(norm, 1.0) << "clipping must act at every step";
    std::printf("optimizer.shard = params against none, %d ranks, 2 minibatches per rank, clipped:\n", np);
    expect_losses_close(train_losses(none), train_losses(params));
    expect_close(none / "ckpt_000020", params / "ckpt_000020");
    expect_identical(params, again, "ckpt_000020");
  }
}

// The opening "program:" line counts the model's parameters whether or not a rank holds them
// whole (under optimizer.shard = params each holds chunks outside the program's plan).
TEST(Dist, ShardedParametersProgramLineCountsTheModelsParameters) {
  REQUIRE_MPIRUN();
  const auto parameters = [](const std::string& out) {
    const size_t at = out.find("program: "), end = out.find(" parameters", at);
    const size_t from = out.rfind(", ", end) + 2;
    return at == std::string::npos || end == std::string::npos ? std::string() : out.substr(from, end - from);
  };
  const RunResult one = loom_on(0, train_args(scratch("count_one"), "train.steps=1"));
  ASSERT_EQ(one.status, 0) << one.out;
  const RunResult two = loom_on(2, train_args(scratch("count_two"), "train.steps=1 optimizer.shard=params"));
  ASSERT_EQ(two.status, 0) << two.out;
  ASSERT_NE(parameters(one.out), "") << one.out;
  EXPECT_NE(parameters(one.out), "0") << one.out;
  EXPECT_EQ(parameters(two.out), parameters(one.out)) << two.out;
}

// Open MPI gives each rank a terminal of its own even when mpirun writes to a file or a pipe: the
// job's log holds plain step lines, no progress bar's carriage returns and erase sequences.
TEST(Dist, AJobsLogHoldsNoProgressBar) {
  REQUIRE_MPIRUN();
  const RunResult r = loom_on(2, train_args(scratch("plain_log"), "train.steps=3 train.eval_interval=0"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find('\r'), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\x1b["), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step 3"), std::string::npos) << r.out;
}

TEST(Dist, ShardedParametersEvaluateLikeUnsharded) {
  REQUIRE_MPIRUN();
  // ZeRO-3 evaluates during training with each parameter gathered from the ranks' chunks right
  // before its use, as the training forward reads it (train/param_gathers.h), at 2 ranks with 2
  // minibatches each, two evaluations of 2 batches. It trains as state+grads does, bit for bit, so
  // it evaluates the same parameters: the same validation losses, bit for bit, and none's to
  // float32 rounding. The evaluation runs in the trainer's arena, where the next step's first
  // gathers were in flight: a run without evaluation trains to the same bits.
  const fs::path none = scratch("params_eval_none"), grads = scratch("params_eval_grads"),
                 params = scratch("params_eval"), quiet = scratch("params_eval_quiet");
  for (const auto& [out, mode, more] :
       {std::tuple{none, "none", ""}, std::tuple{grads, "state+grads", ""}, std::tuple{params, "params", ""},
        std::tuple{quiet, "params", " train.eval_interval=0"}}) {
    const RunResult r =
        loom_on(2, train_args(out, std::string("optimizer.num_minibatches=2 optimizer.shard=") + mode + more));
    ASSERT_EQ(r.status, 0) << r.out;
  }
  const std::vector<double> val = logged(params, "val_loss");
  ASSERT_EQ(val.size(), 2u);
  EXPECT_EQ(val, logged(grads, "val_loss"));
  std::printf("optimizer.shard = params against none, validation losses:\n");
  expect_losses_close(logged(none, "val_loss"), val);
  EXPECT_TRUE(logged(quiet, "val_loss").empty());
  expect_identical(params, quiet, "ckpt_000020");
  // Each rank's plan holds the evaluation program (its inputs, and its arena beside the trainer's
  // when larger) on top of the training's, as the fit check counts it.
  const std::string memory = "memory " + fixture().config.string() + kBase + "--ranks 2 --json optimizer.shard=params";
  const RunResult with = loom_on(0, memory), without = loom_on(0, memory + " train.eval_interval=0");
  ASSERT_EQ(with.status, 0) << with.out;
  ASSERT_EQ(without.status, 0) << without.out;
  const auto w = nlohmann::json::parse(with.out), wo = nlohmann::json::parse(without.out);
  EXPECT_GT(w["evaluation_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(wo["evaluation_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(w["total_bytes"].get<int64_t>(), wo["total_bytes"].get<int64_t>() + w["evaluation_bytes"].get<int64_t>());
}

// ZeRO-3's gathers in flight while the kernels before their first use run (optimizer.gather_ahead
// 1 and 2: the worker, tests/dist/worker/prefetch.cpp, builds the trainers) train bit for bit as
// gathers that block (0), at 2 and 3 ranks, and are in flight while
// kernels run: the trainer counts, for each gather, whether a kernel ran before it completed, and
// the worker fails unless that is none without prefetch and, with it, every gather the plan starts
// early (a trainer that waited for a gather where it starts it would count none).
TEST(Dist, PrefetchedParameterGathersOverlapKernelsAndTrainBitForBitAsBlockingOnes) {
  REQUIRE_MPIRUN();
  for (const int np : {2, 3}) {
    const RunResult r = shell(mpirun(np) + LOOM_PREFETCH_WORKER + " 3");
    EXPECT_EQ(r.status, 0) << np << " ranks:\n" << r.out;
    EXPECT_EQ(count(r.out, "prefetched gathers train bit for bit as blocking ones"), static_cast<size_t>(np)) << r.out;
    std::printf("%d ranks:\n%s", np, r.out.c_str());
  }
}

// ZeRO-3's evaluator (the worker, tests/dist/worker/evaluation.cpp, builds trainers and evaluators)
// gathers every parameter from its trainer's chunks, holding none of its own, evaluates bit for bit
// as beside a state+grads trainer after each step (the trainer's prefetch for the next step in
// flight in the arena the evaluation borrows), and allocates exactly Evaluator::planned_bytes.
TEST(Dist, ShardedParametersEvaluatorGathersInItsPlannedBytes) {
  REQUIRE_MPIRUN();
  for (const int np : {2, 3}) {
    const RunResult r = shell(mpirun(np) + LOOM_EVALUATION_WORKER);
    EXPECT_EQ(r.status, 0) << np << " ranks:\n" << r.out;
    EXPECT_EQ(count(r.out, "ZeRO-3 evaluates as state+grads, bit for bit, in its planned bytes"),
              static_cast<size_t>(np))
        << r.out;
    std::printf("%d ranks:\n%s", np, r.out.c_str());
  }
}

TEST(Dist, ShardedParametersResumeFromAndToAnyShardModeAndRankCount) {
  REQUIRE_MPIRUN();
  // A global batch of 12 as one process with 6 minibatches, 2 ranks with 3 or 3 ranks with 2:
  // 20 steps straight against 10 steps, then a resume to 20, with optimizer.shard = params on one
  // side or both; and with stacked layers (model.scan_layers, against a stacked straight run),
  // which a sharded rank saves and reads by each layer's offset in the stacked tensor.
  const std::string base = " data.batch_size=12 train.eval_interval=0 ";
  std::map<bool, fs::path> straight;
  for (const bool scan : {false, true}) {
    straight[scan] = scratch(scan ? "params_straight_stacked" : "params_straight");
    ASSERT_EQ(loom_on(0, train_args(straight[scan],
                                    fmt::format("{}optimizer.num_minibatches=6 model.scan_layers={}", base, scan)))
                  .status,
              0);
  }
  struct Leg {
    int first_np, second_np;  // 0: one process
    const char *first_shard, *second_shard;
    bool scan = false;
  };
  for (const Leg leg : {Leg{2, 0, "params", "none"}, Leg{0, 3, "none", "params"}, Leg{3, 2, "params", "params"},
                        Leg{2, 3, "params", "state+grads"}, Leg{3, 2, "state", "params"},
                        Leg{0, 2, "none", "params", true}, Leg{3, 2, "params", "params", true}}) {
    const std::string name = fmt::format("params_resume_{}_{}_{}_{}{}", leg.first_np, leg.second_np, leg.first_shard,
                                         leg.second_shard, leg.scan ? "_stacked" : "");
    const fs::path out = scratch(name);
    const auto args = [&](int np, const char* shard) {
      return fmt::format("{}optimizer.num_minibatches={} optimizer.shard={} model.scan_layers={}", base,
                         np ? 6 / np : 6, shard, leg.scan);
    };
    RunResult r = loom_on(leg.first_np, train_args(out, args(leg.first_np, leg.first_shard) + " train.steps=10"));
    ASSERT_EQ(r.status, 0) << r.out;
    r = loom_on(leg.second_np,
                "train --resume " + out.string() + " train.steps=20 " + args(leg.second_np, leg.second_shard));
    ASSERT_EQ(r.status, 0) << name << ":\n" << r.out;
    EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
    std::printf("%s against one process straight through:\n", name.c_str());
    expect_losses_close(train_losses(straight[leg.scan]), train_losses(out));
    expect_close(straight[leg.scan] / "ckpt_000020", out / "ckpt_000020");
  }
}

TEST(Dist, MemoryPlanPerRankIsWhatEachRankAllocates) {
  REQUIRE_MPIRUN();
  // `loom memory --ranks 2` (nothing runs) against what each rank of a 2-rank run allocated (its
  // profile summary) and the most device memory it held at once (the backend's count). The plan
  // gives the largest rank's share of the sharded optimizer state and gradients.
  std::map<std::string, int64_t> optimizer_total, grad_total, param_total;  // mode -> both ranks' bytes
  for (const std::string mode : {"none", "state", "state+grads", "params"}) {
    const std::string overrides = " optimizer.shard=" + mode + " train.bucket_kib=1";
    const RunResult plan = loom_on(0, "memory " + fixture().config.string() + kBase + "--ranks 2 --json" + overrides);
    ASSERT_EQ(plan.status, 0) << plan.out;
    const auto p = nlohmann::json::parse(plan.out);
    const fs::path out = scratch("memory_" + mode);
    const RunResult run = loom_on(2, "profile " + fixture().config.string() + kBase + overrides +
                                         " --steps 1 --no-ceiling --out " + out.string());
    ASSERT_EQ(run.status, 0) << run.out;
    int64_t largest_optimizer = 0, largest_grads = 0, largest_peak = 0;
    for (int rank : {0, 1}) {
      std::ifstream f(out / ("rank" + std::to_string(rank)) / "summary.json");
      const auto m = nlohmann::json::parse(f)["memory"];
      EXPECT_EQ(m["communication_bytes"], p["communication_bytes"]) << mode << " rank " << rank;
      // The arena holds the activations and, at the peak, the running node's kernel workspace
      // (with state+grads also the gradients, each until its bucket is summed).
      EXPECT_EQ(m["arena_bytes"], p["activations_bytes"].get<int64_t>() + p["workspace_bytes"].get<int64_t>())
          << mode << " rank " << rank;
      EXPECT_EQ(m["param_bytes"], p["params_bytes"]) << mode << " rank " << rank;
      largest_optimizer = std::max(largest_optimizer, m["optimizer_bytes"].get<int64_t>());
      largest_grads = std::max(largest_grads, m["grad_bytes"].get<int64_t>());
      // Measured: the bucket buffers are host vectors, everything else the backend's memory.
      largest_peak =
          std::max(largest_peak, m["peak_allocated_bytes"].get<int64_t>() + m["communication_bytes"].get<int64_t>());
      optimizer_total[mode] += m["optimizer_bytes"].get<int64_t>();
      param_total[mode] += m["param_bytes"].get<int64_t>();
      grad_total[mode] += m["grad_bytes"].get<int64_t>();
    }
    EXPECT_EQ(largest_optimizer, p["optimizer_bytes"].get<int64_t>()) << mode;
    EXPECT_EQ(largest_grads, p["grads_bytes"].get<int64_t>()) << mode;
    // `loom profile` runs no evaluation, which `loom memory` counts for the fixture's training run,
    // and saves no checkpoint, whose stream buffer it counts too; sgemm's packing buffers (the
    // library row) are malloc'd by oneDNN, not by the backend.
    EXPECT_GT(p["evaluation_bytes"].get<int64_t>(), 0) << mode;
    EXPECT_EQ(p["checkpoint_bytes"].get<int64_t>(), static_cast<int64_t>(loom::kStreamBytes)) << mode;
    EXPECT_EQ(largest_peak, p["total_bytes"].get<int64_t>() - p["evaluation_bytes"].get<int64_t>() -
                                p["checkpoint_bytes"].get<int64_t>() - p["library_bytes"].get<int64_t>())
        << mode;
    std::printf("optimizer.shard = %s: planned %lld bytes per rank (params %lld), measured peak %lld\n", mode.c_str(),
                static_cast<long long>(p["total_bytes"].get<int64_t>()),
                static_cast<long long>(p["params_bytes"].get<int64_t>()), static_cast<long long>(largest_peak));
  }
  EXPECT_EQ(optimizer_total["state"] * 2, optimizer_total["none"]) << "each rank holds its half of the moments";
  EXPECT_EQ(optimizer_total["state+grads"], optimizer_total["state"]);
  EXPECT_EQ(grad_total["state"], grad_total["none"]);
  EXPECT_EQ(grad_total["state+grads"] * 2, grad_total["none"]) << "each rank holds its half of the gradients";
  EXPECT_EQ(grad_total["params"], grad_total["state+grads"]);
  EXPECT_EQ(optimizer_total["params"], optimizer_total["state"]);
  EXPECT_EQ(param_total["state+grads"], param_total["none"]);
  EXPECT_EQ(param_total["params"] * 2, param_total["none"]) << "each rank holds its half of the parameters";
}

TEST(Dist, ConfigurationMismatchIsAnErrorOnEveryRankBeforeAnyStep) {
  REQUIRE_MPIRUN();
  const fs::path out = scratch("mismatch");
  const std::string args = train_args(out);
  const RunResult r = shell(mpirun(1) + LOOM_BINARY + " " + args + " optimizer.learning_rate=0.003 : -np 1 " +
                            LOOM_BINARY + " " + args + " optimizer.learning_rate=0.001");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_EQ(count(r.out, "optimizer.learning_rate: rank 1's configuration differs from rank 0's"), 1u)
      << "every rank raises it, rank 0 alone prints it:\n"
      << r.out;
  EXPECT_NE(r.out.find("0.001"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step 1/"), std::string::npos) << "no step may run:\n" << r.out;

  const RunResult split = loom_on(2, train_args(out, "data.batch_size=6 optimizer.num_minibatches=2"));
  EXPECT_EQ(split.status, 2) << split.out;
  EXPECT_NE(split.out.find("data.batch_size: batch size 6 is not divisible by 2 ranks × optimizer.num_minibatches"),
            std::string::npos)
      << split.out;
}

int latest_checkpoint_step(const fs::path& run) {
  int best = -1;
  for (const auto& e : fs::directory_iterator(run)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("ckpt_", 0) == 0) best = std::max(best, std::stoi(n.substr(5)));
  }
  return best;
}

// Rank 0 owns the run directory: a user's entry under a checkpoint's name that the run would write
// over is refused there before anything is built, a resume in place included (not at its first
// save), and every rank ends with its one message, without MPI_Abort; nothing changes on disk.
TEST(Dist, AUsersEntryInTheRunDirectoryStopsEveryRankBeforeAStep) {
  REQUIRE_MPIRUN();
  const fs::path out = scratch("users_entry"), fresh = scratch("users_entry_fresh");
  ASSERT_EQ(loom_on(2, train_args(out, "train.eval_interval=0 --steps 2")).status, 0);
  std::ofstream(out / "ckpt_000004") << "USERDATA\n";
  std::ofstream(fresh / "best") << "USERDATA\n";
  const auto metrics = file_bytes(out / "metrics.jsonl");
  for (const auto& [dir, args] : {std::pair{out / "ckpt_000004", "train --resume " + out.string() + " --steps 4"},
                                  std::pair{fresh / "best", train_args(fresh, "--steps 2")}}) {
    const RunResult r = loom_on(2, args);
    EXPECT_EQ(r.status, 2) << r.out;  // 134 would be an abort, 124 a hang
    EXPECT_EQ(count(r.out, dir.string() + ": is a file, not a checkpoint loom wrote"), 1u) << "one message:\n" << r.out;
    EXPECT_EQ(r.out.find("stopping every rank"), std::string::npos) << "not ended by MPI_Abort:\n" << r.out;
    EXPECT_EQ(r.out.find("program:"), std::string::npos) << "refused before the trainer is built:\n" << r.out;
    EXPECT_TRUE(file_bytes(dir) == std::vector<unsigned char>({'U', 'S', 'E', 'R', 'D', 'A', 'T', 'A', '\n'})) << dir;
  }
  EXPECT_TRUE(file_bytes(out / "metrics.jsonl") == metrics);
  EXPECT_FALSE(fs::exists(fresh / "loom-run.json"));
}

// The README allows a copy of the run on each host instead of a shared file system: a stale copy
// (here its latest checkpoint deleted) must not train on with state that differs between ranks.
TEST(Dist, RanksThatResumedDifferentStatesStopBeforeAnythingIsWritten) {
  REQUIRE_MPIRUN();
  const fs::path run = scratch("resumed"), stale = scratch("resumed_stale"), copy = scratch("resumed_copy");
  ASSERT_EQ(loom_on(0, train_args(run, "train.steps=40 train.checkpoint_interval=20 train.eval_interval=0")).status, 0);
  for (const fs::path& to : {stale, copy}) fs::copy(run, to, fs::copy_options::recursive);
  fs::remove_all(stale / "ckpt_000040");
  const auto before = file_bytes(run / "metrics.jsonl");
  const auto both = [&](const fs::path& a, const fs::path& b) {
    return shell(mpirun(1) + LOOM_BINARY + " train --resume " + a.string() + " --steps 60 : -np 1 " + LOOM_BINARY +
                 " train --resume " + b.string() + " --steps 60");
  };
  for (const bool stale_first : {false, true}) {
    const RunResult r = stale_first ? both(stale, run) : both(run, stale);
    EXPECT_EQ(r.status, 2) << r.out;
    const int fresh = stale_first ? 1 : 0;
    EXPECT_EQ(count(r.out, "the ranks did not resume the same state"), 1u) << "one message:\n" << r.out;
    EXPECT_NE(r.out.find(fmt::format("rank {}: {} on ", fresh, (run / "ckpt_000040").string())), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find(fmt::format("rank {}: {} on ", 1 - fresh, (stale / "ckpt_000020").string())),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find(", step 40"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(", step 20"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("step 21/"), std::string::npos) << "no step may run:\n" << r.out;
    EXPECT_EQ(r.out.find("step 41/"), std::string::npos) << "no step may run:\n" << r.out;
    EXPECT_FALSE(fs::exists(run / "ckpt_000060"));
    EXPECT_FALSE(fs::exists(stale / "ckpt_000060"));
    EXPECT_EQ(file_bytes(run / "metrics.jsonl"), before);
    EXPECT_EQ(latest_checkpoint_step(stale), 20);
  }
  // A copy at the same step whose parameters differ by one value, its checksums rewritten so that
  // it loads as sound (another host's copy changed after the fact): only the digest tells.
  const fs::path altered = scratch("resumed_altered");
  fs::copy(run, altered, fs::copy_options::recursive);
  {
    const std::string f = (altered / "ckpt_000040" / "model.safetensors").string();
    std::map<std::string, std::string> meta;
    std::vector<loom::StTensor> tensors = loom::read_safetensors(f, &meta);
    ASSERT_EQ(tensors[0].dtype, loom::DType::f32);
    float x = 0;
    std::memcpy(&x, tensors[0].bytes.data(), sizeof x);
    x += 1.f;
    std::memcpy(tensors[0].bytes.data(), &x, sizeof x);
    std::erase_if(meta, [](const auto& kv) { return kv.first.starts_with("crc32c/"); });
    loom::write_safetensors(f, tensors, meta);
  }
  RunResult r = both(run, altered);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(count(r.out, "the ranks did not resume the same state"), 1u) << r.out;
  EXPECT_EQ(count(r.out, ", step 40 (digest "), 2u) << "both ranks at step 40, the digests differ:\n" << r.out;
  EXPECT_FALSE(fs::exists(run / "ckpt_000060"));
  // A faithful copy at another path (another host's) agrees: the job trains.
  r = both(run, copy);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(fs::exists(run / "ckpt_000060"));
}

TEST(Dist, OneFailingRankStopsTheJobWithItsMessage) {
  REQUIRE_MPIRUN();
  // Only rank 0 takes the lock of the run it resumes, before the ranks first meet: with the lock
  // held here (as by a run still going) it fails alone while rank 1 goes on (as far as its first
  // collective).
  const fs::path out = scratch("occupied");
  ASSERT_EQ(loom_on(0, train_args(out, "train.steps=2")).status, 0);
  const int fd = open((out / ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0);
  const RunResult r = loom_on(2, "train --resume " + out.string() + " --steps 4");
  close(fd);
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("is in use by another loom process"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 0 of 2 failed"), std::string::npos) << r.out;
}

// The gradient sums overlap the backward: in every step of a trace, the first bucket's sum starts
// before the backward's last node ends (a reducer that waited for the whole backward would start
// every bucket after it).
void expect_sums_overlap_the_backward(const fs::path& trace) {
  std::ifstream f(trace);
  const nlohmann::json j = nlohmann::json::parse(f);
  struct Span {
    double begin, end;
  };
  std::vector<Span> backwards, ops, buckets;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const double ts = e["ts"].get<double>();
    const Span span{ts, ts + e["dur"].get<double>()};
    if (e["cat"] == "phase" && e["name"] == "backward") backwards.push_back(span);
    if (e["cat"] == "op") ops.push_back(span);
    if (e["cat"] == "communication") buckets.push_back(span);
  }
  ASSERT_FALSE(backwards.empty()) << trace;
  for (const Span& b : backwards) {
    double last_node_end = b.begin, first_bucket = b.end + 1e12;
    for (const Span& op : ops)
      if (op.begin >= b.begin && op.begin <= b.end) last_node_end = std::max(last_node_end, op.end);
    for (const Span& k : buckets)
      if (k.begin >= b.begin && k.begin <= b.end) first_bucket = std::min(first_bucket, k.begin);
    EXPECT_LT(first_bucket, last_node_end) << trace << ": the backward at " << b.begin << " us";
  }
}

TEST(Dist, ProfileWritesATracePerRankAndOneWithEvery) {
  REQUIRE_MPIRUN();
  const fs::path out = scratch("profile");
  const RunResult r = loom_on(2, "profile " + fixture().config.string() + kBase +
                                     "train.bucket_kib=1 --steps 2 --no-ceiling --out " + out.string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("gradient sums over ranks"), std::string::npos) << r.out;
  // Each rank's trace is its own process; the merged one holds both, each with its executor and
  // its communication track (one span per bucket and step).
  std::map<std::pair<int, int>, int> spans;  // (pid, tid) -> complete events
  const auto at = [&](int pid, int tid) { return spans[std::pair{pid, tid}]; };
  const auto count_spans = [&](const fs::path& trace) {
    spans.clear();
    std::ifstream f(trace);
    const nlohmann::json j = nlohmann::json::parse(f);
    for (const auto& e : j["traceEvents"])
      if (e["ph"] == "X") ++spans[{e["pid"].get<int>(), e["tid"].get<int>()}];
  };
  for (int rank : {0, 1}) {
    count_spans(out / ("rank" + std::to_string(rank)) / "trace.json");
    EXPECT_EQ(spans.size(), 2u);
    EXPECT_GT(at(rank + 1, 1), 0);
    EXPECT_GT(at(rank + 1, 2), 0);
    expect_sums_overlap_the_backward(out / ("rank" + std::to_string(rank)) / "trace.json");
  }
  count_spans(out / "trace.json");
  EXPECT_EQ(spans.size(), 4u);
  EXPECT_EQ(at(1, 2), at(2, 2)) << "both ranks sum the same buckets";

  // With sharded gradients every minibatch's buckets are summed, not only the last one's.
  std::map<std::string, int> sums;  // shard mode -> rank 0's communication spans
  for (const std::string mode : {"none", "state+grads"}) {
    const fs::path dir = scratch("profile_" + mode);
    const RunResult run = loom_on(2, "profile " + fixture().config.string() + kBase +
                                         "train.bucket_kib=1 optimizer.num_minibatches=2 optimizer.shard=" + mode +
                                         " --steps 2 --no-ceiling --out " + dir.string());
    ASSERT_EQ(run.status, 0) << run.out;
    count_spans(dir / "rank0" / "trace.json");
    sums[mode] = at(1, 2);
  }
  EXPECT_GT(sums["none"], 0);
  EXPECT_EQ(sums["state+grads"], 2 * sums["none"]);
}

TEST(Dist, TwoHostsOverANetworkLinkTrainLikeOneHost) {
  REQUIRE_MPIRUN();
  // One rank in each of two network namespaces joined by a veth pair, talking TCP as two machines
  // would (two_hosts.sh; it needs root). The sums have a fixed order whatever carries them, so the
  // run is bit for bit the one of two ranks on one host.
  const fs::path hosts = scratch("two_hosts"), local = scratch("one_host");
  const RunResult r = shell(std::string(LOOM_SOURCE_DIR) + "/tests/dist/two_hosts.sh " + LOOM_BINARY + " " +
                            train_args(hosts, "optimizer.num_minibatches=2"));
  if (r.status == 77) GTEST_SKIP() << r.out;
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("2 ranks × 2 minibatches"), std::string::npos) << r.out;
  ASSERT_EQ(loom_on(2, train_args(local, "optimizer.num_minibatches=2")).status, 0);
  expect_identical(hosts, local, "ckpt_000020");
}

// The pid of the process whose environment holds all of `vars` ("NAME=value"), or -1.
pid_t find_process(const std::vector<std::string>& vars) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "environ", std::ios::binary);
    const std::string env{std::istreambuf_iterator<char>(f), {}};
    bool all = true;
    for (const std::string& v : vars) all = all && env.find(std::string(1, '\0') + v + '\0') != std::string::npos;
    if (all) return static_cast<pid_t>(std::stol(name));
  }
  return -1;
}

// A 2-rank job training "forever" in the background (a checkpoint every 5 steps), its output in a
// log; its ranks are found by a tag in their environment.
class BackgroundJob {
 public:
  using clock = std::chrono::steady_clock;
  static double elapsed(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }

  BackgroundJob(const fs::path& out, const std::string& overrides)
      : out_(out), log_(out.parent_path() / (out.filename().string() + ".log")) {
    const std::string cmd = "exec env " + tag_ + " " + mpirun(2) + LOOM_BINARY + " " +
                            train_args(out,
                                       "train.steps=1000000 train.eval_interval=0 train.checkpoint_interval=5 "
                                       "train.log_every=1000 " +
                                           overrides) +
                            " > " + log_.string() + " 2>&1";
    pid_ = fork();
    if (pid_ == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~BackgroundJob() {
    if (pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  // Rank 1's pid once the job has saved step 10 (past start-up), or -1 after kHangSeconds.
  pid_t rank1_after_step_10() const {
    const auto start = clock::now();
    pid_t victim = -1;
    while (elapsed(start) < kHangSeconds && (!fs::exists(out_ / "ckpt_000010") || victim < 0)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      victim = find_process({tag_, "OMPI_COMM_WORLD_RANK=1"});
    }
    return fs::exists(out_ / "ckpt_000010") ? victim : -1;
  }
  // Seconds from `since` until the job ended, its exit status in `status`; -1 if it still ran
  // kHangSeconds later (it is then killed).
  double seconds_to_end(clock::time_point since, int* status) {
    while (waitpid(pid_, status, WNOHANG) == 0) {
      if (elapsed(since) > kHangSeconds) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_ = -1;
    return elapsed(since);
  }
  std::string printed() const {
    const std::vector<unsigned char> text = file_bytes(log_);
    return {text.begin(), text.end()};
  }
  pid_t find_rank(int r) const { return find_process({tag_, "OMPI_COMM_WORLD_RANK=" + std::to_string(r)}); }

 private:
  fs::path out_, log_;
  std::string tag_ = "LOOM_DIST_TEST_TAG=" + std::to_string(getpid());
  pid_t pid_ = -1;
};

// The last checkpoint of an ended job is whole: it equals a clean run's at the same step, and it
// resumes.
void expect_last_checkpoint_whole(const fs::path& out) {
  const int last = latest_checkpoint_step(out);
  ASSERT_GE(last, 10);
  const std::string ckpt = fmt::format("ckpt_{:06d}", last);
  const fs::path clean = scratch(out.filename().string() + "_clean");
  RunResult r = loom_on(2, train_args(clean, "train.eval_interval=0 --steps " + std::to_string(last)));
  ASSERT_EQ(r.status, 0) << r.out;
  expect_same_files(out / ckpt, clean / ckpt);
  r = loom_on(2, "train --resume " + (out / ckpt).string() + " --steps " + std::to_string(last + 2));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
}

// mpirun notices a rank's exit at once (2.1 s here, the machine loaded) and ends the job.
constexpr double kKilledSeconds = 20;

TEST(Dist, KilledRankEndsTheJobAndTheLastCheckpointResumes) {
  REQUIRE_MPIRUN();
  const fs::path out = scratch("killed");
  BackgroundJob job(out, "");
  const pid_t victim = job.rank1_after_step_10();
  ASSERT_GT(victim, 0) << job.printed();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  int status = 0;
  const double seconds = job.seconds_to_end(BackgroundJob::clock::now(), &status);
  ASSERT_GE(seconds, 0) << "the job still ran " << kHangSeconds << " s after rank 1 was killed";
  std::printf("the job ended %.2f s after rank 1 was killed\n", seconds);
  EXPECT_LT(seconds, kKilledSeconds);
  const std::string printed = job.printed();
  EXPECT_NE(printed.find("rank 1"), std::string::npos) << printed;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << printed;
  expect_last_checkpoint_whole(out);
}

// A stopped rank (kill -STOP; a frozen host or a cut network looks the same from the others)
// ends the job: rank 0 waits train.collective_timeout in a collective, asks rank 1 whether it is
// alive, gets no answer within min(timeout, 60 s) more, names it and aborts the job.
TEST(Dist, StoppedRankEndsTheJobAfterTheCollectiveTimeout) {
  REQUIRE_MPIRUN();
  const fs::path out = scratch("stopped");
  constexpr double kTimeout = 5;  // rank 0 may be measuring its matmul ceiling for a second or two at start
  BackgroundJob job(out, fmt::format("train.collective_timeout={}", kTimeout));
  const pid_t victim = job.rank1_after_step_10();
  ASSERT_GT(victim, 0) << job.printed();
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  int status = 0;
  const double seconds = job.seconds_to_end(BackgroundJob::clock::now(), &status);
  if (job.find_rank(1) == victim) kill(victim, SIGKILL);  // never leave it behind, stopped
  ASSERT_GE(seconds, 0) << "the job still ran " << kHangSeconds << " s after rank 1 was stopped:\n" << job.printed();
  std::printf("the job ended %.2f s after rank 1 was stopped (timeout %g s)\n", seconds, kTimeout);
  // The timeout, the time to answer (as long again) and a margin for a loaded machine.
  EXPECT_LT(seconds, 2 * kTimeout + kKilledSeconds);
  const std::string printed = job.printed();
  EXPECT_EQ(count(printed, "waited 5 s in "), 1u) << printed;
  EXPECT_NE(printed.find("for rank 1 (host "), std::string::npos) << printed;
  EXPECT_NE(printed.find("train.collective_timeout = 5 s"), std::string::npos) << printed;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << printed;
  EXPECT_LT(find_process({"OMPI_COMM_WORLD_RANK=1", "LOOM_DIST_TEST_TAG=" + std::to_string(getpid())}), 0)
      << "rank 1 ended too";
  expect_last_checkpoint_whole(out);
}

// `loom ARGS` on two ranks with a slow or hung disk on one (slow_io/slow_io.cpp): each `call` of
// a file whose path holds `path` sleeps `seconds` first on rank `rank`. (A sanitized loom takes
// the library only when told not to insist that its runtime comes first.)
RunResult loom_with_slow_disk(int rank, const char* call, const char* path, int seconds, const std::string& args,
                              const std::string& env = {}) {
  return shell(
      fmt::format("env LD_PRELOAD={} ASAN_OPTIONS=$ASAN_OPTIONS:verify_asan_link_order=0 LOOM_SLOW_RANK={} "
                  "LOOM_SLOW_CALL={} LOOM_SLOW_PATH={} LOOM_SLOW_SECONDS={} {}{}{} {}",
                  LOOM_SLOW_IO, rank, call, path, seconds, env, mpirun(2), LOOM_BINARY, args));
}

// Rank 0's save waits for the disk (the final fsync of its optimizer state takes 3 deadlines):
// it keeps answering the other ranks that it is busy, so the job is not ended as hung; with
// sharded state too, where rank 1 waits for it in the stream of moments (train/checkpoint.h).
TEST(Dist, ASaveWhoseFlushOutlastsTheDeadlineIsNotAHang) {
  REQUIRE_MPIRUN();
  for (const char* shard : {"none", "state"}) {
    const fs::path out = scratch(std::string("slow_fsync_") + shard);
    constexpr int kTimeout = 5;  // rank 0 may be measuring its matmul ceiling for a second or two at start
    const RunResult r = loom_with_slow_disk(
        0, "fsync", "optimizer.safetensors", 3 * kTimeout,
        train_args(out, fmt::format("train.eval_interval=0 train.collective_timeout={} optimizer.shard={} --steps 3",
                                    kTimeout, shard)));
    ASSERT_EQ(r.status, 0) << shard << ":\n" << r.out;
    EXPECT_EQ(r.out.find("waited"), std::string::npos) << shard << ":\n" << r.out;
    EXPECT_FALSE(tensors(out / "ckpt_000003").empty()) << "the checkpoint reads back, checksums verified";
  }
}

// A rank whose disk hangs while it loads the checkpoint to resume is named after the run's own
// train.collective_timeout (here 2 s, against a load that would take 60 s), not the default.
TEST(Dist, ARankHungWhileLoadingIsNamedAfterTheRunsTimeout) {
  REQUIRE_MPIRUN();
  const fs::path out = scratch("slow_load");
  ASSERT_EQ(loom_on(2, train_args(out, "train.eval_interval=0 --steps 2")).status, 0);
  const RunResult r = loom_with_slow_disk(1, "open", "model.safetensors", 60,
                                          "train --resume " + out.string() + " train.collective_timeout=2 --steps 3");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("waited 2 s in "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("for rank 1 (host "), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out / "ckpt_000003")) << r.out;
}

// The link between the two hosts goes down mid-run (two_hosts.sh cuts it once step 10 is saved):
// rank 0 waits train.collective_timeout in a collective, asks rank 1, gets no answer within as
// long again, names it and ends the job; the last checkpoint is whole.
TEST(Dist, TwoHostsWhoseLinkGoesDownEndTheJobNamingTheUnreachableRank) {
  REQUIRE_MPIRUN();
  const fs::path out = scratch("cut_link");
  constexpr double kTimeout = 5;  // rank 0 may be measuring its matmul ceiling for a second or two at start
  // The link comes back 8 s after loom's verdict is due, so that mpirun, which passes loom's abort
  // on to the other host's daemon, can reach it: a host lost for good leaves mpirun waiting until
  // its TCP keepalive gives up (README, "More than one process or machine"), whose own verdict
  // would race loom's here. Back too soon, rank 1 answers and the job trains on: no message, and
  // the job runs into two_hosts.sh's timeout.
  constexpr double kCutSeconds = 2 * kTimeout + 8;
  const RunResult r =
      shell(fmt::format("env LOOM_CUT_LINK_WHEN={} LOOM_CUT_LINK_FOR={} {}/tests/dist/two_hosts.sh {} {}",
                        (out / "ckpt_000010").string(), kCutSeconds, LOOM_SOURCE_DIR, LOOM_BINARY,
                        train_args(out, fmt::format("train.steps=1000000 train.eval_interval=0 "
                                                    "train.checkpoint_interval=5 train.log_every=1000 "
                                                    "train.collective_timeout={}",
                                                    kTimeout))));
  const double ended = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (r.status == 77) GTEST_SKIP() << r.out;
  const std::string mark = "two_hosts.sh: link cut at ";
  const size_t at = r.out.find(mark);
  ASSERT_NE(at, std::string::npos) << "the link was never cut:\n" << r.out;
  const double seconds = ended - std::stod(r.out.substr(at + mark.size()));
  std::printf("the job ended %.2f s after the link went down (timeout %g s, back after %g s)\n", seconds, kTimeout,
              kCutSeconds);
  // Until the link is back, then TCP's next retransmission of mpirun's abort, and a margin.
  EXPECT_LT(seconds, kCutSeconds + kKilledSeconds) << r.out;
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("for rank 1 (host "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("train.collective_timeout = 5 s"), std::string::npos) << r.out;
  expect_last_checkpoint_whole(out);
}

// A rank that loads slowly but steadily (its first 12 reads take a second each: three times the
// deadline of 4 s in all) tells the ranks that wait for it that it is busy: the job resumes.
TEST(Dist, ARankLoadingSlowlyIsNotTakenForHung) {
  REQUIRE_MPIRUN();
  // With sharded state each rank also reads its slice of the moments while restoring them.
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const fs::path out = scratch(std::string("slow_reads_") + file);
    ASSERT_EQ(loom_on(2, train_args(out, "train.eval_interval=0 optimizer.shard=state --steps 2")).status, 0);
    const RunResult r = loom_with_slow_disk(
        1, "pread", file, 1, "train --resume " + out.string() + " train.collective_timeout=4 --steps 3",
        "LOOM_SLOW_TIMES=12 ");
    ASSERT_EQ(r.status, 0) << file << ":\n" << r.out;
    EXPECT_EQ(r.out.find("waited"), std::string::npos) << file << ":\n" << r.out;
    EXPECT_TRUE(fs::exists(out / "ckpt_000003" / "state.json")) << r.out;
  }
}

// A fine-tune of the Hugging Face fixtures (tests/golden/hf/) on random tokens below 20, 10 steps.
fs::path fine_tune_config() {
  const fs::path config = scratch("params_init_config") / "ft.toml";
  std::ofstream(config) << R"(seed = 7
threads = 1
[optimizer]
name = "adamw"
learning_rate = 3e-3
clip_norm = 1.0
num_minibatches = 2
[data]
kind = "random_tokens"
vocab_size = 20
batch_size = 8
seq_len = 16
[train]
steps = 10
eval_interval = 0
)";
  return config;
}

// A rank that reads its part of a Hugging Face model slowly but steadily for model.init_from (its
// first 12 reads take a second each: three times the deadline of 4 s in all), while rank 0 waits
// for it in the first step's collectives, tells rank 0 that it is busy: the run trains. With
// sharded parameters each rank reads its slices; without, all of the model.
TEST(Dist, ARankLoadingAHuggingFaceModelSlowlyIsNotTakenForHung) {
  REQUIRE_MPIRUN();
  for (const char* shard : {"params", "none"}) {
    const fs::path out = scratch(std::string("slow_hf_") + shard);
    const RunResult r = loom_with_slow_disk(
        1, "pread", "model.safetensors", 1,
        fmt::format("train {} model.init_from={} optimizer.shard={} train.collective_timeout=4 --steps 2 --out {}",
                    fine_tune_config().string(), loom::testing::hf_golden("gpt2"), shard, out.string()),
        "LOOM_SLOW_TIMES=12 ");
    ASSERT_EQ(r.status, 0) << shard << ":\n" << r.out;
    EXPECT_EQ(r.out.find("waited"), std::string::npos) << shard << ":\n" << r.out;
    EXPECT_TRUE(fs::exists(out / "ckpt_000002" / "state.json")) << r.out;
  }
}

// ZeRO-3 fine-tuning (model.init_from): each rank reads its slice of every parameter out of a
// Hugging Face directory (GPT-2's permuted c_attn columns; Llama's transposed, q/k/v-packed
// matrices) or a loom run saved with stacked layers (model.scan_layers), and trains as
// optimizer.shard = state+grads does from the same model, bit for bit: both update their chunk
// from the same reduce-scattered sums, and the forward computes with the same values whether they
// stay whole or are gathered. A rank that loaded any element wrong starts from another model.
TEST(Dist, ShardedParametersFineTuneFromAHuggingFaceModelOrALoomRunLikeStateAndGrads) {
  REQUIRE_MPIRUN();
  const fs::path config = fine_tune_config();
  const fs::path stacked = scratch("params_init_stacked");
  ASSERT_EQ(loom_on(0, train_args(stacked, "model.scan_layers=true train.steps=5")).status, 0);
  for (const auto& [name, source, more] : {std::tuple{"gpt2", loom::testing::hf_golden("gpt2"), ""},
                                           std::tuple{"llama3", loom::testing::hf_golden("llama3"), ""},
                                           std::tuple{"stacked", stacked.string(), " model.scan_layers=true"}}) {
    std::map<std::string, fs::path> runs;
    for (const std::string mode : {"state+grads", "params"}) {
      runs[mode] = scratch(fmt::format("params_init_{}_{}", name, mode == "params" ? "params" : "grads"));
      const RunResult r =
          loom_on(2, fmt::format("train {} model.init_from={} optimizer.shard={}{} --out {} --overwrite",
                                 config.string(), source, mode, more, runs[mode].string()));
      ASSERT_EQ(r.status, 0) << name << " " << mode << ":\n" << r.out;
      EXPECT_NE(r.out.find("parameters from "), std::string::npos) << r.out;
    }
    const std::vector<double> grads = train_losses(runs["state+grads"]), params = train_losses(runs["params"]);
    ASSERT_FALSE(params.empty());
    EXPECT_EQ(params, grads) << name;
    expect_same_files(runs["state+grads"] / "ckpt_000010", runs["params"] / "ckpt_000010");
  }
}

// Sharded optimizer state streams to the checkpoint and back, and so do the parameters
// (train/checkpoint.h): the worker (tests/dist/worker/checkpoints.cpp) counts each rank's heap
// during a save and a resume of a model whose parameters and Adam moments (23 MiB each) dwarf the
// stream buffer, and fails unless a rank's high-water is `loom memory`'s checkpoint line up to a
// slack for names and headers: a rank that gathered whole moments again would hold 46 MiB more,
// one that read the parameters whole 23 MiB more.
// Its moments are a pure function of parameter and element, so one process, which writes them
// from its own buffers without any stream, is the oracle for the sharded saves' files; every
// resume checks every rank's slice.
TEST(Dist, ShardedCheckpointsStreamWithinThePlanAndResumeAtAnyRankCount) {
  REQUIRE_MPIRUN();
  const auto worker = [](int np, const std::string& args) {
    return shell((np ? mpirun(np) : std::string()) + LOOM_CHECKPOINT_WORKER + " " + args);
  };
  const fs::path one = scratch("stream_one") / "ckpt", two = scratch("stream_two") / "ckpt";
  RunResult r = worker(0, "save none " + one.string());
  ASSERT_EQ(r.status, 0) << r.out;
  std::printf("%s", r.out.c_str());
  r = worker(2, "save state " + two.string());
  ASSERT_EQ(r.status, 0) << r.out;
  std::printf("%s", r.out.c_str());
  EXPECT_EQ(count(r.out, "checkpoint streamed within the plan"), 2u) << r.out;
  expect_same_files(one, two);
  for (const auto& [np, shard] :
       {std::pair{0, "none"}, std::pair{2, "state"}, std::pair{3, "state+grads"}, std::pair{2, "params"}}) {
    const fs::path again = scratch(fmt::format("stream_again_{}", np)) / "ckpt";
    r = worker(np, fmt::format("resave {} {} {}", shard, two.string(), again.string()));
    ASSERT_EQ(r.status, 0) << np << " ranks:\n" << r.out;
    std::printf("%s", r.out.c_str());
    EXPECT_EQ(count(r.out, "checkpoint streamed within the plan"), static_cast<size_t>(std::max(np, 1))) << r.out;
    expect_same_files(two, again);
  }
  // The saved parameters, and a GPT-2 of the same size as a Hugging Face directory, as
  // model.init_from: each rank's slice read by offset, no more.
  const fs::path hf = scratch("stream_hf") / "gpt2";
  r = worker(0, "hf " + hf.string());
  ASSERT_EQ(r.status, 0) << r.out;
  for (const auto& [from, np, shard] :
       {std::tuple{two, 0, "none"}, std::tuple{two, 2, "params"}, std::tuple{two, 3, "params"},
        std::tuple{hf, 2, "params"}, std::tuple{hf, 3, "params"}}) {
    r = worker(np, fmt::format("init {} {}", shard, from.string()));
    ASSERT_EQ(r.status, 0) << from << ", " << np << " ranks:\n" << r.out;
    std::printf("%s", r.out.c_str());
    EXPECT_EQ(count(r.out, "parameters loaded within the plan"), static_cast<size_t>(std::max(np, 1))) << r.out;
  }
}

// Issue 29: the disk fills up while rank 0 writes a 2-rank checkpoint (each rank's writes past
// 150 KiB of a file fail with EFBIG: RLIMIT_FSIZE, under which the parameters fit; Open MPI warns
// that its shared memory file cannot grow, and copes): with the optimizer state sharded, while it
// streams the other rank's moments, and unsharded, while it writes its own copy.
// Every rank ends with the one error naming the file (no abort, no hang), nothing of the new
// checkpoint is left, and the job resumes from the last complete one as if it had never stopped.
TEST(Dist, AFullDiskDuringATwoRankSaveEndsEveryRankAndTheRunResumes) {
  REQUIRE_MPIRUN();
  for (const std::string mode : {"state", "none"}) {
    const std::string shard = "optimizer.shard=" + mode + " train.eval_interval=0 train.checkpoint_interval=5 ";
    const fs::path straight = scratch("full_straight_" + mode), out = scratch("full_disk_" + mode);
    ASSERT_EQ(loom_on(2, train_args(straight, shard + "--steps 10")).status, 0);
    ASSERT_EQ(loom_on(2, train_args(out, shard + "--steps 5")).status, 0);
    const std::vector<unsigned char> moments = file_bytes(out / "ckpt_000005" / "optimizer.safetensors");
    ASSERT_GT(moments.size(), 150u * 1024) << mode;
    RunResult r =
        shell(mpirun(2) + "prlimit --fsize=153600 " + LOOM_BINARY + " train --resume " + out.string() + " --steps 10");
    EXPECT_EQ(r.status, 2) << mode << ":\n" << r.out;  // every rank's UserError; 124 would be a hang, 134 an abort
    EXPECT_EQ(count(r.out, out.string() + "/.ckpt_000010.tmp/optimizer.safetensors: "), 1u) << mode << ":\n" << r.out;
    EXPECT_NE(r.out.find("File too large"), std::string::npos) << mode << ":\n" << r.out;
    EXPECT_NE(r.out.find("the last checkpoint, step 5, is intact"), std::string::npos) << mode << ":\n" << r.out;
    EXPECT_EQ(r.out.find("stopping every rank"), std::string::npos) << mode << ", not ended by MPI_Abort:\n" << r.out;
    EXPECT_TRUE(file_bytes(out / "ckpt_000005" / "optimizer.safetensors") == moments) << mode;
    EXPECT_FALSE(fs::exists(out / "ckpt_000010")) << mode;
    for (const auto& e : fs::directory_iterator(out))
      EXPECT_EQ(e.path().filename().string().find(".ckpt_"), std::string::npos) << e.path();
    r = loom_on(2, "train --resume " + out.string() + " --steps 10");
    ASSERT_EQ(r.status, 0) << mode << ":\n" << r.out;
    EXPECT_NE(r.out.find("resumed from"), std::string::npos) << mode << ":\n" << r.out;
    expect_identical(straight, out, "ckpt_000010");
  }
}

TEST(Dist, CheckpointsResumeWithAnyRankCount) {
  REQUIRE_MPIRUN();
  // References: one process with 2 and with 4 minibatches, 20 steps straight (clipped: the
  // fixture's clip_norm acts at every step).
  std::map<int, fs::path> straight;  // minibatches -> run
  for (int m : {2, 4}) {
    straight[m] = scratch("straight_" + std::to_string(m));
    ASSERT_EQ(loom_on(0, train_args(straight[m], "optimizer.num_minibatches=" + std::to_string(m))).status, 0);
  }
  struct Leg {
    int first_np, second_np;  // 0 = one process with 2·m minibatches, 2 = two ranks with m
    const char* shard;        // the two ranks' optimizer.shard
    int m = 1;
  };
  for (const Leg leg : {Leg{2, 0, "none"}, Leg{0, 2, "none"}, Leg{2, 2, "none"}, Leg{2, 0, "state"}, Leg{0, 2, "state"},
                        Leg{2, 0, "state+grads", 2}, Leg{0, 2, "state+grads", 2}}) {
    const std::string name = fmt::format("resume_{}_{}_{}_{}", leg.first_np, leg.second_np, leg.shard, leg.m);
    const fs::path out = scratch(name);
    const auto mb = [&](int np) {
      return fmt::format("optimizer.num_minibatches={}", np ? leg.m : 2 * leg.m) +
             (np ? " optimizer.shard=" + std::string(leg.shard) : "");
    };
    RunResult r = loom_on(leg.first_np, train_args(out, mb(leg.first_np) + " train.steps=10"));
    ASSERT_EQ(r.status, 0) << r.out;
    r = loom_on(leg.second_np, "train --resume " + out.string() + " train.steps=20 " + mb(leg.second_np));
    ASSERT_EQ(r.status, 0) << name << ":\n" << r.out;
    EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
    std::printf("%s against one process straight through:\n", name.c_str());
    expect_losses_close(train_losses(straight[2 * leg.m]), train_losses(out));
    expect_close(straight[2 * leg.m] / "ckpt_000020", out / "ckpt_000020");
  }
  // Same rank count: a resumed run is bit-identical to one straight through.
  const fs::path two = scratch("two_straight");
  ASSERT_EQ(loom_on(2, train_args(two)).status, 0);
  expect_identical(two, two.parent_path() / "resume_2_2_none_1", "ckpt_000020");
}

}  // namespace
