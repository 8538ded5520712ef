// Shared by the run tests: a tiny char-level dataset and a config that trains in well under a
// second, run through the loom binary as a user would.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/run_loom.h"

namespace loom::testing {

namespace fs = std::filesystem;
using Result = RunResult;

inline Result run(const std::string& args) { return run_loom(args); }

// ctest runs each test case as its own process, two at a time: every process gets its own root.
inline fs::path scratch(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("loom_test_run_" + std::to_string(getpid())) / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// A small char-level dataset and config shared by the tests.
struct Fixture {
  fs::path dir, data, config;
  Fixture() {
    dir = scratch("fixture");
    std::string text;
    for (int i = 0; i < 400; ++i) text += "To be, or not to be, that is the question. ";
    std::ofstream(dir / "text.txt") << text;
    data = dir / "data";
    const Result r = run("prepare char " + (dir / "text.txt").string() + " " + data.string());
    EXPECT_EQ(r.status, 0) << r.out;
    config = dir / "tiny.toml";
    std::ofstream(config) << R"(seed = 7
[model]
kind = "transformer"
block_order = "attn_first"
hidden_size = 32
num_layers = 2
head_dim = 8
vocab_size = 20
num_outputs = 20
max_seq_len = 16
dropout_rate = 0.1
use_bias = false
tie_embeddings = true
init = "gpt2"
[optimizer]
name = "adamw"
learning_rate = 3e-3
weight_decay = 0.1
clip_norm = 1.0
schedule = "warmup_cosine_decay"
warmup_steps = 5
decay_steps = 20
end_value = 1e-4
num_minibatches = 2
[data]
kind = "tokens"
dir = ")" + data.string() + R"("
batch_size = 4
seq_len = 16
[train]
steps = 20
log_every = 1
eval_interval = 5
eval_iters = 3
)";
  }
};

inline const Fixture& fixture() {
  static const Fixture f;
  return f;
}

inline std::vector<double> logged_losses(const fs::path& metrics) {
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

inline std::vector<unsigned char> file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;  // in blocks: test code is unoptimised (tests/CMakeLists.txt)
  s << f.rdbuf();
  const std::string bytes = s.str();
  return {bytes.begin(), bytes.end()};
}

}  // namespace loom::testing
