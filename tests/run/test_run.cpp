// A training run as a user drives it through the loom command: prepare data, train into a run
// directory, resume exactly, and every kind of bad input (data, checkpoints, run directories,
// a full disk) stops with a clear message and leaves what was on disk intact.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "support/files.h"
#include "support/run_fixture.h"

namespace fs = std::filesystem;

namespace {

using namespace loom::testing;

// A resume reads each parameter and moment by offset from the located checkpoint files: by path,
// stacked per layer (model.scan_layers, each layer at its offset in the stacked tensor), and from a
// format-1 checkpoint, whose moments lie in model.safetensors beside the parameters.
TEST(Run, ResumeContinuesBitIdentically) {
  const Fixture& fx = fixture();
  for (const std::string layout : {"by_path", "stacked", "format1"}) {
    const std::string over = layout == "stacked" ? " model.scan_layers=true" : "";
    const fs::path straight = scratch("straight_" + layout), split = scratch("split_" + layout);
    Result r = run("train " + fx.config.string() + over + " --out " + straight.string() + " --overwrite");
    ASSERT_EQ(r.status, 0) << r.out;
    r = run("train " + fx.config.string() + over + " train.steps=10 --out " + split.string() + " --overwrite");
    ASSERT_EQ(r.status, 0) << r.out;
    if (layout == "format1") {
      const fs::path ck = split / "ckpt_000010";
      std::vector<loom::StTensor> all = loom::read_safetensors((ck / "model.safetensors").string());
      for (loom::StTensor& t : loom::read_safetensors((ck / "optimizer.safetensors").string()))
        all.push_back(std::move(t));
      loom::write_safetensors((ck / "model.safetensors").string(), all);
      fs::remove(ck / "optimizer.safetensors");
      // Format 1 wrote no "format" into state.json: with "format": 2 the missing file is damage.
      nlohmann::json state = nlohmann::json::parse(read_file((ck / "state.json").string()));
      state.erase("format");
      write_file((ck / "state.json").string(), state.dump(2));
    }
    r = run("train --resume " + split.string() + " train.steps=20");
    ASSERT_EQ(r.status, 0) << layout << ": " << r.out;
    EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
    // Every logged loss (train and validation) and every parameter byte agree.
    EXPECT_EQ(logged_losses(straight / "metrics.jsonl"), logged_losses(split / "metrics.jsonl")) << layout;
    const auto a = loom::read_safetensors((straight / "ckpt_000020" / "model.safetensors").string());
    const auto b = loom::read_safetensors((split / "ckpt_000020" / "model.safetensors").string());
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].name, b[i].name);
      EXPECT_TRUE(a[i].bytes == b[i].bytes) << layout << ": " << a[i].name;
    }
    EXPECT_TRUE(fs::exists(straight / "best" / "model.safetensors"));
    EXPECT_TRUE(fs::exists(straight / "ckpt_000020" / "tokenizer.json"));
  }
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

