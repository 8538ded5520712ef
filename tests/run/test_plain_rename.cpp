// Checkpoints on file systems that refuse renameat2's flags (NFS, CephFS, 9p, FUSE): with
// LOOM_PLAIN_RENAME set, loom installs every checkpoint with plain renames (train/checkpoint.cpp,
// install_plain), as it does there. The whole RunSafety suite (kills at random instants, signals,
// corrupted files, forks) also runs once more that way (ctest run.safety_with_plain_rename).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <string>

#include "support/run_fixture.h"

namespace {

using namespace loom::testing;

std::string train(const fs::path& out, const std::string& extra) {
  return "train " + fixture().config.string() + " --out " + out.string() + " " + extra;
}

// Sets LOOM_PLAIN_RENAME for the loom processes the test starts, while it lives.
struct PlainRename {
  PlainRename() { setenv("LOOM_PLAIN_RENAME", "1", 1); }
  ~PlainRename() { unsetenv("LOOM_PLAIN_RENAME"); }
};

// Every evaluation improves on the tiny fixture early on, so best/ is replaced several times.
const std::string kArgs = "train.steps=10 train.eval_interval=2 train.checkpoint_interval=2 train.keep_last=2";

TEST(PlainRename, SavesAreTheSameFilesAsWithRenameat2) {
  const fs::path plain = scratch("plain"), flags = scratch("flags");
  {
    const PlainRename env;
    const Result r = run(train(plain, kArgs));
    ASSERT_EQ(r.status, 0) << r.out;
  }
  ASSERT_EQ(run(train(flags, kArgs)).status, 0);
  for (const char* dir : {"ckpt_000010", "best"})
    for (const char* file : {"model.safetensors", "optimizer.safetensors", "state.json"})
      EXPECT_EQ(file_bytes(plain / dir / file), file_bytes(flags / dir / file)) << dir << "/" << file;
  EXPECT_FALSE(fs::exists(plain / "ckpt_000006")) << "pruned";
  for (const auto& e : fs::directory_iterator(plain)) {
    const std::string n = e.path().filename().string();
    EXPECT_TRUE(n[0] != '.' || n == ".lock") << "left behind: " << n;
  }
}

TEST(PlainRename, AKillBetweenTheTwoRenamesKeepsTheOldCheckpoint) {
  const PlainRename env;
  const fs::path out = scratch("cut_swap");
  ASSERT_EQ(run(train(out, kArgs)).status, 0);
  const auto best = file_bytes(out / "best" / "model.safetensors");
  // What a kill after the first rename of a replacement of best/ leaves: the old one aside, the
  // new one staged (here cut short too), nothing under the name.
  fs::rename(out / "best", out / ".best.old");
  fs::create_directories(out / ".best.tmp");
  std::ofstream(out / ".best.tmp" / "model.safetensors") << "half";
  const Result r = run("train --resume " + out.string() + " train.steps=10");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(file_bytes(out / "best" / "model.safetensors"), best);
  EXPECT_FALSE(fs::exists(out / ".best.old"));
  EXPECT_FALSE(fs::exists(out / ".best.tmp"));
  const Result s = run("sample " + (out / "best").string() + " --tokens 3 --prompt T");
  EXPECT_EQ(s.status, 0) << s.out;
}

}  // namespace
