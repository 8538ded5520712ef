// Tokenizers (src/data/tokenizer.h): the char vocabulary on tiny Shakespeare against nanoGPT's
// numbers, GPT-2's byte-level BPE on a small vocabulary written here (all 256 byte symbols and a
// few merges) with hand-derived encodings, the pre-tokenizer against splits produced by GPT-2's
// pattern in Python's `regex` module, JSON round trips, and the errors for bad input and files.
#include "data/tokenizer.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/files.h"

namespace loom {

// Writes encoder.json and vocab.bpe of a tiny GPT-2-style vocabulary into `dir` (also used by
// test_token_data.cpp): ids 0..255 are the byte symbols in byte order, then the merged tokens in
// merge order, then "<|endoftext|>" unless `with_eot` is false.
void write_tiny_gpt2_vocab(const std::string& dir, bool with_eot = true);

namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::TempDir;
using testing::user_error;
using testing::write_file;

// Merges in rank order. "Ã ©" is é's two UTF-8 bytes (C3 A9, both printable, so their own
// symbols); "æĹ ¥" builds 日 (E6 97 A5) from its three byte symbols.
const std::vector<std::string> kMerges = {"Ġ t", "h e", "Ġt he", "i t", "' s", "Ã ©", "Ġ Ġ", "1 2", "æ Ĺ", "æĹ ¥"};

std::string sym(uint8_t b) {
  std::string s;
  utf8_append(s, gpt2_byte_to_unicode(b));
  return s;
}

std::string shakespeare() { return read_file(LOOM_SOURCE_DIR "/data/tinyshakespeare.txt"); }

// ---- char -----------------------------------------------------------------------------------

TEST(CharTokenizer, TinyShakespeareMatchesNanoGpt) {
  const std::string text = shakespeare();
  ASSERT_EQ(text.size(), 1115394u);
  const CharTokenizer tok = CharTokenizer::fit(text, "tinyshakespeare.txt");
  // prepare.py: "all the unique characters:" and "vocab size: 65".
  EXPECT_EQ(tok.vocab_size(), 65);
  EXPECT_EQ(tok.to_json()["chars"], "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz");
  // Karpathy's "Let's build GPT": encode("hii there").
  EXPECT_EQ(tok.encode("hii there"), (std::vector<int32_t>{46, 47, 47, 1, 58, 46, 43, 56, 43}));
  const std::vector<int32_t> ids = tok.encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(tok.decode(ids), text);
}

TEST(CharTokenizer, NonAsciiByCodePoint) {
  const std::string text = "h\xC3\xA9llo \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80!";  // "héllo 日本 😀!"
  const CharTokenizer tok = CharTokenizer::fit(text, "t");
  // Sorted by code point: ' ', '!', 'h', 'l', 'o', é, 日 (U+65E5), 本 (U+672C), 😀 (U+1F600).
  EXPECT_EQ(tok.chars(), (std::vector<char32_t>{U' ', U'!', U'h', U'l', U'o', 0xE9, 0x65E5, 0x672C, 0x1F600}));
  const std::vector<int32_t> ids = tok.encode(text);
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 5, 3, 3, 4, 0, 6, 7, 0, 8, 1}));
  EXPECT_EQ(tok.decode(ids), text);
}

TEST(CharTokenizer, Errors) {
  const CharTokenizer tok = CharTokenizer::fit("abc\n", "t");
  std::string m = user_error([&] { tok.encode("abz"); });
  EXPECT_NE(m.find("'z' (U+007A)"), std::string::npos) << m;
  EXPECT_NE(m.find("at character 2"), std::string::npos) << m;
  m = user_error([&] { tok.encode("a\xC3\xA9"); });
  EXPECT_NE(m.find("U+00E9"), std::string::npos) << m;
  m = user_error([&] { tok.encode("a\xFF"); });
  EXPECT_NE(m.find("not valid UTF-8"), std::string::npos) << m;
  m = user_error([&] { tok.decode(std::vector<int32_t>{0, 4}); });
  EXPECT_NE(m.find("token id 4"), std::string::npos) << m;
  m = user_error([&] { CharTokenizer::fit("", "empty.txt"); });
  EXPECT_NE(m.find("empty.txt"), std::string::npos) << m;
  m = user_error([&] { CharTokenizer::fit("ok\xC0\xAF", "latin1.txt"); });  // an overlong '/'
  EXPECT_NE(m.find("latin1.txt"), std::string::npos) << m;
  EXPECT_NE(m.find("byte offset 2"), std::string::npos) << m;
}

TEST(CharTokenizer, JsonRoundTrip) {
  const CharTokenizer tok = CharTokenizer::fit("To be, or not to be: \xE2\x80\x94 that\n", "t");
  const nlohmann::json j = nlohmann::json::parse(tok.to_json().dump());
  const auto back = Tokenizer::from_json(j, "meta.json");
  EXPECT_EQ(back->kind(), TokenizerKind::char_);
  EXPECT_EQ(back->vocab_size(), tok.vocab_size());
  EXPECT_EQ(back->encode("not to be \xE2\x80\x94"), tok.encode("not to be \xE2\x80\x94"));

  std::string m = user_error([&] { Tokenizer::from_json({{"kind", "char"}, {"chars", "ba"}}, "meta.json"); });
  EXPECT_NE(m.find("meta.json"), std::string::npos) << m;
  EXPECT_NE(m.find("tokenizer.chars"), std::string::npos) << m;
  m = user_error([&] { Tokenizer::from_json({{"kind", "char"}}, "meta.json"); });
  EXPECT_NE(m.find("\"chars\""), std::string::npos) << m;
  m = user_error([&] { Tokenizer::from_json({{"kind", "wordpiece"}}, "meta.json"); });
  EXPECT_NE(m.find("wordpiece"), std::string::npos) << m;
  m = user_error([&] { Tokenizer::from_json({{"kind", "char"}, {"chars", "ab"}, {"vocab_size", 3}}, "meta.json"); });
  EXPECT_NE(m.find("vocab_size"), std::string::npos) << m;
}

// ---- GPT-2 ----------------------------------------------------------------------------------

// Rust's String::from_utf8_lossy: one U+FFFD per maximal subpart, the example of The Unicode
// Standard, chapter 3, "U+FFFD Substitution of Maximal Subparts" (table 3-8), and a few more.
TEST(Unicode, LossyReplacesMaximalSubparts) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_lossy("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a" + r + r + r + "b" + r + "c" + r + r + "d");
  EXPECT_EQ(utf8_lossy("caf\xC3\xA9 \xF0\x9F\x98\x80"), "caf\xC3\xA9 \xF0\x9F\x98\x80");  // valid: unchanged
  EXPECT_EQ(utf8_lossy("x\xE2\x82"), "x" + r);                                            // a truncated character: one
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), r + r + r);          // a surrogate: no valid prefix
  EXPECT_EQ(utf8_lossy("\xC0\xAF"), r + r);                  // overlong
  EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), r);
  EXPECT_EQ(utf8_lossy(""), "");
}

TEST(Gpt2, BytesToUnicode) {
  EXPECT_EQ(gpt2_byte_to_unicode('A'), U'A');
  EXPECT_EQ(gpt2_byte_to_unicode('!'), U'!');
  EXPECT_EQ(gpt2_byte_to_unicode(0xE9), U'\u00E9');
  EXPECT_EQ(gpt2_byte_to_unicode(0), U'\u0100');
  EXPECT_EQ(gpt2_byte_to_unicode('\n'), U'\u010A');  // 'Ċ'
  EXPECT_EQ(gpt2_byte_to_unicode(' '), U'\u0120');   // 'Ġ'
  EXPECT_EQ(gpt2_byte_to_unicode(0x7F), U'\u0121');
  EXPECT_EQ(gpt2_byte_to_unicode(0xAD), U'\u0143');  // the last of the 68 remapped bytes
  std::vector<bool> seen(0x200, false);
  for (int b = 0; b < 256; ++b) {
    const char32_t u = gpt2_byte_to_unicode(static_cast<uint8_t>(b));
    ASSERT_LT(u, 0x200u);
    EXPECT_FALSE(seen[u]) << b;
    seen[u] = true;
  }
}

