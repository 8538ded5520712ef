// The pre-tokenizer matcher (src/data/regex.h): splits of the Llama 3 and Qwen2 patterns and of
// patterns that exercise each construct, against what `tokenizers`' Split(Regex(p), "isolated")
// gives (tokenizers 0.23.3, Oniguruma); GPT-2's pattern is covered by test_tokenizer.cpp and every
// pattern by the fixture encodings of test_hf_tokenizer.cpp. Then the syntax loom refuses.
#include "data/regex.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/files.h"

namespace loom {
namespace {

using testing::user_error;
using V = std::vector<std::string_view>;

constexpr const char* kLlama3 = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
                                R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

V split(const char* pattern, std::string_view text) {
  V out;
  PretokenRegex(pattern, "test").split(text, out);
  return out;
}

TEST(PretokenRegex, Llama3) {
  // Case-insensitive contractions, digits in threes, punctuation swallowing the line breaks after
  // it, and a space run giving its last space to the word after it.
  EXPECT_EQ(split(kLlama3, "I'M sure they'LL pay 12345 for it!!\r\n\r\n  x"),
            (V{"I", "'M", " sure", " they", "'LL", " pay", " ", "123", "45", " for", " it", "!!\r\n\r\n", " ", " x"}));
}

TEST(PretokenRegex, Qwen2) {
  // Single digits; U+017F (long s) folds to 's' only inside (?i:...), here it is a letter.
  EXPECT_EQ(split(kQwen2, "x 2024: '\xC5\xBF ok"), (V{"x", " ", "2", "0", "2", "4", ":", " '", "\xC5\xBF", " ok"}));
  EXPECT_EQ(split(kQwen2, "'\xC5\xBF"), (V{"'\xC5\xBF"}));
}

TEST(PretokenRegex, Constructs) {
  // Lazy {2,3}?, lazy +?, a class with \S negated inside, and text no alternative matches.
  EXPECT_EQ(split(R"(a{2,3}?|b+?c|[^\S\n]+|\n)", "aaaa bbc \n\t b"),
            (V{"aa", "aa", " ", "bbc", " ", "\n", "\t ", "b"}));
  // A repeated case-insensitive group with a class; 'k' also takes U+212A (Kelvin sign).
  EXPECT_EQ(split(R"((?i:[a-c]k)+)", "AkBKck ak c\xE2\x84\xAA"), (V{"AkBKck", " ", "ak", " ", "c\xE2\x84\xAA"}));
  // Lookahead, hexadecimal escapes, '.', an escaped literal and {n,}.
  EXPECT_EQ(split(R"(a(?=b)|\x41\u0042|[\x{43}-\x{45}]{2,}|\.|.)", "abABCDE.x\n"),
            (V{"a", "b", "AB", "CDE", ".", "x", "\n"}));
  // Invalid UTF-8 bytes are characters of their own that only negated classes match.
  EXPECT_EQ(split(R"(\p{L}+|[^\p{L}])",
                  "ab\xFF\xFE"
                  "cd"),
            (V{"ab", "\xFF", "\xFE", "cd"}));
  EXPECT_EQ(split(R"(\p{L}+)", ""), V{});
}

TEST(PretokenRegex, RefusesWhatItCannotMatchExactly) {
  for (const char* bad : {R"(\d+)", R"(\w)", R"(\p{Lu})", R"((?<=a)b)", R"(a++)", R"(^a)", R"([[:alpha:]])", "(a", "a)",
                          "[ab", R"(\x{110000})", "*a"}) {
    const std::string m = user_error([&] { PretokenRegex(bad, "tok.json"); });
    EXPECT_NE(m.find("tok.json: the pre-tokenizer pattern"), std::string::npos) << bad << ": " << m;
  }
  EXPECT_NE(user_error([&] { PretokenRegex(R"(\p{Lu})", "t"); }).find("other than L and N"), std::string::npos);
}

}  // namespace
}  // namespace loom
