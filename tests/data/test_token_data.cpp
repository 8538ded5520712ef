// Token data (src/data/token_data.h): `prepare` on tiny Shakespeare against nanoGPT's split
// sizes, GPT-2 preparation with a tiny vocabulary, the checks TokenFile makes when it opens a
// file (odd size, a token outside the vocabulary, empty, a count that disagrees with meta.json),
// the input errors, and TokenBatcher: train batches a pure function of (seed, step) with windows
// in bounds, and the val walk in order, wrapping and resettable.
#include "data/token_data.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "support/files.h"

namespace loom {

void write_tiny_gpt2_vocab(const std::string& dir, bool with_eot = true);  // test_tokenizer.cpp

namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::user_error;
using testing::write_file;

// uint16 little-endian tokens, as train.bin holds them.
void write_tokens(const std::string& p, const std::vector<int>& ids) {
  std::string s;
  for (int t : ids) {
    s += static_cast<char>(t & 0xFF);
    s += static_cast<char>((t >> 8) & 0xFF);
  }
  write_file(p, s);
}

class TokenData : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "loom_data_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

const std::string kShakespeare = LOOM_SOURCE_DIR "/data/tinyshakespeare.txt";

TEST_F(TokenData, TinyShakespeareCharLikeNanoGpt) {
  const std::string out = path("shakespeare_char");
  const PreparedDataset r = prepare_dataset(TokenizerKind::char_, kShakespeare, out);
  // nanoGPT data/shakespeare_char/prepare.py: n = 1,115,394; train = data[:int(n*0.9)].
  EXPECT_EQ(r.characters, 1115394);
  EXPECT_EQ(r.vocab_size, 65);
  EXPECT_EQ(r.train_tokens, 1003854);
  EXPECT_EQ(r.val_tokens, 111540);
  EXPECT_EQ(fs::file_size(r.train_path), 2u * 1003854);
  EXPECT_EQ(fs::file_size(r.val_path), 2u * 111540);
  for (const auto& e : fs::directory_iterator(out)) EXPECT_NE(e.path().extension(), ".tmp") << "left " << e.path();

  const TokenMeta meta = read_token_meta(out);
  EXPECT_EQ(meta.vocab_size, 65);
  EXPECT_EQ(meta.train_tokens, 1003854);
  EXPECT_EQ(meta.val_tokens, 111540);
  EXPECT_EQ(meta.source, fs::absolute(kShakespeare).lexically_normal().string());
  const nlohmann::json raw = nlohmann::json::parse(read_file(r.meta_path));
  EXPECT_EQ(raw["format"], "uint16");

  // Reading back through the tokenizer stored in meta.json gives the text again.
  const auto tok = Tokenizer::from_json(meta.tokenizer, meta.path);
  EXPECT_EQ(tok->vocab_size(), 65);
  const TokenFile train = TokenFile::open_split(out, "train");
  const TokenFile val = TokenFile::open_split(out, "val");
  ASSERT_EQ(train.size(), 1003854);
  ASSERT_EQ(val.size(), 111540);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < train.size(); ++i) ids.push_back(train[i]);
  for (int64_t i = 0; i < val.size(); ++i) ids.push_back(val[i]);
  EXPECT_EQ(tok->decode(ids), read_file(kShakespeare));
  // "First Citizen:" starts the play; id of 'F' is 18 in the 65-character vocabulary.
  EXPECT_EQ(train[0], 18);
}

TEST_F(TokenData, RunPreparePrintsSummary) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(run_prepare(TokenizerKind::char_, kShakespeare, path("d"), 0.1, "", f), 0);
  std::rewind(f);
  std::string text(4096, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), f));
  std::fclose(f);
  EXPECT_NE(text.find("vocab size: 65"), std::string::npos) << text;
  EXPECT_NE(text.find("train has 1,003,854 tokens"), std::string::npos) << text;
  EXPECT_NE(text.find("val has 111,540 tokens"), std::string::npos) << text;
  EXPECT_NE(text.find("meta.json"), std::string::npos) << text;
}

