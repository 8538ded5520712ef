// Rows of whole examples (data/packing.h, data.packing): the greedy layout, truncation and
// efficiency, the batches DataSource makes of a chat directory (inputs, masked labels, positions
// restarting at each example, padding), and data.packing refused on plain token data.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/data.h"
#include "data/packing.h"
#include "support/chat_dir.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

// Examples of 4, 6, 1, 20 and 3 tokens: 3, 5, 0, 19 and 2 positions.
const std::vector<int64_t> kDocs = {0, 4, 10, 11, 31, 34};

TEST(Packing, FillsRowsGreedilyWithWholeExamples) {
  const ExampleRows r = pack_examples(kDocs, 8, true);
  // Row 0: 3 + 5 = 8; the one-token example has no positions; the 19 are cut to a row of their own;
  // 2 more would not fit beside them.
  ASSERT_EQ(r.rows(), 3);
  EXPECT_EQ(r.row_first, (std::vector<int64_t>{0, 2, 3, 4}));
  ASSERT_EQ(r.pieces.size(), 4u);
  EXPECT_EQ(r.pieces[0].first, 0);
  EXPECT_EQ(r.pieces[1].first, 4);
  EXPECT_EQ(r.pieces[2].first, 11);
  EXPECT_EQ(r.pieces[2].positions, 8);
  EXPECT_EQ(r.pieces[3].first, 31);
  EXPECT_EQ(r.truncated, 1);
  EXPECT_EQ(r.used, 3 + 5 + 8 + 2);
  EXPECT_DOUBLE_EQ(r.efficiency(), 18.0 / 24.0);
}

TEST(Packing, WithoutPackingEachExampleHasARow) {
  const ExampleRows r = pack_examples(kDocs, 8, false);
  EXPECT_EQ(r.rows(), 4);
  EXPECT_EQ(r.row_first, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(r.used, 18);
  EXPECT_DOUBLE_EQ(r.efficiency(), 18.0 / 32.0);
  EXPECT_EQ(r.truncated, 1);
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("loom_test_packing_" + std::to_string(getpid()));
  ~TempDir() { fs::remove_all(path); }
};

// tokens 10 + i, every third one context only; the examples of kDocs in both splits.
testing::ChatSplitData split() {
  testing::ChatSplitData s;
  for (int64_t i = 0; i < kDocs.back(); ++i) {
    s.tokens.push_back(static_cast<uint16_t>(10 + i));
    s.mask.push_back(i % 3 == 0 ? 0 : 1);
  }
  s.docs.assign(kDocs.begin(), kDocs.end());
  return s;
}

// The row `row` of a batch, as the layout says it should be, from the tokens and masks alone.
void expect_row(const Batch& b, int64_t slot, const std::vector<std::pair<int64_t, int64_t>>& examples, int64_t T,
                const testing::ChatSplitData& s) {
  const auto* in = reinterpret_cast<const int32_t*>(b.inputs.data()) + slot * T;
  const int32_t* lab = b.labels.data() + slot * T;
  const int32_t* pos = b.positions.data() + slot * T;
  int64_t t = 0;
  for (const auto& [first, n] : examples)
    for (int64_t i = 0; i < n; ++i, ++t) {
      EXPECT_EQ(in[t], s.tokens[static_cast<size_t>(first + i)]) << "slot " << slot << " t " << t;
      const size_t next = static_cast<size_t>(first + i + 1);
      EXPECT_EQ(lab[t], s.mask[next] ? s.tokens[next] : kIgnoreLabel) << "slot " << slot << " t " << t;
      EXPECT_EQ(pos[t], i) << "slot " << slot << " t " << t;
    }
  for (; t < T; ++t) {
    EXPECT_EQ(lab[t], kIgnoreLabel) << "padding, slot " << slot << " t " << t;
    EXPECT_EQ(pos[t], 0) << "padding, slot " << slot << " t " << t;
  }
}

TEST(Packing, ChatDataBatchesAreRowsOfExamples) {
  TempDir d;
  const testing::ChatSplitData s = split();
  testing::write_chat_dir(d.path, s, s, 64, nlohmann::json::object());
  for (bool packing : {true, false}) {
    DataConfig c;
    c.kind = DataKind::tokens;
    c.dir = d.path.string();
    c.seq_len = 8;
    c.batch_size = packing ? 3 : 4;
    c.packing = packing;
    EXPECT_TRUE(rows_of_examples(c));
    DataSource data(c, DataContext{.seed = 3, .num_minibatches = 1});
    ASSERT_TRUE(data.has_val());
    const Batch v = data.val_batch();  // every row once, in order
    ASSERT_EQ(v.positions.size(), static_cast<size_t>(c.batch_size * 8));
    if (packing) {
      expect_row(v, 0, {{0, 3}, {4, 5}}, 8, s);
      expect_row(v, 1, {{11, 8}}, 8, s);
      expect_row(v, 2, {{31, 2}}, 8, s);
    } else {
      expect_row(v, 0, {{0, 3}}, 8, s);
      expect_row(v, 1, {{4, 5}}, 8, s);
      expect_row(v, 2, {{11, 8}}, 8, s);
      expect_row(v, 3, {{31, 2}}, 8, s);
    }
    EXPECT_EQ(data.val_position(), 0) << "one pass wraps to the first row";
    // Training rows are rows of the layout too, and a pure function of (seed, step).
    const Batch t0 = data.train_batch(5), t1 = data.train_batch(5);
    EXPECT_EQ(t0.inputs, t1.inputs);
    EXPECT_EQ(t0.positions, t1.positions);
  }
}

TEST(Packing, PlainTokenDataKeepsWindowsAndRefusesPacking) {
  TempDir d;
  const testing::ChatSplitData s = split();
  testing::write_chat_dir(d.path, s, s, 64, nlohmann::json::object());
  // The same files without the "chat" entry: a plain token directory.
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(d.path / "meta.json"));
  meta.erase("chat");
  std::ofstream(d.path / "meta.json") << meta.dump();
  DataConfig c;
  c.kind = DataKind::tokens;
  c.dir = d.path.string();
  c.seq_len = 8;
  c.batch_size = 2;
  EXPECT_FALSE(rows_of_examples(c));
  EXPECT_TRUE(DataSource(c, DataContext{}).train_batch(0).positions.empty());
  c.packing = true;
  try {
    DataSource data(c, DataContext{});
    FAIL() << "data.packing on plain token data was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("data.packing"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom
