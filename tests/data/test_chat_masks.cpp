// Chat data's loss masks reach the batches (data/data.h, data/token_data.h): a label is
// kIgnoreLabel exactly where the mask byte of the token it predicts (the one after the input) is
// 0, in training and validation batches; the inputs are the tokens whatever the mask. data.loss_on
// picks the targets at train time from the stored mask, and a split without targets is refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "data/data.h"
#include "support/chat_dir.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

struct Dir {
  fs::path path = fs::temp_directory_path() / ("loom_test_chat_masks_" + std::to_string(getpid()));
  Dir() { fs::remove_all(path); }
  ~Dir() { fs::remove_all(path); }
};

// Token i is i, in examples of 17 tokens (a row of 16 positions each, so a row's first input tells
// which example it holds); the mask follows no period a shift by one could match.
void splits(testing::ChatSplitData& train, testing::ChatSplitData& val) {
  for (uint16_t i = 0; i < 17 * 17; ++i) {
    train.tokens.push_back(i);
    train.mask.push_back((i * i / 7 + i / 5) % 3 == 0 ? 1 : 0);
  }
  val.tokens.assign(train.tokens.begin(), train.tokens.begin() + 17 * 5);
  val.mask.assign(train.mask.begin() + 11, train.mask.begin() + 11 + 17 * 5);
  for (testing::ChatSplitData* s : {&train, &val})
    for (uint64_t d = 0; d <= s->tokens.size(); d += 17) s->docs.push_back(d);
}

DataConfig config(const fs::path& dir, LossOn loss_on = LossOn::auto_) {
  DataConfig d;
  d.kind = DataKind::tokens;
  d.dir = dir.string();
  d.batch_size = 6;
  d.seq_len = 16;
  d.loss_on = loss_on;
  return d;
}

// The batch's labels are the next tokens where `target(i)` holds for the predicted token i, else
// ignored; an empty row (all inputs 0: padding after the last row of a pass) has no target.
// Returns the batch's targets.
template <class Target>
int64_t check(const Batch& b, const testing::ChatSplitData& s, Target target, const std::string& what) {
  const auto* in = reinterpret_cast<const int32_t*>(b.inputs.data());
  int64_t targets = 0;
  for (int64_t r = 0; r < b.batch_size; ++r) {
    const int64_t start = in[r * 16];
    const bool empty = std::all_of(in + r * 16, in + r * 16 + 16, [](int32_t x) { return x == 0; });
    for (int64_t t = 0; t < 16; ++t) {
      const auto i = static_cast<size_t>(start + t);
      const size_t at = static_cast<size_t>(r * 16 + t);
      if (empty) {
        EXPECT_EQ(b.labels[at], kIgnoreLabel) << what << " padding row " << r;
        continue;
      }
      EXPECT_EQ(in[at], s.tokens[i]) << what << " row " << r;
      const int32_t want = target(i + 1) ? s.tokens[i + 1] : kIgnoreLabel;
      EXPECT_EQ(b.labels[at], want) << what << " row " << r << " position " << t;
      targets += target(i + 1) ? 1 : 0;
    }
  }
  EXPECT_EQ(b.targets(0, b.batch_size), targets) << what;
  return targets;
}

TEST(ChatMasks, LabelsAreIgnoredWhereThePredictedTokenIsNoTarget) {
  Dir dir;
  testing::ChatSplitData train, val;
  splits(train, val);
  testing::write_chat_dir(dir.path, train, val, 512, nlohmann::json::object());
  DataContext cx;
  cx.num_minibatches = 2;
  DataSource source(config(dir.path), cx);
  ASSERT_TRUE(source.has_val());
  const auto masked = [](const testing::ChatSplitData& s) { return [&s](size_t i) { return s.mask[i] == 1; }; };
  for (uint64_t step : {0, 1, 7}) {
    const int64_t targets = check(source.train_batch(static_cast<int64_t>(step)), train, masked(train), "train");
    EXPECT_GT(targets, 0);
    EXPECT_LT(targets, 6 * 16);
    EXPECT_EQ(source.train_counts(static_cast<int64_t>(step)).targets, targets);
    EXPECT_EQ(source.train_counts(static_cast<int64_t>(step)).tokens, 6 * 16);
  }
  for (int k = 0; k < 3; ++k) EXPECT_GT(check(source.val_batch(), val, masked(val), "val"), 0);
}

