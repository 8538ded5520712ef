// The loom command as a user runs it: the installed binary (the install.loom fixture puts it in
// a prefix inside the build tree), started from a scratch directory, not the source tree. Bad
// configs, overrides and files each give a clear message naming the key or file, and status 2.
#include <gtest/gtest.h>
#include <unistd.h>

#include "support/run_loom.h"

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace {

using Result = loom::testing::RunResult;

// ctest runs test cases as separate processes, two at a time: one scratch directory each.
const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    const auto d = std::filesystem::temp_directory_path() / ("loom_test_cli_" + std::to_string(getpid()));
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

Result run(const std::string& args) { return loom::testing::run_loom(args, scratch().string(), LOOM_INSTALLED_BINARY); }

// A configuration shipped in configs/, by absolute path.
std::string shipped(const std::string& name) { return std::string(LOOM_SOURCE_DIR) + "/configs/" + name; }

std::string write_config(const std::string& name, const std::string& text) {
  const auto p = scratch() / name;
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

TEST(Cli, InstalledBinaryPrintsVersionAndCommit) {
  ASSERT_TRUE(std::filesystem::exists(LOOM_INSTALLED_BINARY)) << "the install.loom fixture did not install loom";
  const Result r = run("--version");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.rfind("loom 0.", 0), 0u) << r.out;
  const size_t git = r.out.find("(git ");
  ASSERT_NE(git, std::string::npos) << r.out;
  EXPECT_GT(r.out.find(')', git), git + 5) << "names a commit: " << r.out;
}

TEST(Cli, TrainsAndPrintsTutorialMetrics) {
  const auto p = write_config("ok.toml", kBase);
  const Result r = run("train " + p + " --steps 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("== Minibatch 1 ="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\naccuracy: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nloss: "), std::string::npos) << r.out;
}

// The Transformer's configuration mistakes (issue: bad input), each named by its key.
TEST(Cli, TransformerConfigErrorsNameTheKey) {
  const std::string tf = "train " + shipped("tutorial_transformer.toml") + " ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model.hidden_size=1000", "model.hidden_size"},  // not a multiple of head_dim 128
      {"data.seq_len=1024", "data.seq_len"},            // above max_seq_len 512
      {"model.num_outputs=0", "model.num_outputs"},
      {"model.dtype=float64", "model.dtype"},
      {"model.softmax_dtype=int8", "model.softmax_dtype"},
      {"optimizer.schedule=linear_warmup", "optimizer.schedule"},
      {"optimizer.learning_rate=fast", "optimizer.learning_rate"},
      {"optimizer.learning_rate=nan", "optimizer.learning_rate"},
      {"model.remat=Everything", "model.remat"},
      {"model.remat_policy=save_some", "model.remat_policy"},
      {"optimizer.decay_steps=5 optimizer.schedule=warmup_cosine_decay optimizer.warmup_steps=10",
       "optimizer.decay_steps"},
  };
  for (const auto& [ov, key] : cases) {
    const Result r = run(tf + ov + " --steps 0");
    EXPECT_EQ(r.status, 2) << ov << ": " << r.out;
    EXPECT_NE(r.out.find(key), std::string::npos) << ov << ": " << r.out;
    EXPECT_NE(r.out.find("fix:"), std::string::npos) << ov << " gives no fix: " << r.out;
  }
}

TEST(Cli, TutorialTransformerHasTheTutorialsParameterCount) {
  const Result r = run("params " + shipped("tutorial_transformer.toml"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("155,877,376"), std::string::npos) << r.out;
  const Result g = run("params " + shipped("gpt2_124m.toml"));
  ASSERT_EQ(g.status, 0) << g.out;
  EXPECT_NE(g.out.find("124,439,808"), std::string::npos) << g.out;
}

TEST(Cli, MemoryReportJsonHasTheDocumentedKeys) {
  const Result r = run("memory " + shipped("tutorial_transformer.toml") + " --json");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* k : {"total_bytes", "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
                        "workspace_bytes", "lower_bound_bytes", "plan_ms", "largest_at_peak"})
    EXPECT_NE(r.out.find(std::string("\"") + k + "\""), std::string::npos) << k;
  const Result s =
      run("memory " + shipped("tutorial_transformer.toml") + " --sweep model.remat=none,MLP+Attn --budget 4GiB");
  ASSERT_EQ(s.status, 0) << s.out;
  EXPECT_NE(s.out.find("NO"), std::string::npos) << "no remat does not fit in 4 GiB: " << s.out;
  EXPECT_NE(s.out.find("yes"), std::string::npos) << "MLP+Attn remat fits in 4 GiB (its plan is 2.9-3.1 GiB by host ISA): " << s.out;
}

