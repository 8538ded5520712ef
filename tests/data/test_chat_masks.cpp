// Chat data's loss masks reach the batches (data/data.h, data/token_data.h): a label is
// kIgnoreLabel exactly where the mask byte of the token it predicts (the one after the input) is
// 0, in training and validation batches; the inputs are the tokens whatever the mask.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "data/data.h"
#include "support/chat_dir.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

TEST(ChatMasks, LabelsAreIgnoredWhereThePredictedTokenIsNoTarget) {
  const fs::path dir = fs::temp_directory_path() / ("loom_test_chat_masks_" + std::to_string(getpid()));
  fs::remove_all(dir);
  // Token i is i, so a window's first input tells where it starts; the mask follows no period a
  // shift by one could match.
  testing::ChatSplitData train, val;
  for (uint16_t i = 0; i < 300; ++i) {
    train.tokens.push_back(i);
    train.mask.push_back((i * i / 7 + i / 5) % 3 == 0 ? 1 : 0);
  }
  val.tokens.assign(train.tokens.begin(), train.tokens.begin() + 100);
  val.mask.assign(train.mask.begin() + 11, train.mask.begin() + 111);
  testing::write_chat_dir(dir, train, val, 512, nlohmann::json::object());
  DataConfig d;
  d.kind = DataKind::tokens;
  d.dir = dir.string();
  d.batch_size = 6;
  d.seq_len = 16;
  DataContext cx;
  cx.num_minibatches = 2;
  DataSource source(d, cx);
  ASSERT_TRUE(source.has_val());
  const auto check = [](const Batch& b, const testing::ChatSplitData& s, const std::string& what) {
    const auto* in = reinterpret_cast<const int32_t*>(b.inputs.data());
    int64_t targets = 0;
    for (int64_t r = 0; r < b.batch_size; ++r) {
      const int64_t start = in[r * 16];
      for (int64_t t = 0; t < 16; ++t) {
        const auto i = static_cast<size_t>(start + t);
        EXPECT_EQ(in[r * 16 + t], s.tokens[i]) << what << " row " << r;
        const int32_t want = s.mask[i + 1] ? s.tokens[i + 1] : kIgnoreLabel;
        EXPECT_EQ(b.labels[static_cast<size_t>(r * 16 + t)], want) << what << " row " << r << " position " << t;
        targets += s.mask[i + 1];
      }
    }
    EXPECT_EQ(b.targets(0, b.batch_size), targets) << what;
    EXPECT_GT(targets, 0) << what;
    EXPECT_LT(targets, b.batch_size * 16) << what;
  };
  for (uint64_t step : {0, 1, 7}) check(source.train_batch(static_cast<int64_t>(step)), train, "train");
  for (int k = 0; k < 3; ++k) check(source.val_batch(), val, "val");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom
