// A run directory's files that loom did not write are never deleted or written over (run/run_dir.h),
// with or without loom-run.json, --overwrite or not: a new run that would have to replace one is
// refused, naming it, before anything changes.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "run/run_dir.h"
#include "support/run_fixture.h"

namespace {

using namespace loom::testing;

std::string read(const fs::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), {}};
}

std::string train(const fs::path& out, const std::string& extra) {
  return "train " + fixture().config.string() + " train.steps=2 --out " + out.string() + " " + extra;
}

TEST(RunDirOwner, OverwriteKeepsTheUsersConfigAndMetricsWithoutAMarker) {
  for (const std::string flag : {"--overwrite", ""}) {
    const fs::path out = scratch("users_files");
    std::ofstream(out / "config.toml") << "# my own notes on the run\nlr = 3\n";
    std::ofstream(out / "metrics.jsonl") << "{\"step\": 1, \"loss\": 9}\n";
    std::ofstream(out / "notes.txt") << "mine";
    const Result r = run(train(out, flag));
    EXPECT_EQ(r.status, 2) << flag << "\n" << r.out;
    EXPECT_NE(r.out.find((out / "config.toml").string() + ": is not a config.toml loom wrote"), std::string::npos)
        << r.out;
    EXPECT_EQ(read(out / "config.toml"), "# my own notes on the run\nlr = 3\n");
    EXPECT_EQ(read(out / "metrics.jsonl"), "{\"step\": 1, \"loss\": 9}\n");
    EXPECT_EQ(read(out / "notes.txt"), "mine");
    EXPECT_FALSE(fs::exists(out / "loom-run.json"));

    fs::remove(out / "config.toml");  // a metrics.jsonl alone is no more loom's
    const Result m = run(train(out, flag));
    EXPECT_EQ(m.status, 2) << m.out;
    EXPECT_NE(m.out.find((out / "metrics.jsonl").string() + ": is not known to be loom's"), std::string::npos) << m.out;
    EXPECT_EQ(read(out / "metrics.jsonl"), "{\"step\": 1, \"loss\": 9}\n");
  }
}