// A run that stopped before its first save (killed while loading, a full disk, divergence at step
// 1) holds no checkpoint: starting it again is refused pointing at --overwrite, not at a --resume
// that would only say there is nothing to resume.
TEST(Run, ARunWithoutACheckpointPointsAtOverwrite) {
  const Fixture& fx = fixture();
  const fs::path out = scratch("no_checkpoint");
  ASSERT_EQ(run("train " + fx.config.string() + " train.steps=2 --out " + out.string()).status, 0);
  for (const auto& e : fs::directory_iterator(out))
    if (e.path().filename().string().rfind("ckpt_", 0) == 0 || e.path().filename() == "best") fs::remove_all(e.path());
  const Result r = run("train " + fx.config.string() + " train.steps=2 --out " + out.string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("stopped before its first checkpoint"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--overwrite"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("--resume"), std::string::npos) << r.out;
  const Result resume = run("train --resume " + out.string());
  EXPECT_EQ(resume.status, 2) << resume.out;
  EXPECT_NE(resume.out.find("stopped before its first checkpoint"), std::string::npos) << resume.out;
  EXPECT_NE(resume.out.find("--overwrite"), std::string::npos) << resume.out;
  EXPECT_EQ(run("train " + fx.config.string() + " train.steps=2 --out " + out.string() + " --overwrite").status, 0);
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

// A pretrained model's vocabulary is fixed: data with more tokens than model.init_from's model
// has was tokenized with another tokenizer, and the message says so rather than suggesting a
// larger model.vocab_size.
TEST(Run, DataOfAnotherTokenizerIsNamedAgainstInitFrom) {
  const Fixture& fx = fixture();
  const fs::path d = scratch("other_tokenizer");
  ASSERT_EQ(run("train " + fx.config.string() + " train.steps=1 --out " + (d / "base").string()).status, 0);
  {
    std::ofstream f(d / "wide.txt");
    for (int i = 0; i < 100; ++i) f << "abcdefghijklmnopqrstuvwxyz 0123456789\n";
  }
  ASSERT_EQ(run("prepare char " + (d / "wide.txt").string() + " " + (d / "wide").string()).status, 0);
  const Result r = run("train " + fx.config.string() + " train.steps=1 model.init_from=" + (d / "base").string() +
                       " data.dir=" + (d / "wide").string() + " --out " + (d / "tuned").string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("model.init_from (" + (d / "base").string() + ") has 20"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokenized with another tokenizer"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("set model.vocab_size"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d / "tuned"));
}

TEST(Run, DiskFullWhileSavingKeepsThePreviousCheckpoint) {
  const Fixture& fx = fixture();
  const fs::path out = scratch("diskfull");
  ASSERT_EQ(run("train " + fx.config.string() + " train.steps=5 --out " + out.string()).status, 0);
  const auto before = file_bytes(out / "ckpt_000005" / "model.safetensors");
  // Resume with a file-size limit smaller than a checkpoint (`ulimit -f`): saving step 10 must fail
  // cleanly. SIGXFSZ keeps its default action here (killing the process): loom ignores it itself.
  const pid_t pid = fork();
  if (pid == 0) {
    struct rlimit lim {
      4096, 4096
    };
    setrlimit(RLIMIT_FSIZE, &lim);
    signal(SIGXFSZ, SIG_DFL);
    const std::string args =
        "train --resume " + out.string() + " train.steps=10 > " + (out / "log.txt").string() + " 2>&1";
    execl("/bin/sh", "sh", "-c", (std::string(LOOM_BINARY) + " " + args).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st)) << "killed by signal " << WTERMSIG(st);
  EXPECT_NE(WEXITSTATUS(st), 0);
  const std::string log = loom::testing::read_file((out / "log.txt").string());
  EXPECT_NE(log.find("File too large"), std::string::npos) << log;
  EXPECT_EQ(file_bytes(out / "ckpt_000005" / "model.safetensors"), before);
  EXPECT_FALSE(fs::exists(out / "ckpt_000010")) << "no half-written checkpoint";
  for (const auto& e : fs::directory_iterator(out))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  // And the run resumes from the surviving checkpoint.
  const Result r = run("train --resume " + out.string() + " train.steps=10");
  EXPECT_EQ(r.status, 0) << r.out;
}

// `loom ARGS` where a write past `kib` KiB of a file fails with EFBIG, as on a full disk, without
// root (RLIMIT_FSIZE, set by util-linux's prlimit in bytes: `ulimit -f` counts 512-byte blocks in
// dash and KiB in bash; loom ignores the SIGXFSZ that would kill it).
Result run_with_file_limit(const std::string& args, int kib) {
  return loom::testing::run_loom(args, {}, "prlimit --fsize=" + std::to_string(kib * 1024) + " " + LOOM_BINARY);
}

// No name in the run directory that an interrupted save or prune leaves (.ckpt_*.tmp, .best.old,
// .ckpt_*.del): only the lock file starts with a dot.
void expect_no_staged_files(const fs::path& run_dir) {
  for (const auto& e : fs::directory_iterator(run_dir)) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name[0] != '.' || name == ".lock") << e.path();
  }
}

// Issue 29: a disk that fills up while a checkpoint is written (here the optimizer state, past the
// file-size limit; the parameters fit) ends the run with an error naming the file, what is kept
// and how to go on, leaves nothing of the new checkpoint, and the run resumes from the last complete
// one exactly as if it had never stopped.
TEST(Run, AFullDiskEndsTheRunNamingTheFileAndItResumesAsIfUninterrupted) {
  const Fixture& fx = fixture();
  const fs::path straight = scratch("full_straight"), out = scratch("full");
  ASSERT_EQ(run("train " + fx.config.string() + " --out " + straight.string()).status, 0);
  ASSERT_EQ(run("train " + fx.config.string() + " train.steps=5 --out " + out.string()).status, 0);
  const auto params = file_bytes(out / "ckpt_000005" / "model.safetensors");
  const auto moments = file_bytes(out / "ckpt_000005" / "optimizer.safetensors");
  constexpr int kKib = 150;  // above model.safetensors, below optimizer.safetensors (twice its size)
  ASSERT_LT(params.size(), kKib * 1024u);
  ASSERT_GT(moments.size(), kKib * 1024u);
  Result r = run_with_file_limit("train --resume " + out.string() + " train.steps=20", kKib);
  EXPECT_EQ(r.status, 2) << r.out;  // a UserError, not a crash (134) or a signal (-1)
  EXPECT_NE(r.out.find(out.string() + "/.best.tmp/optimizer.safetensors: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("File too large"), std::string::npos) << r.out;
  EXPECT_NE(
      r.out.find("the new best/ was not saved (the one before is intact), the last checkpoint, step 5, is intact"),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("raise the limit, or write to another file system; then resume with `loom train --resume " +
                       out.string() + "`"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(file_bytes(out / "ckpt_000005" / "model.safetensors"), params);
  EXPECT_EQ(file_bytes(out / "ckpt_000005" / "optimizer.safetensors"), moments);
  EXPECT_FALSE(fs::exists(out / "ckpt_000010"));
  expect_no_staged_files(out);
  r = run("train --resume " + out.string() + " train.steps=20");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  EXPECT_EQ(logged_losses(straight / "metrics.jsonl"), logged_losses(out / "metrics.jsonl"));
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(file_bytes(straight / "ckpt_000020" / file), file_bytes(out / "ckpt_000020" / file)) << file;
}

}  // namespace

namespace {

using namespace loom::testing;

std::string fmt_loss(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

// The value after `label` on the summary's line (issue 19: the end of a run reports the last
// step's loss and the validation losses, not an average over the run labelled final).
std::string summary_line(const std::string& out, const std::string& label) {
  const size_t at = out.find("\n  " + label + " ", out.find("run summary"));
  if (at == std::string::npos) return "";
  return out.substr(at + 3, out.find('\n', at + 1) - at - 3);
}

// model.remat = auto may train in more minibatches than the configuration gives: the opening line
// says the count it trains with, the one its "remat auto:" line chose.
TEST(Run, TheOpeningLineSaysTheMinibatchesAutoRematChose) {
  const Fixture& fx = fixture();
  const std::string args = "train " + fx.config.string() +
                           " model.remat=auto train.steps=1 train.eval_interval=0 --out " +
                           scratch("remat_auto").string() + " --overwrite train.memory_budget=";
  // The smallest plan's exact bytes, from the refusal of a budget nothing fits.
  Result r = run(args + "1");
  ASSERT_EQ(r.status, 2) << r.out;
  const size_t open = r.out.find(" B;");
  ASSERT_NE(open, std::string::npos) << r.out;
  const std::string smallest = r.out.substr(r.out.rfind('(', open) + 1, open - r.out.rfind('(', open) - 1);
  r = run(args + smallest);
  ASSERT_EQ(r.status, 0) << r.out;
  const size_t at = r.out.find("remat auto: ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string chosen = r.out.substr(at, r.out.find('\n', at) - at);
  const size_t in = chosen.find(" in ") + 4;
  const std::string minibatches = chosen.substr(in, chosen.find(" minibatch", in) - in);
  ASSERT_NE(minibatches, "2") << "the fixture's own count: the test would not tell the two apart";
  EXPECT_NE(r.out.find("batch 4 in " + minibatches + " minibatches"), std::string::npos) << r.out;
}

TEST(RunSummary, ReportsTheLastLossTheValidationLossesAndTheCost) {
  const Fixture& fx = fixture();
  const fs::path out = scratch("summary");
  const Result r = run("train " + fx.config.string() + " --out " + out.string());  // 20 steps, eval every 5
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("Final metrics"), std::string::npos) << "no run average under a 'final' title: " << r.out;
  EXPECT_NE(r.out.find("run summary (steps 1-20 of 20)"), std::string::npos) << r.out;
  std::vector<double> losses, vals, elapsed;
  std::ifstream f(out / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) losses.push_back(j["loss"].get<double>());
    if (j.contains("val_loss")) vals.push_back(j["val_loss"].get<double>());
    if (j.contains("val_loss")) elapsed.push_back(j.value("elapsed_s", -1.0));
  }
  ASSERT_EQ(losses.size(), 20u);
  ASSERT_EQ(vals.size(), 4u);
  // Each evaluation row says when it ended (time to a loss): positive and increasing.
  EXPECT_GT(elapsed.front(), 0) << "val rows carry elapsed_s";
  EXPECT_TRUE(std::is_sorted(elapsed.begin(), elapsed.end()) && elapsed.front() < elapsed.back());
  EXPECT_NE(summary_line(r.out, "loss").find(fmt_loss(losses.back())), std::string::npos) << r.out;
  const size_t best = std::min_element(vals.begin(), vals.end()) - vals.begin();
  const std::string val = summary_line(r.out, "val loss");
  EXPECT_NE(val.find(fmt_loss(vals.back()) + " at step 20 (last)"), std::string::npos) << val;
  EXPECT_NE(val.find("best " + fmt_loss(vals[best]) + " at step " + std::to_string(5 * (best + 1))), std::string::npos)
      << val;
  EXPECT_NE(summary_line(r.out, "tokens").find("1,280 trained"), std::string::npos) << "20 steps x 4 x 16";
  EXPECT_NE(summary_line(r.out, "wall time").find("evaluation"), std::string::npos) << r.out;
  EXPECT_NE(summary_line(r.out, "throughput").find("tok/s"), std::string::npos) << r.out;

  // Resumed: the whole run's tokens and this session's, and the best loss kept from before.
  const fs::path split = scratch("summary_resumed");
  ASSERT_EQ(run("train " + fx.config.string() + " train.steps=10 --out " + split.string()).status, 0);
  const Result resumed = run("train --resume " + split.string() + " train.steps=20");
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("run summary (steps 11-20 of 20, resumed)"), std::string::npos) << resumed.out;
  EXPECT_NE(summary_line(resumed.out, "tokens").find("1,280 trained (640 this session)"), std::string::npos)
      << resumed.out;
  EXPECT_NE(summary_line(resumed.out, "val loss").find("best " + fmt_loss(vals[best])), std::string::npos)
      << resumed.out;
}

}  // namespace