// Expected splits are what GPT-2's pattern gives in Python's `regex` module.
TEST(Gpt2, PretokenizeMatchesRegexModule) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(gpt2_pretokenize("Hello world! It's 2024.\n\n  ok"),
            (V{"Hello", " world", "!", " It", "'s", " 2024", ".", "\n\n ", " ok"}));
  EXPECT_EQ(gpt2_pretokenize("I'm sure they'll go; we've won, you're 'right' I'd say, isn't it?"),
            (V{"I",   "'m", " sure", " they", "'ll", " go", ";",    " we", "'ve",  " won", ",",   " you",
               "'re", " '", "right", "'",     " I",  "'d",  " say", ",",   " isn", "'t",   " it", "?"}));
  EXPECT_EQ(gpt2_pretokenize("a   b\tc\r\n"), (V{"a", "  ", " b", "\t", "c", "\r\n"}));
  // "café 日本語, naïve½ x²\u00a0y": letters beyond ASCII, ½ and ² are \p{N}, NBSP is \s.
  EXPECT_EQ(
      gpt2_pretokenize("caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E, na\xC3\xAFve\xC2\xBD x\xC2\xB2\xC2\xA0y"),
      (V{"caf\xC3\xA9", " \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E", ",", " na\xC3\xAFve", "\xC2\xBD", " x", "\xC2\xB2",
         "\xC2\xA0", "y"}));
  // A combining accent (U+0301, category Mn) is neither a letter nor a number.
  EXPECT_EQ(gpt2_pretokenize("e\xCC\x81t\xC3\xA9 "), (V{"e", "\xCC\x81", "t\xC3\xA9", " "}));
  EXPECT_EQ(gpt2_pretokenize("  "), (V{"  "}));
  EXPECT_EQ(gpt2_pretokenize("''s --> ..."), (V{"''", "s", " -->", " ..."}));
  EXPECT_EQ(gpt2_pretokenize(""), V{});
  // Invalid bytes are single "other" characters.
  EXPECT_EQ(gpt2_pretokenize("ab\xFF\xFE cd"), (V{"ab", "\xFF\xFE", " cd"}));
}

class Gpt2Tiny : public ::testing::Test {
 protected:
  void SetUp() override {
    write_tiny_gpt2_vocab(dir_.path());
    tok_ = Gpt2Tokenizer::load_dir(dir_.path());
  }
  // The id of a token given by its bytes (converted to byte symbols here).
  int32_t id(const std::string& bytes) const {
    std::string s;
    for (unsigned char b : bytes) s += sym(b);
    const nlohmann::json enc = nlohmann::json::parse(read_file(dir_.path("encoder.json")));
    if (!enc.contains(s)) throw std::runtime_error("no token " + s);
    return enc[s].get<int32_t>();
  }
  std::vector<int32_t> ids(std::initializer_list<std::string> pieces) const {
    std::vector<int32_t> v;
    for (const auto& p : pieces) v.push_back(id(p));
    return v;
  }

  TempDir dir_;
  std::unique_ptr<Gpt2Tokenizer> tok_;
};

TEST_F(Gpt2Tiny, Vocabulary) {
  EXPECT_EQ(tok_->vocab_size(), 256 + static_cast<int32_t>(kMerges.size()) + 1);
  EXPECT_EQ(tok_->eot_id(), tok_->vocab_size() - 1);
  EXPECT_EQ(tok_->kind(), TokenizerKind::gpt2);
  EXPECT_EQ(id(" the"), 258);
}