TEST(Cli, ParamsTableCountsTheTutorialMlp) {
  const Result r = run("params " + shipped("mlp_classifier.toml"));
  ASSERT_EQ(r.status, 0) << r.out;
  // Dense(128->256) + LayerNorm(256) + Dense(256->100) = 33,024 + 512 + 25,700.
  EXPECT_NE(r.out.find("59,236"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Dense_0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("LayerNorm_0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bfloat16[512, 256]"), std::string::npos) << "outputs in the configured dtype: " << r.out;
}

}  // namespace

namespace {

// README, "Exit status": 2 for every mistake in what the user typed, CLI11's own included.
TEST(CliExit, UsageMistakesExitTwoWithAFix) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "no command given"},
      {"trian", "unknown command 'trian' (did you mean train?)"},
      {"train --bogus", "--bogus"},
      {"train " + shipped("mlp_classifier.toml") + " --steps -1", "--steps"},
      {"train " + shipped("mlp_classifier.toml") + " --steps 99999999999999999999", "too large"},
      {"train " + shipped("mlp_classifier.toml") + " --steps ten", "'ten' is not an integer"},
      {"sample", "checkpoint is required"},
      {"help nothing", "unknown topic"},
      {"train " + shipped("mlp_classifier.toml") + " hidden_size=64", "did you mean model.hidden_size?"},
  };
  for (const auto& [args, says] : cases) {
    const Result r = run(args);
    EXPECT_EQ(r.status, 2) << "loom " << args << ": " << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << "loom " << args << ": " << r.out;
    EXPECT_NE(r.out.find("fix:"), std::string::npos) << "loom " << args << ": " << r.out;
  }
}

TEST(CliExit, HelpAndVersionSucceed) {
  for (const char* args : {"--help", "train --help", "help", "help train", "--version"}) {
    const Result r = run(args);
    EXPECT_EQ(r.status, 0) << args << ": " << r.out;
  }
}

// A failure while running that is no mistake in the input exits 1: here the metrics file's
// directory is a file, so it cannot be created.
TEST(CliExit, FailureWhileRunningExitsOne) {
  const auto p = write_config("fail.toml", kBase);
  std::ofstream(scratch() / "blocker") << "a file, not a directory\n";
  const Result r = run("train " + p + " train.metrics_file=" + (scratch() / "blocker" / "m.jsonl").string());
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("loom: failed:"), std::string::npos) << r.out;
}

// `loom help config` and `loom --help-config` list every key, and under each choice key every
// name (data.kind's tokens included).
TEST(CliHelp, ConfigHelpAtTheTopLevelListsEveryKeyAndChoice) {
  const Result a = run("help config"), b = run("--help-config"), c = run("train --help-config");
  ASSERT_EQ(a.status, 0) << a.out;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.out, c.out);
  for (const char* s : {"model.hidden_size", "data.kind", "random_classification", "random_tokens", "tokens ",
                        "optimizer.schedule", "warmup_cosine_decay", "train.on_nonfinite", "train.steps"})
    EXPECT_NE(a.out.find(s), std::string::npos) << s;
}

// Sizes read the same in every report: binary units from one formatter.
TEST(CliUnits, ParamsAndMemoryUseTheSameUnits) {
  const Result p = run("params " + shipped("mlp_classifier.toml"));
  const Result m = run("memory " + shipped("mlp_classifier.toml"));
  ASSERT_EQ(p.status, 0) << p.out;
  ASSERT_EQ(m.status, 0) << m.out;
  EXPECT_NE(p.out.find("(231.4 KiB)"), std::string::npos) << "59,236 float32 parameters: " << p.out;
  EXPECT_NE(m.out.find("231.4 KiB"), std::string::npos) << "the same bytes in the same unit: " << m.out;
  EXPECT_EQ(p.out.find(" MB"), std::string::npos) << p.out;
  EXPECT_EQ(m.out.find("0.00 GiB"), std::string::npos) << m.out;
  EXPECT_NE(m.out.find("\n  (root) "), std::string::npos) << "the root scope is named, not '': " << m.out;
}

}  // namespace