TEST_F(TokenData, Gpt2Prepare) {
  write_tiny_gpt2_vocab(path(""));
  const std::string text = "it's the theme.\nThe end, caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC 12<|endoftext|>the start";
  write_file(path("in.txt"), text);
  const PreparedDataset r = prepare_dataset(TokenizerKind::gpt2, path("in.txt"), path("out"), 0.25, path(""));
  EXPECT_EQ(r.vocab_size, 267);
  const TokenMeta meta = read_token_meta(path("out"));
  const auto tok = Tokenizer::from_json(meta.tokenizer, meta.path);
  EXPECT_EQ(tok->kind(), TokenizerKind::gpt2);
  // The text is split at int(n * 0.75) characters, each part encoded separately.
  const int64_t n = utf8_length(text, "t");
  const size_t cut = utf8_offset(text, static_cast<int64_t>(static_cast<double>(n) * 0.75));
  const TokenFile train = TokenFile::open_split(path("out"), "train");
  const TokenFile val = TokenFile::open_split(path("out"), "val");
  std::vector<int32_t> a, b;
  for (int64_t i = 0; i < train.size(); ++i) a.push_back(train[i]);
  for (int64_t i = 0; i < val.size(); ++i) b.push_back(val[i]);
  EXPECT_EQ(a, tok->encode(text.substr(0, cut)));
  EXPECT_EQ(b, tok->encode(text.substr(cut)));
  EXPECT_EQ(tok->decode(a) + tok->decode(b), text);

  const std::string m = user_error([&] { prepare_dataset(TokenizerKind::gpt2, path("in.txt"), path("out2")); });
  EXPECT_NE(m.find("--vocab"), std::string::npos) << m;
}

