// Training on chat data through the loom command: the token counts of the log's metrics.jsonl and
// of the run summary leave padding out and name the targets beside the tokens, and the validation
// loss is one pass over the split, the same whatever optimizer.num_minibatches.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/chat_dir.h"
#include "support/run_fixture.h"

namespace {

using namespace loom::testing;

struct ChatData {
  fs::path dir;
  int64_t val_targets = 0;  // the val split's targets that a position predicts (not an example's first token)
};

// Train: 12 examples of 9 tokens (8 positions in a row of 16, the rest padding), the last three
// tokens of each the targets. Val: 9 examples of 5 to 11 tokens, their targets spread unevenly.
// The fixture's char tokenizer (20 tokens) goes into meta.json.
const ChatData& chat_data() {
  static const ChatData d = [] {
    ChatData c;
    c.dir = scratch("chat_data");
    ChatSplitData train, val;
    for (int e = 0; e < 12; ++e) {
      train.docs.push_back(train.tokens.size());
      for (int i = 0; i < 9; ++i) {
        train.tokens.push_back(static_cast<uint16_t>(1 + (e * 5 + i * 3) % 19));
        train.mask.push_back(i >= 6 ? 1 : 0);
      }
    }
    train.docs.push_back(train.tokens.size());
    for (int e = 0; e < 9; ++e) {
      val.docs.push_back(val.tokens.size());
      for (int i = 0; i < 5 + e % 7; ++i) {
        val.tokens.push_back(static_cast<uint16_t>(1 + (e * 7 + i * 2) % 19));
        val.mask.push_back((i * e) % 3 == 1 ? 1 : 0);
        if (i > 0) c.val_targets += val.mask.back();
      }
    }
    val.docs.push_back(val.tokens.size());
    std::ifstream meta(fixture().data / "meta.json");
    write_chat_dir(c.dir, train, val, 20, nlohmann::json::parse(meta)["tokenizer"]);
    return c;
  }();
  return d;
}

// The fixture's model on the chat data: 10 steps of 4 rows in 2 minibatches, evaluated every 5.
Result train_on_chat(const fs::path& out) {
  return run("train " + fixture().config.string() + " data.dir=" + chat_data().dir.string() +
             " train.steps=10 model.dropout_rate=0 --out " + out.string());
}

std::string summary_line(const std::string& out, const std::string& label) {
  const size_t at = out.find("\n  " + label + " ", out.find("run summary"));
  if (at == std::string::npos) return "";
  return out.substr(at + 3, out.find('\n', at + 1) - at - 3);
}

// Every step trains 4 rows of 8 tokens (32, not the 64 positions) and 12 targets.
TEST(ChatRun, TokenCountsLeavePaddingOutAndNameTheTargets) {
  const fs::path out = scratch("chat_counts");
  const Result r = train_on_chat(out);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(summary_line(r.out, "tokens").find("320 trained, 120 of them targets (37.5%)"), std::string::npos) << r.out;
  std::ifstream f(out / "metrics.jsonl");
  int64_t steps = 0;
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    ++steps;
    EXPECT_EQ(j["tokens"], 32 * j["step"].get<int64_t>()) << line;
    EXPECT_EQ(j["targets"], 12 * j["step"].get<int64_t>()) << line;
    EXPECT_GT(j["tokens_per_s"].get<double>(), 0) << line;
  }
  EXPECT_EQ(steps, 10);
}

// The validation loss and its count of target tokens are one pass over the val split's rows,
// the same for 1, 2 and 4 minibatches (to float32 rounding of the partial sums).
TEST(ChatRun, ValidationIsOnePassWhateverTheMinibatches) {
  const fs::path out = scratch("chat_val");
  const Result r = train_on_chat(out);
  ASSERT_EQ(r.status, 0) << r.out;
  std::vector<double> losses;
  for (int m : {1, 2, 4}) {
    const Result e =
        run("eval " + (out / "ckpt_000010").string() + " --json optimizer.num_minibatches=" + std::to_string(m));
    ASSERT_EQ(e.status, 0) << e.out;
    const auto j = nlohmann::json::parse(e.out);
    EXPECT_EQ(j["val"]["tokens"], chat_data().val_targets) << "num_minibatches " << m;
    losses.push_back(j["val"]["loss"].get<double>());
  }
  ASSERT_GT(chat_data().val_targets, 0);
  for (double l : losses) EXPECT_NEAR(l, losses[0], 1e-6 * losses[0]) << "1, 2, 4 minibatches";
}

}  // namespace