namespace {

// README, "Paths": inside a config file a relative path is relative to the file; on the command
// line, to the current directory; ~ is the home directory. loom runs here from scratch(), away
// from both.
// A small char-level project under scratch(): project/text.txt prepared into project/data, and
// project/configs/tiny.toml naming both relative to itself.
const std::filesystem::path& tiny_project() {
  static const std::filesystem::path project = [] {
    const auto p = scratch() / "project";
    std::filesystem::create_directories(p / "configs");
    std::string text;
    for (int i = 0; i < 200; ++i) text += "It was the best of times, it was the worst of times. ";
    std::ofstream(p / "text.txt") << text;
    const Result r = run("prepare char " + (p / "text.txt").string() + " " + (p / "data").string());
    EXPECT_EQ(r.status, 0) << r.out;
    std::ofstream(p / "configs" / "tiny.toml") << R"([model]
kind = "transformer"
hidden_size = 16
num_layers = 1
head_dim = 8
vocab_size = 32
num_outputs = 32
max_seq_len = 8
[data]
kind = "tokens"
dir = "../data"
batch_size = 2
seq_len = 8
[train]
steps = 1
metrics_file = "../logs/metrics.jsonl"
eval_iters = 3
)";
    return p;
  }();
  return project;
}

TEST(CliPaths, ConfigPathsAreRelativeToTheFileOverridesToTheWorkingDirectory) {
  const auto& project = tiny_project();
  const std::string cfg = (project / "configs" / "tiny.toml").string();
  std::filesystem::create_directories(project / "logs");
  Result r = run("train " + cfg + " --out run1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(std::filesystem::exists(project / "logs" / "metrics.jsonl")) << "metrics_file is relative to the config";
  std::ifstream saved(scratch() / "run1" / "config.toml");  // --out is relative to the working directory
  const std::string saved_text{std::istreambuf_iterator<char>(saved), {}};
  EXPECT_NE(saved_text.find("dir = \"" + (project / "data").string() + "\""), std::string::npos)
      << "the saved config names the data absolutely: " << saved_text;

  // An override is relative to the working directory: "data" here is scratch()/data, which is not there.
  r = run("train " + cfg + " data.dir=data --out run2");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find((scratch() / "data").string() + ": no such directory"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("relative to that file"), std::string::npos) << "the fix explains the rule: " << r.out;
  EXPECT_FALSE(std::filesystem::exists(scratch() / "run2")) << "a refused run leaves no directory";
  r = run("train " + cfg + " data.dir=project/data --out run3");
  EXPECT_EQ(r.status, 0) << r.out;

  // ~ is the home directory.
  r = loom::testing::run_loom("train " + cfg + " data.dir=~/data --out run4", scratch().string(),
                              "HOME=" + project.string() + " " + LOOM_INSTALLED_BINARY);
  EXPECT_EQ(r.status, 0) << r.out;
  // Also in a path flag the shell does not expand (--out=~/...) or a quoted path: no directory named ~.
  r = loom::testing::run_loom("train " + cfg + " --out=~/run5", scratch().string(),
                              "HOME=" + project.string() + " " + LOOM_INSTALLED_BINARY);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(std::filesystem::exists(project / "run5" / "config.toml")) << r.out;
  EXPECT_FALSE(std::filesystem::exists(scratch() / "~")) << r.out;
  r = loom::testing::run_loom("eval '~/run5' --iters 1", scratch().string(),
                              "HOME=" + project.string() + " " + LOOM_INSTALLED_BINARY);
  EXPECT_EQ(r.status, 0) << r.out;
}

// A profiled run that samples at the end: the trainer (which the profiler holds) is released
// before the sample loads the checkpoint, and the profiler with it (a review found the profiler
// outliving the trainer). The tiny project's text has no newline for the sample to start from:
// the run says so and still succeeds, its checkpoint saved; with text that has one, it samples.
TEST(CliPaths, AProfiledRunSamplesAtTheEnd) {
  const std::string cfg = (tiny_project() / "configs" / "tiny.toml").string();
  std::filesystem::create_directories(tiny_project() / "logs");  // the config's metrics_file
  const std::string args = " train.steps=2 train.eval_interval=1 train.sample_tokens=8 --profile ";
  Result r = run("train " + cfg + args + (scratch() / "profile_a").string() + " --out sampled_a");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("no sample: --prompt: is empty and the vocabulary has no newline"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::exists(scratch() / "sampled_a" / "ckpt_000002" / "state.json")) << r.out;

  const auto lines = scratch() / "lines";
  std::filesystem::create_directories(lines);
  std::string text;
  for (int i = 0; i < 200; ++i) text += "It was the best of times,\nit was the worst of times.\n";
  std::ofstream(lines / "text.txt") << text;
  r = run("prepare char " + (lines / "text.txt").string() + " " + (lines / "data").string());
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("train " + cfg + " data.dir=" + (lines / "data").string() + args + (scratch() / "profile_b").string() +
          " --out sampled_b");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("sample (8 tokens"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("no sample"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::exists(scratch() / "profile_b" / "summary.json")) << r.out;
}

}  // namespace

namespace {

// `loom eval`: a checkpoint's loss without training. At step 5 the run evaluated the first
// eval_iters validation batches, as `loom eval` does: the same numbers.
TEST(CliEval, EvaluatesACheckpointAsTheRunDid) {
  const std::string cfg = (tiny_project() / "configs" / "tiny.toml").string();
  const auto run_dir = scratch() / "evalrun";
  Result r = run("train " + cfg + " train.steps=5 train.eval_interval=5 train.metrics_file= --out " + run_dir.string());
  ASSERT_EQ(r.status, 0) << r.out;
  const size_t at = r.out.find("step 5: val loss ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string logged = r.out.substr(at + 17, 6);

  r = run("eval " + (run_dir / "ckpt_000005").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("val    loss " + logged), std::string::npos) << "logged " << logged << ": " << r.out;
  EXPECT_EQ(r.out.find("train "), std::string::npos) << r.out;

  r = run("eval " + run_dir.string() + " --train --json");  // a run directory: its latest checkpoint
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* k : {"\"val\"", "\"train\"", "\"accuracy\"", "\"tokens\": 48", "\"step\": 5"})
    EXPECT_NE(r.out.find(k), std::string::npos) << k << ": " << r.out;

  // A config with the checkpoint to evaluate; one whose model differs is refused.
  r = run("eval " + cfg + " --checkpoint " + run_dir.string() + " --iters 3");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("val    loss " + logged), std::string::npos) << r.out;
  r = run("eval " + cfg + " model.hidden_size=32 --checkpoint " + run_dir.string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("model.hidden_size differs"), std::string::npos) << r.out;
  r = run("eval " + cfg);  // runs/tiny under the working directory: none
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--checkpoint"), std::string::npos) << r.out;
}

}  // namespace

