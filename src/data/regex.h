// The pre-tokenizer patterns of tokenizer.json files (GPT-2's ByteLevel pattern, the Split
// patterns of Llama 3, Qwen2 and their kin), matched without a regex library: std::regex has no
// \p{L}, and what `tokenizers` runs is Oniguruma, whose semantics are Perl's. This is a small
// backtracking matcher over code points with exactly those semantics: alternatives are tried
// left to right and the first that lets the whole pattern match wins, quantifiers are greedy
// (lazy with a trailing ?) and give back one character at a time, lookaheads are atomic.
//
// Supported syntax (anything else is a UserError naming the construct):
//   literals (UTF-8), '.' (anything but \n), escapes \r \n \t \f \v \xHH \x{H..} \uHHHH and
//   escaped punctuation; \s \S; \p{L} \p{N} \P{L} \P{N} (also \p{Letter}, \p{Number});
//   classes [...] and [^...] with ranges and those escapes; groups (...), (?:...), (?i:...)
//   (case-insensitive: ASCII letters, plus the folds s/U+017F and k/U+212A Oniguruma applies);
//   lookaheads (?=...) (?!...); quantifiers ? * + {n} {n,} {n,m} and their lazy forms.
// Character classes are data/unicode.h's (Unicode 17).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

class PretokenRegex {
 public:
  // Compiles `pattern`; a syntax error or an unsupported construct is a UserError naming
  // `subject` (e.g. the tokenizer.json), the pattern and the offset.
  PretokenRegex(std::string_view pattern, const std::string& subject);

  // Appends to `out` the pieces of UTF-8 `text` that `tokenizers`' Split(behavior = "isolated")
  // gives: scanning left to right, every non-empty leftmost-first match and every stretch
  // between matches, in order, so the pieces concatenate back to `text`. Bytes that are not
  // valid UTF-8 are one character each that only negated classes match.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

  const std::string& pattern() const { return pattern_; }

  // One instruction of the backtracking program (regex.cpp).
  struct Inst {
    enum Kind : uint8_t { set, split, jump, look, match } kind;
    bool negate = false;  // look: (?!...)
    int32_t x = 0;        // set: index into sets_; split: preferred target; jump/look: target
    int32_t y = 0;        // split: the other target; look: the instruction after the lookahead
  };
  // A set of code points: the union of `ranges`, the classes in `classes` (a bit per CpClass)
  // and the complements of those in `not_classes`; `negate` complements the whole.
  struct Set {
    std::vector<std::pair<char32_t, char32_t>> ranges;
    uint8_t classes = 0, not_classes = 0;
    bool negate = false;
  };

 private:
  struct Text {  // the decoded text: code points and their CpClass
    std::vector<char32_t> cps;
    std::vector<uint8_t> cls;
  };
  using Stack = std::vector<std::pair<int32_t, int64_t>>;  // (instruction, position) to retry
  // End of the match of program `pc` at character `pos` of `t`, or -1.
  int64_t match_at(int32_t pc, int64_t pos, const Text& t, Stack& stack) const;

  std::string pattern_;
  std::vector<Inst> prog_;  // the main program starts at 0
  std::vector<Set> sets_;
};

}  // namespace loom
