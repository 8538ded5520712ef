// A training run as a user drives it through the loom command: prepare data, train into a run
// directory, resume exactly, and every kind of bad input (data, checkpoints, run directories,
// a full disk) stops with a clear message and leaves what was on disk intact.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "io/safetensors.h"
#include "support/run_loom.h"
#include "support/tiny_run.h"

namespace fs = std::filesystem;

namespace {

using Result = loom::testing::RunResult;

Result run(const std::string& args) { return loom::testing::run_loom(args); }

// ctest runs each test case as its own process, two at a time: every process gets its own root.
fs::path scratch(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("loom_test_run_" + std::to_string(getpid())) / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// A small char-level dataset and config shared by the tests (support/tiny_run.h).
struct Fixture {
  fs::path dir, data, config;
  Fixture() {
    dir = scratch("fixture");
    const loom::testing::TinyRun t = loom::testing::make_tiny_run(dir);
    EXPECT_EQ(t.prepared.status, 0) << t.prepared.out;
    data = t.data;
    config = t.config;
  }
};

const Fixture& fixture() {
  static const Fixture f;
  return f;
}

std::vector<double> logged_losses(const fs::path& metrics) {
  std::vector<double> out;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
    if (j.contains("val_loss")) out.push_back(j["val_loss"].get<double>());
  }
  return out;
}

std::vector<unsigned char> file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

TEST(Run, ResumeContinuesBitIdentically) {
  const Fixture& fx = fixture();
  const fs::path straight = scratch("straight"), split = scratch("split");
  Result r = run("train " + fx.config.string() + " --out " + straight.string() + " --overwrite");
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("train " + fx.config.string() + " train.steps=10 --out " + split.string() + " --overwrite");
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("train --resume " + split.string() + " train.steps=20");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  // Every logged loss (train and validation) and every parameter byte agree.
  EXPECT_EQ(logged_losses(straight / "metrics.jsonl"), logged_losses(split / "metrics.jsonl"));
  const auto a = loom::read_safetensors((straight / "ckpt_000020" / "model.safetensors").string());
  const auto b = loom::read_safetensors((split / "ckpt_000020" / "model.safetensors").string());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_TRUE(a[i].bytes == b[i].bytes) << a[i].name;
  }
  EXPECT_TRUE(fs::exists(straight / "best" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(straight / "ckpt_000020" / "tokenizer.json"));
}

TEST(Run, RefusesADirectoryHoldingAnotherRun) {
  const Fixture& fx = fixture();
  const fs::path out = scratch("occupied");
  ASSERT_EQ(run("train " + fx.config.string() + " train.steps=5 --out " + out.string()).status, 0);
  const auto before = file_bytes(out / "metrics.jsonl");
  const Result r = run("train " + fx.config.string() + " train.steps=5 --out " + out.string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("already holds a run"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--overwrite"), std::string::npos) << r.out;
  EXPECT_EQ(file_bytes(out / "metrics.jsonl"), before) << "nothing of the old run may change";
  EXPECT_EQ(run("train " + fx.config.string() + " train.steps=5 --out " + out.string() + " --overwrite").status, 0);
}

TEST(Run, RefusesToResumeADifferentModel) {
  const Fixture& fx = fixture();
  const fs::path out = scratch("different");
  ASSERT_EQ(run("train " + fx.config.string() + " train.steps=5 --out " + out.string()).status, 0);
  const Result r = run("train " + fx.config.string() + " model.num_layers=3 --resume " + out.string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("model.num_layers"), std::string::npos) << r.out;
}

TEST(Run, CorruptedCheckpointsAreNamed) {
  const Fixture& fx = fixture();
  const fs::path out = scratch("corrupt");
  ASSERT_EQ(run("train " + fx.config.string() + " train.steps=5 --out " + out.string()).status, 0);
  const fs::path ck = out / "ckpt_000005", model = ck / "model.safetensors";
  const auto good = file_bytes(model);
  auto expect_refused = [&](const std::string& what) {
    const Result r = run("train --resume " + ck.string() + " train.steps=8");
    EXPECT_EQ(r.status, 2) << what << ": " << r.out;
    EXPECT_NE(r.out.find("model.safetensors"), std::string::npos) << what << ": " << r.out;
  };
  {  // truncated
    std::ofstream(model, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(good.data()), good.size() / 2);
    expect_refused("truncated");
  }
  {  // bad header length
    auto bad = good;
    bad[6] = 0x7f;
    std::ofstream(model, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(bad.data()), bad.size());
    expect_refused("bad header");
  }
  {  // a tensor with the wrong size, and a missing tensor: rewrite the file with loom's writer
    std::ofstream(model, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(good.data()), good.size());
    auto ts = loom::read_safetensors(model.string());
    auto wrong = ts;
    wrong[0].shape = loom::Shape{wrong[0].shape.numel()};  // same bytes, wrong shape
    loom::write_safetensors(model.string(), wrong);
    expect_refused("wrong shape");
    ts.erase(ts.begin());
    loom::write_safetensors(model.string(), ts);
    expect_refused("missing tensor");
  }
  {  // state.json that is not JSON
    std::ofstream(ck / "state.json", std::ios::trunc) << "{ not json";
    const Result r = run("train --resume " + ck.string());
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_NE(r.out.find("state.json"), std::string::npos) << r.out;
  }
}

TEST(Run, BadDataIsNamed) {
  const Fixture& fx = fixture();
  const fs::path d = scratch("baddata");
  std::ofstream(d / "empty.txt");
  Result r = run("prepare char " + (d / "empty.txt").string() + " " + (d / "out").string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("empty.txt"), std::string::npos) << r.out;
  r = run("prepare char " + (d / "missing.txt").string() + " " + (d / "out").string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("missing.txt"), std::string::npos) << r.out;
  // A token id >= vocab size in train.bin.
  fs::copy(fx.data, d / "data", fs::copy_options::recursive);
  {
    std::fstream f(d / "data" / "train.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    const unsigned char bad[2] = {0xff, 0x00};
    f.write(reinterpret_cast<const char*>(bad), 2);
  }
  r = run("train " + fx.config.string() + " data.dir=" + (d / "data").string() + " train.steps=1 --out " +
          (d / "run").string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("train.bin"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("255"), std::string::npos) << r.out;
  r = run("train " + fx.config.string() + " data.dir=" + (d / "nowhere").string() + " train.steps=1 --out " +
          (d / "run2").string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("nowhere"), std::string::npos) << r.out;
}

TEST(Run, DiskFullWhileSavingKeepsThePreviousCheckpoint) {
  const Fixture& fx = fixture();
  const fs::path out = scratch("diskfull");
  ASSERT_EQ(run("train " + fx.config.string() + " train.steps=5 --out " + out.string()).status, 0);
  const auto before = file_bytes(out / "ckpt_000005" / "model.safetensors");
  // Resume with a file-size limit smaller than a checkpoint: saving step 10 must fail cleanly.
  const pid_t pid = fork();
  if (pid == 0) {
    struct rlimit lim {
      4096, 4096
    };
    setrlimit(RLIMIT_FSIZE, &lim);
    signal(SIGXFSZ, SIG_IGN);
    const std::string args =
        "train --resume " + out.string() + " train.steps=10 > " + (out / "log.txt").string() + " 2>&1";
    execl("/bin/sh", "sh", "-c", (std::string(LOOM_BINARY) + " " + args).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT_NE(WEXITSTATUS(st), 0);
  EXPECT_EQ(file_bytes(out / "ckpt_000005" / "model.safetensors"), before);
  EXPECT_FALSE(fs::exists(out / "ckpt_000010")) << "no half-written checkpoint";
  for (const auto& e : fs::directory_iterator(out))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  // And the run resumes from the surviving checkpoint.
  const Result r = run("train --resume " + out.string() + " train.steps=10");
  EXPECT_EQ(r.status, 0) << r.out;
}

}  // namespace