namespace {

// `loom plot RUN` writes a PNG of the run's curves with gnuplot; without gnuplot it says which
// package to install. train.tensorboard = true adds an event file beside metrics.jsonl.
TEST(CliPlot, DrawsTheCurvesAndNamesGnuplotWhenMissing) {
  const std::string cfg = (tiny_project() / "configs" / "tiny.toml").string();
  const auto run_dir = scratch() / "plotrun";
  Result r =
      run("train " + cfg + " train.steps=6 train.eval_interval=3 train.metrics_file= train.tensorboard=true --out " +
          run_dir.string());
  ASSERT_EQ(r.status, 0) << r.out;
  bool events = false;
  for (const auto& e : std::filesystem::directory_iterator(run_dir))
    events = events || e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  EXPECT_TRUE(events) << "train.tensorboard writes an event file in the run directory";
  const Result no_dir = run("train " + write_config("tb.toml", kBase) + " train.tensorboard=true");
  EXPECT_EQ(no_dir.status, 2) << "random data has no run directory for the events: " << no_dir.out;
  EXPECT_NE(no_dir.out.find("train.tensorboard"), std::string::npos) << no_dir.out;

  // No gnuplot on PATH: a usage error naming the package.
  r = loom::testing::run_loom("plot " + run_dir.string(), scratch().string(),
                              std::string("PATH=/nonexistent ") + LOOM_INSTALLED_BINARY);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("gnuplot-nox"), std::string::npos) << r.out;
  EXPECT_EQ(run("plot " + (scratch() / "no_run").string()).status, 2);

  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) GTEST_SKIP() << "gnuplot is not installed";
  r = run("plot " + run_dir.string());
  ASSERT_EQ(r.status, 0) << r.out;
  std::ifstream png(run_dir / "curves.png", std::ios::binary);
  char sig[8] = {};
  png.read(sig, 8);
  EXPECT_EQ(std::string(sig, 8), "\x89PNG\r\n\x1a\n") << "a PNG file";
  r = run("plot " + (run_dir / "metrics.jsonl").string() + " --out other.png");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(std::filesystem::exists(scratch() / "other.png")) << "--out is relative to the working directory";
}

}  // namespace