TEST(RunDirOwner, OverwriteOfALoomRunKeepsAUsersConfigPutThere) {
  const fs::path out = scratch("marked");
  ASSERT_EQ(run(train(out, "")).status, 0);
  std::ofstream(out / "config.toml") << "# my own\n";  // replaces loom's, beside loom's marker
  const Result r = run(train(out, "--overwrite"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(read(out / "config.toml"), "# my own\n");
  EXPECT_TRUE(fs::exists(out / "ckpt_000002")) << "a refused run deletes nothing";
}

// A checkpoint replacement cut between its two renames (train/checkpoint.h, plain renames) leaves
// the old checkpoint as .best.old: --overwrite removes it with the rest, and no new run finds the
// old run's weights under best/.
TEST(RunDirOwner, OverwriteRemovesACheckpointLeftBetweenTheRenamesOfAReplacement) {
  const fs::path out = scratch("cut_replacement");
  ASSERT_EQ(run(train(out, "")).status, 0);
  fs::rename(out / "ckpt_000002", out / ".best.old");
  std::ofstream(out / ".best.old" / "old-run.txt") << "the previous run's";
  const Result r = run(train(out, "--overwrite train.eval_interval=0"));  // writes no best/ of its own
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(fs::exists(out / "best" / "old-run.txt")) << "the old run's checkpoint came back as best/";
  EXPECT_FALSE(fs::exists(out / ".best.old"));
}

// Under a checkpoint's name (best, ckpt_<digits>) only loom's checkpoint directory is loom's: a
// user's file, a directory without state.json, or a symbolic link (even to a loom checkpoint) is
// refused by name, --overwrite or not, and stays as it was.
TEST(RunDirOwner, AUsersEntryUnderACheckpointsNameIsRefused) {
  const fs::path elsewhere = scratch("elsewhere");
  ASSERT_EQ(run(train(elsewhere, "")).status, 0);
  struct Case {
    std::string name, what;
    std::function<void(const fs::path&)> make;
  };
  const std::vector<Case> cases = {
      {"best", "is a file", [](const fs::path& p) { std::ofstream(p) << "USERDATA\n"; }},
      {"ckpt_000002", "is a file", [](const fs::path& p) { std::ofstream(p) << "USERDATA\n"; }},
      {"best", "is a directory without loom's state.json",
       [](const fs::path& p) {
         fs::create_directory(p);
         std::ofstream(p / "notes.txt") << "USERDATA\n";
       }},
      {"ckpt_000001", "is a symbolic link",
       [&](const fs::path& p) { fs::create_directory_symlink(elsewhere / "ckpt_000002", p); }},
  };
  for (const Case& c : cases)
    for (const std::string flag : {"", "--overwrite"}) {
      const fs::path out = scratch("users_checkpoint_name");
      c.make(out / c.name);
      const Result r = run(train(out, flag));
      EXPECT_EQ(r.status, 2) << c.name << " " << flag << "\n" << r.out;
      EXPECT_NE(r.out.find((out / c.name).string() + ": " + c.what + ", not a checkpoint loom wrote"),
                std::string::npos)
          << r.out;
      if (fs::is_symlink(out / c.name))
        EXPECT_EQ(fs::read_symlink(out / c.name), elsewhere / "ckpt_000002");
      else if (fs::is_directory(out / c.name))
        EXPECT_EQ(read(out / c.name / "notes.txt"), "USERDATA\n") << c.name << " " << flag;
      else
        EXPECT_EQ(read(out / c.name), "USERDATA\n") << c.name << " " << flag;
      EXPECT_FALSE(fs::exists(out / "loom-run.json")) << "a refused run writes nothing";
      EXPECT_FALSE(fs::exists(out / "config.toml")) << "a refused run writes nothing";
    }
  EXPECT_TRUE(fs::exists(elsewhere / "ckpt_000002" / "state.json"));
}

// Resuming in place, the names the run can still write (best, a later ckpt_<step>) are checked
// before anything is built or trained, as a new run's are: a user's entry there is refused by
// name, not at the first save after steps were spent, and nothing in the directory changes. An
// earlier step's name is never written again: a user's entry there does not stop the resume.
TEST(RunDirOwner, AResumeInPlaceRefusesAUsersEntryItWouldWriteBeforeAnyStep) {
  const fs::path out = scratch("resume_users_entry");
  ASSERT_EQ(run(train(out, "train.eval_interval=0")).status, 0);
  const std::string metrics = read(out / "metrics.jsonl"), config = read(out / "config.toml"),
                    marker = read(out / "loom-run.json");
  struct Case {
    std::string name, what;
    bool dir;
  };
  for (const Case& c :
       {Case{"ckpt_000004", "is a file", false}, Case{"ckpt_000003", "is a directory without loom's state.json", true},
        Case{"best", "is a file", false}}) {
    if (c.dir) fs::create_directory(out / c.name);
    std::ofstream(c.dir ? out / c.name / "notes.txt" : out / c.name) << "USERDATA\n";
    const Result r = run("train --resume " + out.string() + " train.steps=4");
    EXPECT_EQ(r.status, 2) << c.name << "\n" << r.out;
    EXPECT_NE(r.out.find((out / c.name).string() + ": " + c.what + ", not a checkpoint loom wrote"), std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("program:"), std::string::npos) << "refused before the trainer is built:\n" << r.out;
    EXPECT_EQ(read(c.dir ? out / c.name / "notes.txt" : out / c.name), "USERDATA\n") << c.name;
    EXPECT_EQ(read(out / "metrics.jsonl"), metrics) << c.name;
    EXPECT_EQ(read(out / "config.toml"), config) << c.name;
    EXPECT_EQ(read(out / "loom-run.json"), marker) << c.name;
    EXPECT_FALSE(fs::exists(out / "ckpt_000004" / "state.json")) << c.name;
    fs::remove_all(out / c.name);
  }
  std::ofstream(out / "ckpt_000001") << "USERDATA\n";
  const Result r = run("train --resume " + out.string() + " train.steps=4");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(fs::exists(out / "ckpt_000004" / "state.json"));
  EXPECT_EQ(read(out / "ckpt_000001"), "USERDATA\n");
}

TEST(RunDirOwner, LoomsOwnFilesAreReplacedWithOrWithoutTheMarker) {
  const fs::path out = scratch("legacy");
  ASSERT_EQ(run(train(out, "")).status, 0);
  fs::remove(out / "loom-run.json");  // a run made before the marker existed: loom's config.toml vouches
  const Result r = run(train(out, "train.steps=1 --overwrite"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(fs::exists(out / "ckpt_000002"));
  EXPECT_TRUE(fs::exists(out / "ckpt_000001"));
  EXPECT_EQ(read(out / "config.toml").rfind(loom::kConfigHeader, 0), 0u);
}

}  // namespace
