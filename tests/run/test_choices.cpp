// Multiple-choice scoring (run/choices.h) on the tiny Llama fixture: a continuation's
// log-likelihood equals the one transformers' logits give (tests/golden/hf, the oracle), the
// tokens are split as lm-eval's _encode_pair splits them, acc and acc_norm follow lm-eval's
// argmaxes, and `loom eval --choices` reports them and names a bad line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "io/safetensors.h"
#include "run/choices.h"
#include "support/run_loom.h"
#include "train/model_source.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

const std::string kModel = std::string(LOOM_SOURCE_DIR) + "/tests/golden/hf/llama_tied";

struct Model {
  ModelSource src{kModel};
  std::unique_ptr<Backend> be = make_backend(Device::cpu);
  Sampler s{src.config(), *be};
  std::unique_ptr<Tokenizer> tok = src.tokenizer();
  Model() { src.load_params(s.executor()); }
};

TEST(Choices, LogLikelihoodIsTransformers) {
  std::map<std::string, StTensor> e;
  for (StTensor& t : read_safetensors(kModel + "/expected.safetensors")) e.emplace(t.name, std::move(t));
  const StTensor& in = e.at("inputs");  // [2, 8] i32
  const StTensor& lg = e.at("logits");  // [2, 8, 321] f32: transformers' LlamaForCausalLM
  std::vector<int32_t> ids(16);
  std::memcpy(ids.data(), in.bytes.data(), 64);
  std::vector<float> logits(2 * 8 * 321);
  std::memcpy(logits.data(), lg.bytes.data(), logits.size() * 4);
  Model m;
  for (int row = 0; row < 2; ++row)
    for (int k : {1, 3, 6}) {
      const std::span<const int32_t> seq(ids.data() + row * 8, 8);
      double want = 0;  // Σ_t log softmax(logits[t - 1])[ids[t]], t = k..7
      for (int t = k; t < 8; ++t) {
        const float* l = logits.data() + (row * 8 + t - 1) * 321;
        double mx = l[0], sum = 0;
        for (int v = 0; v < 321; ++v) mx = std::max(mx, static_cast<double>(l[v]));
        for (int v = 0; v < 321; ++v) sum += std::exp(l[v] - mx);
        want += l[seq[static_cast<size_t>(t)]] - mx - std::log(sum);
      }
      const double got =
          continuation_loglikelihood(m.s, seq.first(static_cast<size_t>(k)), seq.subspan(static_cast<size_t>(k)));
      EXPECT_NEAR(got, want, 1e-4 * std::fabs(want)) << "row " << row << " k " << k;
    }
}

// The scores of a question, from the rule (encode the context with its trailing spaces moved,
// the continuation's tokens after the context's in the whole) and lm-eval's argmaxes; one
// question where acc and acc_norm disagree is found among a few, so both are seen to differ.
TEST(Choices, ScoresFollowLmEval) {
  Model m;
  bool disagreed = false;
  for (const auto& [a, b] : {std::pair{"day", "evening light"},
                             {"ok", "wonderful things"},
                             {"be", "beautiful"},
                             {"a", "abcdefgh"},
                             {"the", "the other"}}) {
    ChoiceQuestion q{.context = "Once upon a ", .choices = {a, b}, .label = 1, .line = 1};
    const ChoiceResult r = score_question(m.s, *m.tok, q, "q");
    const std::vector<int32_t> ctx = m.tok->encode("Once upon a");
    double ll[2], norm[2];
    for (int i = 0; i < 2; ++i) {
      const std::vector<int32_t> whole = m.tok->encode("Once upon a " + q.choices[static_cast<size_t>(i)]);
      ll[i] = continuation_loglikelihood(m.s, ctx, std::span<const int32_t>(whole).subspan(ctx.size()));
      norm[i] = ll[i] / static_cast<double>(q.choices[static_cast<size_t>(i)].size());  // ASCII: bytes = characters
      EXPECT_EQ(r.loglikelihoods[static_cast<size_t>(i)], ll[i]) << a;
    }
    EXPECT_EQ(r.correct, ll[1] > ll[0]) << a;
    EXPECT_EQ(r.correct_norm, norm[1] > norm[0]) << a;
    disagreed |= r.correct != r.correct_norm;
  }
  EXPECT_TRUE(disagreed) << "no question had acc and acc_norm disagree: choose others";
}

TEST(Choices, CliReportsAccuracyAndNamesABadLine) {
  const fs::path dir = fs::temp_directory_path() / ("loom_test_choices_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "q.jsonl") << R"({"context": "Once upon a ", "choices": ["day", "evening light"], "label": 0})"
                                 << "\n\n"
                                 << R"({"context": "Once upon a ", "choices": ["day", "evening light"], "label": 1})"
                                 << "\n";
  const auto r = testing::run_loom("eval " + kModel + " --choices " + (dir / "q.jsonl").string() + " --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["questions"], 2);
  EXPECT_EQ(j["acc"], 0.5);  // the same choices with either label: one of the two is right
  EXPECT_EQ(j["acc_norm"], 0.5);
  EXPECT_EQ(j["cut_contexts"], 0);
  // A context past the fixture's 64 positions is scored on a window, and that is said.
  std::string long_context;
  for (int k = 0; k < 80; ++k) long_context += "once upon a time ";
  std::ofstream(dir / "long.jsonl") << R"({"context": ")" + long_context + R"(", "choices": ["day", "night"], "label": 0})"
                                    << "\n"
                                    << R"({"context": "Once", "choices": ["day", "night"], "label": 0})"
                                    << "\n";
  const auto cut = testing::run_loom("eval " + kModel + " --choices " + (dir / "long.jsonl").string() + " --json");
  ASSERT_EQ(cut.status, 0) << cut.out;
  EXPECT_EQ(nlohmann::json::parse(cut.out)["cut_contexts"], 1) << cut.out;
  const auto note = testing::run_loom("eval " + kModel + " --choices " + (dir / "long.jsonl").string());
  ASSERT_EQ(note.status, 0) << note.out;
  EXPECT_NE(note.out.find("note: 1 question(s) longer than the model's 64 positions"), std::string::npos) << note.out;
  std::ofstream(dir / "bad.jsonl") << R"({"context": "a", "choices": ["b", "c"], "label": 0})"
                                   << "\n"
                                   << R"({"context": "a", "choices": ["b", "c"], "label": 2})"
                                   << "\n";
  const auto bad = testing::run_loom("eval " + kModel + " --choices " + (dir / "bad.jsonl").string());
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_NE(bad.out.find("bad.jsonl:2: label"), std::string::npos) << bad.out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom
