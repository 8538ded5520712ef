// The loom command as a user runs it: bad configs, overrides and files each give a clear
// message naming the key or file, and a nonzero exit status.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

struct Result {
  int status;
  std::string out;  // stdout and stderr together
};

Result run(const std::string& args) {
  const std::string cmd = std::string("cd ") + LOOM_SOURCE_DIR + " && " + LOOM_BINARY + " " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  while (size_t n = fread(buf.data(), 1, buf.size(), f)) out.append(buf.data(), n);
  const int st = pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

std::string write_config(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::temp_directory_path() / "loom_test_cli";
  std::filesystem::create_directories(dir);
  const auto p = dir / name;
  std::ofstream(p) << text;
  return p.string();
}

const char* kBase = R"(
[model]
kind = "mlp_classifier"
dtype = "float32"
hidden_size = 16
num_classes = 10
[data]
batch_size = 8
num_inputs = 4
[train]
steps = 1
)";

TEST(Cli, UnknownKeyIsNamed) {
  const auto p = write_config("unknown.toml", std::string(kBase) + "\n[optimizer]\nlearning_rat = 0.1\n");
  const Result r = run("train " + p);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("optimizer.learning_rat"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("unknown configuration key"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("optimizer.learning_rate"), std::string::npos) << "should suggest the known keys: " << r.out;
}

TEST(Cli, WrongTypeIsNamed) {
  const auto p = write_config("type.toml", std::string(kBase) + "\n[optimizer]\nlearning_rate = \"fast\"\n");
  const Result r = run("train " + p);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("optimizer.learning_rate"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("expected a number"), std::string::npos) << r.out;
}

TEST(Cli, BatchNotDivisibleByMinibatches) {
  const auto p = write_config("div.toml", kBase);
  const Result r = run("train " + p + " optimizer.num_minibatches=3");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("not divisible by optimizer.num_minibatches"), std::string::npos) << r.out;
}

TEST(Cli, MissingFileIsNamed) {
  const Result r = run("train /nonexistent/loom.toml");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("/nonexistent/loom.toml"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cannot open"), std::string::npos) << r.out;
}

TEST(Cli, BadOverrideValueIsNamed) {
  const auto p = write_config("ovr.toml", kBase);
  Result r = run("train " + p + " optimizer.learning_rate=abc");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("optimizer.learning_rate"), std::string::npos) << r.out;
  r = run("train " + p + " model.dtype=float8");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("model.dtype"), std::string::npos) << r.out;
  r = run("train " + p + " model.hiden_size=3");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("model.hiden_size"), std::string::npos) << r.out;
}

TEST(Cli, InvalidTomlPointsAtTheLine) {
  const auto p = write_config("syntax.toml", "[model\nkind = 1\n");
  const Result r = run("train " + p);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find(p + ":1"), std::string::npos) << r.out;
}

TEST(Cli, TrainsAndPrintsTutorialMetrics) {
  const auto p = write_config("ok.toml", kBase);
  const Result r = run("train " + p + " --steps 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("== Minibatch 1 ="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\naccuracy: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nloss: "), std::string::npos) << r.out;
}

TEST(Cli, ParamsTableCountsTheTutorialMlp) {
  const Result r = run("params configs/mlp_classifier.toml");
  ASSERT_EQ(r.status, 0) << r.out;
  // Dense(128->256) + LayerNorm(256) + Dense(256->100) = 33,024 + 512 + 25,700.
  EXPECT_NE(r.out.find("59,236"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Dense_0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("LayerNorm_0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bfloat16[512, 256]"), std::string::npos) << "outputs in the configured dtype: " << r.out;
}

}  // namespace