TEST_F(TokenData, InputErrors) {
  std::string m = user_error([&] { prepare_dataset(TokenizerKind::char_, path("missing.txt"), path("out")); });
  EXPECT_NE(m.find("missing.txt"), std::string::npos) << m;
  write_file(path("empty.txt"), "");
  m = user_error([&] { prepare_dataset(TokenizerKind::char_, path("empty.txt"), path("out")); });
  EXPECT_NE(m.find("empty.txt: is empty"), std::string::npos) << m;
  write_file(path("latin1.txt"), "caf\xE9\n");
  m = user_error([&] { prepare_dataset(TokenizerKind::char_, path("latin1.txt"), path("out")); });
  EXPECT_NE(m.find("not valid UTF-8"), std::string::npos) << m;
  write_file(path("short.txt"), "a");  // int(1 * 0.9) = 0 training characters
  m = user_error([&] { prepare_dataset(TokenizerKind::char_, path("short.txt"), path("out")); });
  EXPECT_NE(m.find("too short"), std::string::npos) << m;
  m = user_error([&] { prepare_dataset(TokenizerKind::char_, path("short.txt"), path("out"), 1.0); });
  EXPECT_NE(m.find("--val-fraction"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(path("out")));
}

// More than 65536 distinct characters do not fit uint16 ids: the token files are uint32, meta.json
// says so, and they read back as the tokenizer's ids.
TEST_F(TokenData, WideVocabularyWritesUint32) {
  std::string wide;
  for (char32_t c = 0x20, k = 0; k < 65537; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    utf8_append(wide, c);
    ++k;
  }
  write_file(path("wide.txt"), wide + wide);
  const PreparedDataset r = prepare_dataset(TokenizerKind::char_, path("wide.txt"), path("out"), 0.5);
  EXPECT_EQ(r.vocab_size, 65537);
  EXPECT_EQ(r.format, "uint32");
  EXPECT_EQ(fs::file_size(r.train_path), static_cast<uintmax_t>(4 * r.train_tokens));
  const TokenMeta meta = read_token_meta(path("out"));
  EXPECT_EQ(meta.token_bytes, 4);
  const auto tok = Tokenizer::from_json(meta.tokenizer, meta.path);
  const std::vector<int32_t> want = tok->encode(wide);
  const TokenFile train = TokenFile::open_split(path("out"), "train");
  ASSERT_EQ(train.size(), static_cast<int64_t>(want.size()));
  for (int64_t i = 0; i < train.size(); ++i) ASSERT_EQ(train[i], want[static_cast<size_t>(i)]) << i;
  EXPECT_EQ(train[train.size() - 1], 65536);  // the last character has the highest id
  // A uint32 file read as uint16 data would have the wrong token count.
  std::string m = user_error([&] { TokenFile(r.train_path, 65536, r.train_tokens); });
  EXPECT_NE(m.find("meta.json says"), std::string::npos) << m;
}

TEST_F(TokenData, TokenFileChecks) {
  write_tokens(path("ok.bin"), {0, 1, 64, 3});
  const TokenFile ok(path("ok.bin"), 65);
  EXPECT_EQ(ok.size(), 4);
  EXPECT_EQ(ok[2], 64);

  write_tokens(path("big.bin"), {300, 65535});
  EXPECT_EQ(TokenFile(path("big.bin"), 65536)[1], 65535);  // little-endian, full uint16 range

  // A token >= vocab: the file, the token index, its byte offset and the id.
  write_tokens(path("bad.bin"), {0, 1, 2, 70, 4});
  std::string m = user_error([&] { TokenFile(path("bad.bin"), 65); });
  EXPECT_NE(m.find("bad.bin"), std::string::npos) << m;
  EXPECT_NE(m.find("token 3 (byte offset 6) is id 70"), std::string::npos) << m;

  write_file(path("odd.bin"), std::string("\x01\x00\x02", 3));
  m = user_error([&] { TokenFile(path("odd.bin"), 65); });
  EXPECT_NE(m.find("odd.bin: has 3 bytes, not a multiple of 2"), std::string::npos) << m;

  write_file(path("empty.bin"), "");
  m = user_error([&] { TokenFile(path("empty.bin"), 65); });
  EXPECT_NE(m.find("empty.bin: is empty"), std::string::npos) << m;

  m = user_error([&] { TokenFile(path("none.bin"), 65); });
  EXPECT_NE(m.find("none.bin"), std::string::npos) << m;

  m = user_error([&] { TokenFile(path("ok.bin"), 65, 5); });
  EXPECT_NE(m.find("meta.json says 5"), std::string::npos) << m;

  // A prepared directory whose train.bin was replaced by a hand-written bad one.
  write_file(path("in.txt"), "hello world, hello there\n");
  prepare_dataset(TokenizerKind::char_, path("in.txt"), path("d"));
  const int64_t n = TokenFile::open_split(path("d"), "train").size();
  std::vector<int> bad(static_cast<size_t>(n), 1);
  bad[5] = 200;
  write_tokens(path("d/train.bin"), bad);
  m = user_error([&] { TokenFile::open_split(path("d"), "train"); });
  EXPECT_NE(m.find("token 5 (byte offset 10) is id 200"), std::string::npos) << m;

  fs::remove(path("d/meta.json"));
  m = user_error([&] { TokenFile::open_split(path("d"), "val"); });
  EXPECT_NE(m.find("meta.json"), std::string::npos) << m;
}

// A file whose token i is i (vocab 65536), so a window's first input is its start.
class Batcher : public TokenData {
 protected:
  TokenFile counting_file(int n) {
    std::vector<int> ids(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = i;
    write_tokens(path("count.bin"), ids);
    return TokenFile(path("count.bin"), 65536);
  }
  static const int32_t* inputs(const Batch& b) { return reinterpret_cast<const int32_t*>(b.inputs.data()); }
  // Checks every row is a window of consecutive tokens and returns the starts.
  static std::vector<int32_t> starts(const Batch& b, int64_t T) {
    std::vector<int32_t> s;
    for (int64_t r = 0; r < b.batch_size; ++r) {
      const int32_t s0 = inputs(b)[r * T];
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(inputs(b)[r * T + t], s0 + t);
        EXPECT_EQ(b.labels[static_cast<size_t>(r * T + t)], s0 + t + 1);
      }
      s.push_back(s0);
    }
    return s;
  }
};

TEST_F(Batcher, TrainIsAPureFunctionOfSeedAndStep) {
  const TokenFile f = counting_file(5000);
  TokenBatcher a(f, 8, 32, BatchMode::train, 1234), b(f, 8, 32, BatchMode::train, 1234);
  TokenBatcher c(f, 8, 32, BatchMode::train, 99);
  const Batch b7 = a.train_batch(7);
  EXPECT_EQ(b7.batch_size, 8);
  EXPECT_EQ(b7.inputs.size(), 8u * 32 * 4);
  EXPECT_EQ(b7.labels.size(), 8u * 32);
  a.train_batch(3);  // other batches in between change nothing
  EXPECT_EQ(a.train_batch(7).inputs, b7.inputs);
  EXPECT_EQ(b.train_batch(7).inputs, b7.inputs);  // a fresh batcher (a resumed run)
  EXPECT_EQ(b.next(7).labels, b7.labels);
  EXPECT_NE(a.train_batch(8).inputs, b7.inputs);
  EXPECT_NE(c.train_batch(7).inputs, b7.inputs);
  starts(b7, 32);
}

TEST_F(Batcher, TrainWindowsCoverExactlyTheValidStarts) {
  // n = 20, T = 16: starts in [0, n - T - 1] = [0, 3], as torch.randint(len(data) - block_size).
  const TokenFile f = counting_file(20);
  TokenBatcher tb(f, 4, 16, BatchMode::train, 5);
  std::set<int32_t> seen;
  for (uint64_t step = 0; step < 100; ++step)
    for (const int32_t s : starts(tb.train_batch(step), 16)) seen.insert(s);
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1, 2, 3}));
}

