// What `loom train --resume` says when there is little to say: a resume that leaves nothing to
// train says so (and changes nothing), and a damaged checkpoint's bytes never reach the terminal
// raw (train/checkpoint.cpp escapes them).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "support/run_fixture.h"

namespace {

using namespace loom::testing;

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

TEST(ResumeMessages, StepsAtOrBelowTheCheckpointSayNothingIsTrained) {
  const fs::path out = scratch("nothing");
  ASSERT_EQ(run("train " + fixture().config.string() + " train.steps=10 --out " + out.string()).status, 0);
  const std::string metrics = read(out / "metrics.jsonl");
  for (const auto& [steps, below] : {std::pair{"6", true}, std::pair{"10", false}}) {
    const Result r = run("train --resume " + out.string() + " --steps " + steps);
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find(std::string("nothing to train: the checkpoint is at step 10 and train.steps (--steps) is ") +
                         steps + (below ? ", below it" : "") + "; nothing was changed"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("step 11/"), std::string::npos) << r.out;
    EXPECT_EQ(read(out / "metrics.jsonl"), metrics);
    EXPECT_TRUE(fs::exists(out / "ckpt_000010"));
  }
}

TEST(ResumeMessages, ADamagedHeadersBytesAreEscaped) {
  const fs::path out = scratch("damaged_header");
  ASSERT_EQ(run("train " + fixture().config.string() + " train.steps=2 --out " + out.string()).status, 0);
  const fs::path model = out / "ckpt_000002" / "model.safetensors";
  std::string bytes = read(model);
  // Inside the JSON header (after its 8-byte length), a tensor name's first letter becomes a byte
  // that is not UTF-8 and an escape character: what a flipped bit or a foreign file can hold.
  const size_t name = bytes.find("\"", bytes.find("{", 8) + 1) + 1;
  ASSERT_LT(name, 100u);
  bytes[name] = '\xff';
  bytes[name + 1] = '\x1b';
  std::ofstream(model, std::ios::binary | std::ios::trunc) << bytes;
  const Result r = run("train --resume " + (out / "ckpt_000002").string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find(model.string()), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\xff'), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\\xff"), std::string::npos) << r.out;
}

}  // namespace
