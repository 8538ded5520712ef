// The Unicode facts the tokenizers need, without a Unicode library: UTF-8 decoding and encoding,
// the character classes of the pre-tokenizer patterns (\p{L}, \p{N}, \s) and the NFC quick check
// (for tokenizer.json files whose normalizer is NFC). Tables are generated from the Python
// `regex` module (Unicode 17); unicode.cpp says how.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

// The classes of the pre-tokenizer patterns, as the Python `regex` module and Oniguruma see them:
//   space   \s, Unicode White_Space: U+0009-000D, 0020, 0085, 00A0, 1680, 2000-200A, 2028,
//           2029, 202F, 205F, 3000;
//   letter  \p{L}, general category L*; number \p{N}, category N*;
//   other   everything else (marks, punctuation, symbols, unassigned).
enum CpClass : uint8_t { kOther, kLetter, kNumber, kSpace };
CpClass classify(char32_t c);

// Decodes the code point at s[i] into `c` and returns its length in bytes, or 0 when the bytes
// there are not valid UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
int utf8_decode(std::string_view s, size_t i, char32_t& c);
// Appends the UTF-8 encoding of code point `c` to `out`.
void utf8_append(std::string& out, char32_t c);
// `bytes` as text the way Rust's String::from_utf8_lossy makes it (the `tokenizers` library's
// ByteLevel decoder): valid UTF-8 is kept; each maximal prefix of a valid sequence that cannot be
// completed (a truncated character, e.g. E2 82 before 'x') and each byte that starts none becomes
// one U+FFFD (Unicode's "U+FFFD substitution of maximal subparts", chapter 3).
std::string utf8_lossy(std::string_view bytes);
// Number of code points of UTF-8 `text`. Invalid UTF-8 (a bad lead or continuation byte, an
// overlong form, a surrogate, a value above U+10FFFF, a truncated sequence) is a UserError
// naming `subject` and the byte offset.
int64_t utf8_length(std::string_view text, const std::string& subject);
// Byte offset where code point `k` (0 <= k <= length) starts in valid UTF-8 `text`.
size_t utf8_offset(std::string_view text, int64_t k);
// The UserError utf8_length throws: the byte at `offset` of `text` starts no valid character.
[[noreturn]] void throw_invalid_utf8(std::string_view text, size_t offset, const std::string& subject);

// Unicode's NFC quick check (UAX #15, section 9) of UTF-8 `text`: `yes` means the text is in NFC
// (normalizing it changes nothing); `no` means it is not (or is not valid UTF-8); `maybe` means
// only a full normalization could tell (an NFC_QC=Maybe character, e.g. a combining accent that
// might compose with the letter before it). `offset` is the byte offset of the first character
// that made the answer `no` or `maybe`.
enum class NfcResult { yes, no, maybe };
struct NfcQuickCheck {
  NfcResult result = NfcResult::yes;
  size_t offset = 0;
};
NfcQuickCheck nfc_quick_check(std::string_view text);

}  // namespace loom