TEST_F(Batcher, ValWalksInOrderWrapsAndResets) {
  // n = 100, T = 10: windows start at 0, 10, ..., 80 (9 per pass; 90 + 11 > 100 wraps).
  const TokenFile f = counting_file(100);
  TokenBatcher vb(f, 3, 10, BatchMode::val);
  EXPECT_EQ(vb.val_windows_per_pass(), 9);
  EXPECT_EQ(starts(vb.val_batch(), 10), (std::vector<int32_t>{0, 10, 20}));
  EXPECT_EQ(vb.position(), 30);
  EXPECT_EQ(starts(vb.val_batch(), 10), (std::vector<int32_t>{30, 40, 50}));
  EXPECT_EQ(starts(vb.next(0), 10), (std::vector<int32_t>{60, 70, 80}));
  EXPECT_EQ(vb.position(), 0);  // wrapped
  EXPECT_EQ(starts(vb.val_batch(), 10), (std::vector<int32_t>{0, 10, 20}));

  // A checkpointed position comes back exactly.
  const int64_t saved = vb.position();
  const Batch next = vb.val_batch();
  vb.reset();
  EXPECT_EQ(vb.position(), 0);
  vb.set_position(saved);
  EXPECT_EQ(vb.val_batch().inputs, next.inputs);
  vb.set_position(89);  // the last start that fits
  EXPECT_EQ(starts(vb.val_batch(), 10), (std::vector<int32_t>{89, 0, 10}));

  std::string m = user_error([&] { vb.set_position(90); });
  EXPECT_NE(m.find("position 90"), std::string::npos) << m;
  m = user_error([&] { vb.set_position(-1); });
  EXPECT_NE(m.find("position -1"), std::string::npos) << m;
}

TEST_F(Batcher, FileShorterThanOneWindow) {
  const TokenFile f = counting_file(16);
  const std::string m = user_error([&] { TokenBatcher(f, 1, 16, BatchMode::train); });
  EXPECT_NE(m.find("count.bin: has 16 tokens"), std::string::npos) << m;
  TokenBatcher ok(f, 1, 15, BatchMode::train);  // exactly one window
  EXPECT_EQ(starts(ok.train_batch(0), 15), (std::vector<int32_t>{0}));
}

}  // namespace
}  // namespace loom