namespace {

// metrics.jsonl as runs write it in two cases the first test's run does not reach: a skipped
// step's non-finite loss is null (train.on_nonfinite = skip), and a run stopped before its first
// logged step holds only evaluations. Both still plot; gnuplot is not handed an empty panel.
TEST(CliPlot, PlotsSkippedStepsAndEvaluationsOnly) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) GTEST_SKIP() << "gnuplot is not installed";
  std::ofstream(scratch() / "skipped.jsonl")
      << R"({"accuracy":0.2,"loss":3.1,"lr":0.001,"mfu":0.04,"step":1,"step_time_s":0.1,"tokens_per_s":900})"
         "\n"
      << R"({"accuracy":0.2,"loss":null,"lr":0.0,"mfu":0.04,"step":2,"step_time_s":0.1,"tokens_per_s":900})"
         "\n"
      << R"({"accuracy":0.3,"loss":2.9,"lr":0.001,"mfu":0.05,"step":3,"step_time_s":0.1,"tokens_per_s":950})"
         "\n";
  Result r = run("plot skipped.jsonl --out skipped.png");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(std::filesystem::exists(scratch() / "skipped.png")) << r.out;

  std::ofstream(scratch() / "val_only.jsonl") << R"({"best_val_loss":2.6,"step":50,"val_loss":2.6})"
                                                 "\n";
  r = run("plot val_only.jsonl --out val_only.png");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(std::filesystem::exists(scratch() / "val_only.png")) << r.out;
}

}  // namespace

namespace {

// loom plot's scratch files go into a directory of its own making: one that another user made in
// advance under the name it would use (loom_plot_<pid> once), with a link inside, is not written
// through. `exec` keeps the shell's pid for loom, so the test knows that name.
TEST(CliPlot, ScratchFilesDoNotFollowALinkPlantedInTmp) {
  const auto tmp = scratch() / "shared_tmp";
  std::filesystem::create_directories(tmp);
  std::ofstream(scratch() / "precious.txt") << "precious\n";
  std::ofstream(scratch() / "plant.jsonl") << R"({"loss":3.0,"lr":0.001,"step":1,"tokens_per_s":900})"
                                              "\n";
  std::ofstream(scratch() / "plant.sh") << "mkdir -p \"$TMPDIR/loom_plot_$$\" && ln -s \"$VICTIM\" "
                                           "\"$TMPDIR/loom_plot_$$/metrics.dat\"\nexec "
                                        << LOOM_INSTALLED_BINARY << " \"$@\"\n";
  const Result r = loom::testing::run_loom(
      "plot plant.jsonl --out plant.png", scratch().string(),
      "TMPDIR=" + tmp.string() + " VICTIM=" + (scratch() / "precious.txt").string() + " sh plant.sh");
  std::ifstream victim(scratch() / "precious.txt");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(victim), {}), "precious\n") << r.out;
}

}  // namespace