// Encodings derived by hand from the merge ranks ("Ġ t" < "h e" < "Ġt he" < ...).
TEST_F(Gpt2Tiny, EncodeByMergeRank) {
  // "the": (h,e) is the only ranked pair -> [t, he]; (t, he) has no merge.
  EXPECT_EQ(tok_->encode("the"), ids({"t", "he"}));
  // " the": (Ġ,t) rank 0 first -> [Ġt, h, e] -> [Ġt, he] -> [Ġthe].
  EXPECT_EQ(tok_->encode(" the"), ids({" the"}));
  EXPECT_EQ(tok_->encode("it's the theme"), ids({"it", "'s", " the", " the", "m", "e"}));
  // Digits, punctuation, newlines and runs of spaces ("  " merges, the space before "x" joins it).
  EXPECT_EQ(tok_->encode("12 123, x\n\n   x"), ids({"12", " ", "12", "3", ",", " ", "x", "\n", "\n", "  ", " ", "x"}));
  // Non-ASCII: é from its two bytes, 日 from three, 本 stays three byte symbols.
  EXPECT_EQ(tok_->encode("caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC"),
            ids({"c", "a", "f", "\xC3\xA9", " ", "\xE6\x97\xA5", "\xE6", "\x9C", "\xAC"}));
  // Merges apply left to right without overlap: "ĠĠĠĠĠ" + "x" -> " " pieces "    ", " x".
  EXPECT_EQ(tok_->encode("     x"), ids({"  ", "  ", " ", "x"}));
}

TEST_F(Gpt2Tiny, EndOfText) {
  const int32_t eot = tok_->eot_id();
  std::vector<int32_t> want = ids({"it"});
  want.push_back(eot);
  const std::vector<int32_t> the = ids({" the"});
  want.insert(want.end(), the.begin(), the.end());
  EXPECT_EQ(tok_->encode("it<|endoftext|> the"), want);
  EXPECT_EQ(tok_->encode("<|endoftext|><|endoftext|>"), (std::vector<int32_t>{eot, eot}));
  EXPECT_EQ(tok_->decode(std::vector<int32_t>{eot}), "<|endoftext|>");
  // Without the special token in the vocabulary it is ordinary text.
  TempDir d;
  write_tiny_gpt2_vocab(d.path(), /*with_eot=*/false);
  const auto plain = Gpt2Tokenizer::load_dir(d.path());
  EXPECT_EQ(plain->eot_id(), -1);
  EXPECT_EQ(plain->encode("<|endoftext|>"), ids({"<", "|", "e", "n", "d", "o", "f", "t", "e", "x", "t", "|", ">"}));
}

TEST_F(Gpt2Tiny, RoundTrip) {
  const std::vector<std::string> fixed = {
      "",
      " ",
      "\n",
      "it's",
      "Hello, World! 123 4567\n\n  indented\tand\r\nCRLF",
      "I'm sure they'll go; we've won, you're 'right' I'd say, isn't it?",
      "caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80 x\xC2\xB2\xC2\xA0y",
      "a<|endoftext|>b<|endoftext|>",
      "<|endoftext",
      "ab\xFF\xFE\x80 cd",
      std::string("nul\0byte", 8)};
  // Text comes back as it was; bytes that are not UTF-8 come back as from_utf8_lossy makes them.
  for (const std::string& s : fixed) EXPECT_EQ(tok_->decode(tok_->encode(s)), utf8_lossy(s)) << s;
  // Random byte strings (any bytes, valid UTF-8 or not) and random mixes of tricky pieces.
  std::mt19937 gen(7);
  const std::vector<std::string> parts = {"the",
                                          " the",
                                          "'s",
                                          "'S",
                                          " ",
                                          "  ",
                                          "\n",
                                          "\t",
                                          "12",
                                          "3",
                                          ",",
                                          ".",
                                          "\xC3\xA9",
                                          "\xE6\x97\xA5",
                                          "\xF0\x9F\x98\x80",
                                          "\xC2\xA0",
                                          "<|endoftext|>",
                                          "it"};
  for (int k = 0; k < 500; ++k) {
    std::string bytes, mix;
    const int n = static_cast<int>(gen() % 40);
    for (int i = 0; i < n; ++i) bytes += static_cast<char>(gen() & 0xFF);
    for (int i = 0; i < n; ++i) mix += parts[gen() % parts.size()];
    EXPECT_EQ(tok_->decode(tok_->encode(bytes)), utf8_lossy(bytes));
    EXPECT_EQ(tok_->decode(tok_->encode(mix)), mix);
  }
  const std::string text = shakespeare().substr(0, 20000);
  EXPECT_EQ(tok_->decode(tok_->encode(text)), text);
}