// One evaluation of chat data is one pass over the validation rows, each exactly once whatever
// the minibatch size: 5 rows in batches of 3 are two batches, the second with an empty row, and
// the next pass starts at row 0 again.
TEST(ChatMasks, ValidationIsOnePassOverTheRows) {
  Dir dir;
  testing::ChatSplitData train, val;
  splits(train, val);
  testing::write_chat_dir(dir.path, train, val, 512, nlohmann::json::object());
  int64_t want = 0;  // the val split's targets: every example's tokens after its first
  for (size_t i = 0; i < val.tokens.size(); ++i) want += i % 17 != 0 ? val.mask[i] : 0;
  for (int64_t minibatches : {1, 2, 3, 6}) {
    DataSource source(config(dir.path), DataContext{.num_minibatches = minibatches});
    const int64_t rows = 6 / minibatches;
    ASSERT_EQ(source.val_batches(20), (5 + rows - 1) / rows) << minibatches;
    std::vector<int32_t> firsts;
    int64_t targets = 0;
    for (int64_t k = 0; k < source.val_batches(20); ++k) {
      const Batch b = source.val_batch();
      targets += b.targets(0, b.batch_size);
      const auto* in = reinterpret_cast<const int32_t*>(b.inputs.data());
      for (int64_t r = 0; r < b.batch_size; ++r)
        if (std::any_of(in + r * 16, in + r * 16 + 16, [](int32_t x) { return x != 0; })) firsts.push_back(in[r * 16]);
    }
    EXPECT_EQ(targets, want) << minibatches;
    EXPECT_EQ(firsts, (std::vector<int32_t>{0, 17, 34, 51, 68})) << minibatches;
    EXPECT_EQ(source.val_position(), 0) << minibatches;
  }
}

std::string user_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return std::string(e.what()) + " | " + e.hint();
  }
  return "no error";
}

// data.loss_on: auto trains on what prepare recorded, all on every token (padding never), and a
// choice the data cannot give is refused naming the key.
TEST(ChatMasks, LossOnPicksTheTargetsAtTrainTime) {
  Dir dir;
  testing::ChatSplitData train, val;
  splits(train, val);
  testing::write_chat_dir(dir.path, train, val, 512, nlohmann::json::object());
  const auto every = [](size_t) { return true; };
  const auto masked = [&](size_t i) { return train.mask[i] == 1; };
  EXPECT_LT(check(DataSource(config(dir.path, LossOn::assistant), {}).train_batch(3), train, masked, "assistant"),
            6 * 16);
  EXPECT_EQ(check(DataSource(config(dir.path, LossOn::all), {}).train_batch(3), train, every, "all"), 6 * 16);
  std::string e = user_error([&] { DataSource(config(dir.path, LossOn::completion), {}); });
  EXPECT_NE(e.find("data.loss_on = completion"), std::string::npos) << e;
  EXPECT_NE(e.find("conversational"), std::string::npos) << e;
  EXPECT_NE(e.find("or assistant"), std::string::npos) << e;

  // Data from before "mask_on": --loss-on all stored a mask of ones, and trains on every token.
  testing::ChatSplitData ones = train, val_ones = val;
  std::fill(ones.mask.begin(), ones.mask.end(), 1);
  std::fill(val_ones.mask.begin(), val_ones.mask.end(), 1);
  testing::write_chat_dir(dir.path, ones, val_ones, 512, nlohmann::json::object());
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(dir.path / "meta.json"));
  meta["chat"].erase("mask_on");
  meta["chat"]["loss_on"] = "all";
  std::ofstream(dir.path / "meta.json") << meta.dump();
  EXPECT_EQ(check(DataSource(config(dir.path), {}).train_batch(3), train, every, "old all"), 6 * 16);
  e = user_error([&] { DataSource(config(dir.path, LossOn::assistant), {}); });
  EXPECT_NE(e.find("data.loss_on = assistant"), std::string::npos) << e;
  EXPECT_NE(e.find("marks every token"), std::string::npos) << e;

  // Plain token data: every token is a target; assistant or completion is refused.
  meta.erase("chat");
  std::ofstream(dir.path / "meta.json") << meta.dump();
  EXPECT_NO_THROW(DataSource(config(dir.path, LossOn::all), {}));
  e = user_error([&] { DataSource(config(dir.path, LossOn::assistant), {}); });
  EXPECT_NE(e.find("data.loss_on = assistant"), std::string::npos) << e;
  EXPECT_NE(e.find("data.loss_on = auto"), std::string::npos) << e;
}

// A split whose rows hold no target (here: no assistant token) is refused, naming the file and
// data.loss_on = all; with that choice it trains.
TEST(ChatMasks, ASplitWithoutTargetsIsRefused) {
  Dir dir;
  testing::ChatSplitData train, val;
  splits(train, val);
  std::fill(train.mask.begin(), train.mask.end(), 0);
  testing::write_chat_dir(dir.path, train, val, 512, nlohmann::json::object());
  const std::string e = user_error([&] { DataSource(config(dir.path), {}); });
  EXPECT_NE(e.find("train.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("has no target token"), std::string::npos) << e;
  EXPECT_NE(e.find("data.loss_on = all"), std::string::npos) << e;
  EXPECT_NO_THROW(DataSource(config(dir.path, LossOn::all), {}));
  // Targets only on each example's first token, which no position predicts, are none either.
  for (size_t i = 0; i < train.mask.size(); i += 17) train.mask[i] = 1;
  testing::write_chat_dir(dir.path, train, val, 512, nlohmann::json::object());
  EXPECT_NE(user_error([&] { DataSource(config(dir.path), {}); }).find("has no target token"), std::string::npos);
}

}  // namespace
}  // namespace loom
