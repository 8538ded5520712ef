// Checkpoints on file systems that refuse renameat2's flags (NFS, CephFS, 9p, FUSE): with
// LOOM_PLAIN_RENAME set, loom installs every checkpoint with plain renames (train/checkpoint.cpp,
// install_plain), as it does there. The whole RunSafety suite (kills at random instants, signals,
// corrupted files, forks) also runs once more that way (ctest run.safety_with_plain_rename).
// And on a real FUSE mount, where loom finds the refusal out by itself.
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdio.h>
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

// A bindfs mount (FUSE; scripts/install-deps.sh installs bindfs) of a scratch directory while it
// lives; `why` says what kept it from mounting (no /dev/fuse in a container, not root).
struct FuseMount {
  fs::path at;
  std::string why;
  explicit FuseMount(const std::string& name) : at(scratch(name)) {
    const fs::path backing = scratch(name + "_backing");
    if (std::system("command -v bindfs > /dev/null 2>&1") != 0)
      why = "bindfs not found (scripts/install-deps.sh installs it)";
    else if (!fs::exists("/dev/fuse"))
      why = "no /dev/fuse here";
    else if (std::system(("bindfs " + backing.string() + " " + at.string() + " > /dev/null 2>&1").c_str()) != 0)
      why = "bindfs could not mount " + at.string() + " (FUSE mounts need root or user_allow_other)";
  }
  ~FuseMount() {
    if (why.empty())
      (void)std::system(("fusermount -u " + at.string() + " 2>/dev/null || umount " + at.string()).c_str());
  }
};

// On a FUSE mount, which answers renameat2's flags with EINVAL as NFS, CephFS and 9p do, a run
// without LOOM_PLAIN_RENAME saves, replaces best/ and prunes through the plain renames, leaves
// nothing staged, and resumes: the same files as the same run on the local disk.
TEST(PlainRename, ARunOnARealFuseMountFallsBackByItselfAndResumes) {
  const FuseMount mount("fuse");
  if (!mount.why.empty()) GTEST_SKIP() << mount.why;
  fs::create_directories(mount.at / "probe");
  ASSERT_NE(
      ::renameat2(AT_FDCWD, (mount.at / "probe").c_str(), AT_FDCWD, (mount.at / "probed").c_str(), RENAME_NOREPLACE), 0)
      << "this FUSE mount takes renameat2's flags: it tests nothing";
  EXPECT_EQ(errno, EINVAL);
  const fs::path out = mount.at / "run", local = scratch("fuse_local");
  for (const fs::path& dir : {out, local}) {
    const Result r = run(train(dir, kArgs));
    ASSERT_EQ(r.status, 0) << dir << ":\n" << r.out;
  }
  for (const char* dir : {"ckpt_000010", "best"})
    for (const char* file : {"model.safetensors", "optimizer.safetensors", "state.json"})
      EXPECT_EQ(file_bytes(out / dir / file), file_bytes(local / dir / file)) << dir << "/" << file;
  EXPECT_FALSE(fs::exists(out / "ckpt_000006")) << "pruned";
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string n = e.path().filename().string();
    EXPECT_TRUE(n[0] != '.' || n == ".lock") << "left behind: " << n;
  }
  for (const fs::path& dir : {out, local}) {
    const Result r = run("train --resume " + dir.string() + " train.steps=14");
    ASSERT_EQ(r.status, 0) << dir << ":\n" << r.out;
  }
  EXPECT_EQ(file_bytes(out / "ckpt_000014" / "model.safetensors"),
            file_bytes(local / "ckpt_000014" / "model.safetensors"));
}

}  // namespace