TEST_F(Gpt2Tiny, JsonRoundTrip) {
  const auto back = Tokenizer::from_json(nlohmann::json::parse(tok_->to_json().dump()), "meta.json");
  EXPECT_EQ(back->kind(), TokenizerKind::gpt2);
  EXPECT_EQ(back->vocab_size(), tok_->vocab_size());
  const std::string s = "it's the theme, caf\xC3\xA9<|endoftext|>12";
  EXPECT_EQ(back->encode(s), tok_->encode(s));
}

TEST_F(Gpt2Tiny, DecodeRejectsBadIds) {
  const std::string m = user_error([&] { tok_->decode(std::vector<int32_t>{1, tok_->vocab_size()}); });
  EXPECT_NE(m.find("token id 267"), std::string::npos) << m;
}

TEST(Gpt2Files, Errors) {
  TempDir d;
  // Missing files name the file.
  std::string m = user_error([&] { Gpt2Tokenizer::load_dir(d.path()); });
  EXPECT_NE(m.find(d.path("encoder.json")), std::string::npos) << m;
  write_tiny_gpt2_vocab(d.path());
  const std::string enc = read_file(d.path("encoder.json")), bpe = read_file(d.path("vocab.bpe"));
  fs::remove(d.path("vocab.bpe"));
  m = user_error([&] { Gpt2Tokenizer::load_dir(d.path()); });
  EXPECT_NE(m.find(d.path("vocab.bpe")), std::string::npos) << m;

  // Malformed merge line: the file and the line number.
  write_file(d.path("vocab.bpe"), "#version: 0.2\n\xC4\xA0 t\nhe\n");
  m = user_error([&] { Gpt2Tokenizer::load_dir(d.path()); });
  EXPECT_NE(m.find("vocab.bpe: line 3"), std::string::npos) << m;
  // A merge whose result is not a token.
  write_file(d.path("vocab.bpe"), "#version: 0.2\nx y\n");
  m = user_error([&] { Gpt2Tokenizer::load_dir(d.path()); });
  EXPECT_NE(m.find("'xy' is not a token"), std::string::npos) << m;
  write_file(d.path("vocab.bpe"), bpe);

  // encoder.json: not JSON, ids with a gap, a missing byte symbol.
  write_file(d.path("encoder.json"), "{\"a\": 0,");
  m = user_error([&] { Gpt2Tokenizer::load_dir(d.path()); });
  EXPECT_NE(m.find("encoder.json: is not valid JSON"), std::string::npos) << m;
  nlohmann::json j = nlohmann::json::parse(enc);
  j["<|endoftext|>"] = 9999;
  write_file(d.path("encoder.json"), j.dump());
  m = user_error([&] { Gpt2Tokenizer::load_dir(d.path()); });
  EXPECT_NE(m.find("has id 9999"), std::string::npos) << m;
  j = nlohmann::json::parse(enc);
  const int32_t a_id = j["a"].get<int32_t>();
  j.erase("a");
  for (auto& [k, v] : j.items())
    if (v.get<int32_t>() > a_id) v = v.get<int32_t>() - 1;
  write_file(d.path("encoder.json"), j.dump());
  m = user_error([&] { Gpt2Tokenizer::load_dir(d.path()); });
  EXPECT_NE(m.find("no token for byte 0x61"), std::string::npos) << m;
}

}  // namespace

void write_tiny_gpt2_vocab(const std::string& dir, bool with_eot) {
  nlohmann::json enc = nlohmann::json::object();
  int32_t next = 0;
  for (int b = 0; b < 256; ++b) enc[sym(static_cast<uint8_t>(b))] = next++;
  std::string bpe = "#version: 0.2\n";
  for (const std::string& m : kMerges) {
    const size_t sp = m.find(' ');
    enc[m.substr(0, sp) + m.substr(sp + 1)] = next++;
    bpe += m;
    bpe += '\n';
  }
  if (with_eot) enc["<|endoftext|>"] = next++;
  write_file((fs::path(dir) / "encoder.json").string(), enc.dump());
  write_file((fs::path(dir) / "vocab.bpe").string(), bpe);
}

}  // namespace loom
