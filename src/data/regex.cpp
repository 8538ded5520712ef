#include "data/regex.h"

#include <tuple>
#include <utility>

#include "core/error.h"
#include "data/unicode.h"

namespace loom {

namespace {

using Set = PretokenRegex::Set;
using Inst = PretokenRegex::Inst;

constexpr char32_t kInvalidByte = 0xFFFFFFFF;  // a byte that starts no valid UTF-8 character

// The parsed pattern.
struct Node {
  enum Kind { empty, set, cat, alt, repeat, look } kind = empty;
  int32_t set_index = -1;
  std::vector<Node> kids;
  int32_t min = 0, max = -1;  // repeat: -1 = unbounded
  bool greedy = true;
  bool negate = false;  // look
};

bool ascii_letter(char32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// The code points Oniguruma's case-insensitive matching takes for ASCII letter `c` (besides c).
void add_case_variants(Set& s, char32_t c) {
  const char32_t lower = c | 0x20;
  s.ranges.emplace_back(lower, lower);
  s.ranges.emplace_back(lower - 0x20, lower - 0x20);
  if (lower == 's') s.ranges.emplace_back(0x17F, 0x17F);    // LATIN SMALL LETTER LONG S
  if (lower == 'k') s.ranges.emplace_back(0x212A, 0x212A);  // KELVIN SIGN
}

class Parser {
 public:
  Parser(std::string_view pattern, const std::string& subject, std::vector<Set>& sets)
      : pattern_(pattern), subject_(subject), sets_(sets) {
    for (size_t i = 0; i < pattern.size();) {
      char32_t c;
      const int len = utf8_decode(pattern, i, c);
      if (len == 0) fail("is not valid UTF-8");
      cps_.push_back(c);
      i += static_cast<size_t>(len);
    }
  }

  Node parse() {
    Node n = alternation();
    if (i_ < cps_.size()) fail("has an unmatched ')'");
    return n;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    std::string msg = "the pre-tokenizer pattern ";
    msg += pattern_;
    msg += " ";
    msg += what;
    msg += " (at character ";
    msg += std::to_string(i_);
    msg += ")";
    throw UserError(subject_, msg,
                    "loom supports the patterns of GPT-2, Llama 3, Qwen2 and similar byte-level BPE tokenizers "
                    "(data/regex.h lists the syntax)");
  }
  bool at_end() const { return i_ >= cps_.size(); }
  char32_t peek(size_t ahead = 0) const { return i_ + ahead < cps_.size() ? cps_[i_ + ahead] : 0; }
  bool eat(char32_t c) {
    if (at_end() || cps_[i_] != c) return false;
    ++i_;
    return true;
  }
  int32_t add_set(Set s) {
    sets_.push_back(std::move(s));
    return static_cast<int32_t>(sets_.size() - 1);
  }
  Node set_node(Set s) {
    Node n;
    n.kind = Node::set;
    n.set_index = add_set(std::move(s));
    return n;
  }

  Node alternation() {
    Node first = concatenation();
    if (peek() != '|') return first;
    Node n;
    n.kind = Node::alt;
    n.kids.push_back(std::move(first));
    while (eat('|')) n.kids.push_back(concatenation());
    return n;
  }

  Node concatenation() {
    Node n;
    n.kind = Node::cat;
    while (!at_end() && peek() != '|' && peek() != ')') n.kids.push_back(quantified());
    return n;
  }

  // Reads a decimal number at the cursor into `v`; false (cursor unchanged) when there is none.
  bool number(int32_t& v) {
    const size_t start = i_;
    v = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + static_cast<int32_t>(peek() - '0');
      if (v > 1000) fail("has a repetition count above 1000");
      ++i_;
    }
    return i_ > start;
  }

  // {n}, {n,}, {n,m}, {,m} after an atom; false (cursor unchanged) when the brace is a literal.
  bool braces(int32_t& min, int32_t& max) {
    const size_t start = i_;
    ++i_;  // '{'
    const bool has_min = number(min);
    if (!has_min) min = 0;
    max = min;
    if (eat(',')) {
      if (!number(max)) max = -1;
    }
    if (!eat('}') || (!has_min && max < 0) || (max >= 0 && max < min)) {
      i_ = start;
      return false;
    }
    return true;
  }

  Node quantified() {
    Node atom_node = atom();
    for (;;) {
      int32_t min = 0, max = -1;
      if (eat('?')) {
        max = 1;
      } else if (eat('*')) {
      } else if (eat('+')) {
        min = 1;
      } else if (peek() != '{' || !braces(min, max)) {
        return atom_node;
      }
      if (atom_node.kind == Node::look) fail("repeats a lookahead");
      Node r;
      r.kind = Node::repeat;
      r.min = min;
      r.max = max;
      if (eat('?')) r.greedy = false;
      if (peek() == '+') fail("uses a possessive quantifier");
      r.kids.push_back(std::move(atom_node));
      atom_node = std::move(r);
    }
  }

  Node atom() {
    const char32_t c = peek();
    ++i_;
    switch (c) {
      case '(':
        return group();
      case '[':
        return set_node(bracket());
      case '.': {
        Set s;
        s.negate = true;
        s.ranges.emplace_back('\n', '\n');
        return set_node(std::move(s));
      }
      case '\\': {
        Set s;
        escape(s);
        return set_node(std::move(s));
      }
      case '^':
      case '$':
        fail("uses an anchor");
      case '*':
      case '+':
      case '?':
        fail("has a quantifier with nothing to repeat");
      default: {
        Set s;
        literal(s, c);
        return set_node(std::move(s));
      }
    }
  }

  void literal(Set& s, char32_t c) const {
    if (icase_ && ascii_letter(c))
      add_case_variants(s, c);
    else
      s.ranges.emplace_back(c, c);
  }

  Node group() {
    const bool saved_icase = icase_;
    Node n;
    if (eat('?')) {
      if (eat(':')) {
      } else if (peek() == 'i' && peek(1) == ':') {
        i_ += 2;
        icase_ = true;
      } else if (peek() == '=' || peek() == '!') {
        n.kind = Node::look;
        n.negate = peek() == '!';
        ++i_;
      } else {
        fail("uses a group kind other than (?:...), (?i:...), (?=...) and (?!...)");
      }
    }
    Node inner = alternation();
    if (!eat(')')) fail("has an unclosed group");
    icase_ = saved_icase;
    if (n.kind != Node::look) return inner;
    n.kids.push_back(std::move(inner));
    return n;
  }

  uint32_t hex_digits(size_t count, bool braced) {
    uint32_t v = 0;
    size_t k = 0;
    for (; braced ? peek() != '}' : k < count; ++k) {
      const char32_t h = peek();
      const int d = h >= '0' && h <= '9'   ? static_cast<int>(h - '0')
                    : h >= 'a' && h <= 'f' ? static_cast<int>(h - 'a' + 10)
                    : h >= 'A' && h <= 'F' ? static_cast<int>(h - 'A' + 10)
                                           : -1;
      if (d < 0 || k >= 6) fail("has a malformed hexadecimal escape");
      v = v * 16 + static_cast<uint32_t>(d);
      ++i_;
    }
    if (k == 0 || (braced && !eat('}')) || v > 0x10FFFF) fail("has a malformed hexadecimal escape");
    return v;
  }

  // The escape after a backslash: a class (\s, \p{L}, ...) joins `s`; a character is returned
  // (and, outside a bracket, added to `s`). Returns kInvalidByte when it was a class.
  char32_t escape(Set& s, bool in_bracket = false) {
    if (at_end()) fail("ends with a backslash");
    const char32_t e = peek();
    ++i_;
    char32_t c;
    switch (e) {
      case 'r':
        c = '\r';
        break;
      case 'n':
        c = '\n';
        break;
      case 't':
        c = '\t';
        break;
      case 'f':
        c = '\f';
        break;
      case 'v':
        c = '\v';
        break;
      case 'x':
        c = eat('{') ? hex_digits(0, true) : hex_digits(2, false);
        break;
      case 'u':
        c = hex_digits(4, false);
        break;
      case 's':
        s.classes |= 1u << kSpace;
        return kInvalidByte;
      case 'S':
        s.not_classes |= 1u << kSpace;
        return kInvalidByte;
      case 'p':
      case 'P': {
        if (!eat('{')) fail("has \\p without {...}");
        std::u32string name;
        while (!at_end() && peek() != '}') name += cps_[i_++];
        if (!eat('}')) fail("has an unclosed \\p{...}");
        uint8_t bit;
        if (name == U"L" || name == U"Letter")
          bit = 1u << kLetter;
        else if (name == U"N" || name == U"Number")
          bit = 1u << kNumber;
        else
          fail("uses a Unicode property other than L and N");
        (e == 'p' ? s.classes : s.not_classes) |= bit;
        return kInvalidByte;
      }
      default:
        if ((e >= '0' && e <= '9') || ascii_letter(e)) {
          std::string msg = "uses the escape \\";
          utf8_append(msg, e);
          fail(msg);
        }
        c = e;  // escaped punctuation stands for itself
    }
    if (!in_bracket) literal(s, c);
    return c;
  }

  // [...] after the '['.
  Set bracket() {
    Set s;
    s.negate = eat('^');
    bool first = true;
    for (;;) {
      if (at_end()) fail("has an unclosed [...]");
      char32_t c = peek();
      if (c == ']' && !first) {
        ++i_;
        break;
      }
      first = false;
      ++i_;
      if (c == '[') fail("nests a [...] (or a POSIX class) in a class");
      if (c == '\\') {
        c = escape(s, /*in_bracket=*/true);
        if (c == kInvalidByte) continue;
      }
      char32_t hi = c;
      if (peek() == '-' && peek(1) != ']' && peek(1) != 0) {
        ++i_;
        hi = peek();
        ++i_;
        if (hi == '\\') {
          Set ignored;
          hi = escape(ignored, /*in_bracket=*/true);
          if (hi == kInvalidByte) fail("has a range ending in a class");
        }
        if (hi < c) fail("has a range whose end is below its start");
      }
      s.ranges.emplace_back(c, hi);
      if (icase_)
        for (char32_t x = c; x <= hi && x < 128; ++x)
          if (ascii_letter(x)) add_case_variants(s, x);
    }
    return s;
  }

  std::string_view pattern_;
  const std::string& subject_;
  std::vector<Set>& sets_;
  std::u32string cps_;
  size_t i_ = 0;
  bool icase_ = false;
};

class Compiler {
 public:
  explicit Compiler(std::vector<Inst>& prog) : prog_(prog) {}

  void emit(const Node& n) {
    switch (n.kind) {
      case Node::empty:
        break;
      case Node::set:
        push({.kind = Inst::set, .x = n.set_index});
        break;
      case Node::cat:
        for (const Node& k : n.kids) emit(k);
        break;
      case Node::alt: {
        // split(next, following alternative) before each but the last; each jumps to the end.
        std::vector<int32_t> ends;
        for (size_t k = 0; k + 1 < n.kids.size(); ++k) {
          const int32_t s = push({.kind = Inst::split});
          prog_[s].x = s + 1;
          emit(n.kids[k]);
          ends.push_back(push({.kind = Inst::jump}));
          prog_[s].y = size();
        }
        emit(n.kids.back());
        for (const int32_t j : ends) prog_[j].x = size();
        break;
      }
      case Node::repeat: {
        for (int32_t k = 0; k < n.min; ++k) emit(n.kids[0]);
        if (n.max < 0) {  // loop: split(body, out); body; jump back
          const int32_t s = push({.kind = Inst::split});
          emit(n.kids[0]);
          push({.kind = Inst::jump, .x = s});
          branch(s, s + 1, size(), n.greedy);
        } else {  // (body (body ...)?)?: every optional copy skips to the end
          std::vector<int32_t> splits;
          for (int32_t k = n.min; k < n.max; ++k) {
            splits.push_back(push({.kind = Inst::split}));
            emit(n.kids[0]);
          }
          for (const int32_t s : splits) branch(s, s + 1, size(), n.greedy);
        }
        break;
      }
      case Node::look: {
        const int32_t l = push({.kind = Inst::look, .negate = n.negate});
        emit(n.kids[0]);
        push({.kind = Inst::match});
        prog_[l].x = l + 1;
        prog_[l].y = size();
        break;
      }
    }
  }

  int32_t push(Inst i) {
    prog_.push_back(i);
    return size() - 1;
  }

 private:
  int32_t size() const { return static_cast<int32_t>(prog_.size()); }
  // A greedy split tries `take` first, a lazy one `skip`.
  void branch(int32_t s, int32_t take, int32_t skip, bool greedy) {
    prog_[s].x = greedy ? take : skip;
    prog_[s].y = greedy ? skip : take;
  }

  std::vector<Inst>& prog_;
};

bool contains(const Set& s, char32_t c, uint8_t cls) {
  bool in = ((s.classes >> cls) & 1u) != 0 || (s.not_classes & ~(1u << cls)) != 0;
  for (size_t k = 0; !in && k < s.ranges.size(); ++k) in = c >= s.ranges[k].first && c <= s.ranges[k].second;
  return in != s.negate;
}

}  // namespace

PretokenRegex::PretokenRegex(std::string_view pattern, const std::string& subject) : pattern_(pattern) {
  const Node root = Parser(pattern, subject, sets_).parse();
  Compiler c(prog_);
  c.emit(root);
  c.push({.kind = Inst::match});
}

int64_t PretokenRegex::match_at(int32_t pc, int64_t pos, const Text& t, Stack& stack) const {
  // Backtracking: the alternatives not taken yet, latest first, above `base` (a lookahead runs
  // on the same stack and leaves it as it found it).
  const size_t base = stack.size();
  const std::vector<char32_t>& cps = t.cps;
  const std::vector<uint8_t>& cls = t.cls;
  const auto n = static_cast<int64_t>(cps.size());
  for (;;) {
    const Inst& in = prog_[static_cast<size_t>(pc)];
    bool ok = true;
    switch (in.kind) {
      case Inst::set:
        ok = pos < n &&
             contains(sets_[static_cast<size_t>(in.x)], cps[static_cast<size_t>(pos)], cls[static_cast<size_t>(pos)]);
        ++pc, ++pos;
        break;
      case Inst::split:
        stack.emplace_back(in.y, pos);
        pc = in.x;
        break;
      case Inst::jump:
        pc = in.x;
        break;
      case Inst::look:
        ok = (match_at(in.x, pos, t, stack) >= 0) != in.negate;
        pc = in.y;
        break;
      case Inst::match:
        stack.resize(base);
        return pos;
    }
    if (!ok) {
      if (stack.size() == base) return -1;
      std::tie(pc, pos) = stack.back();
      stack.pop_back();
    }
  }
}

void PretokenRegex::split(std::string_view text, std::vector<std::string_view>& out) const {
  Text t;
  std::vector<char32_t>& cps = t.cps;
  std::vector<uint8_t>& cls = t.cls;
  std::vector<size_t> offs;  // byte offset of each character, and the end
  cps.reserve(text.size());
  cls.reserve(text.size());
  offs.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size();) {
    char32_t c;
    int len = utf8_decode(text, i, c);
    if (len == 0) c = kInvalidByte, len = 1;
    cps.push_back(c);
    cls.push_back(c == kInvalidByte ? kOther : classify(c));
    offs.push_back(i);
    i += static_cast<size_t>(len);
  }
  offs.push_back(text.size());
  const auto n = static_cast<int64_t>(cps.size());
  auto piece = [&](int64_t a, int64_t b) {
    out.push_back(
        text.substr(offs[static_cast<size_t>(a)], offs[static_cast<size_t>(b)] - offs[static_cast<size_t>(a)]));
  };
  Stack stack;
  int64_t gap = 0;  // start of the text not matched yet
  for (int64_t p = 0; p < n;) {
    const int64_t e = match_at(0, p, t, stack);
    if (e <= p) {
      ++p;
      continue;
    }
    if (gap < p) piece(gap, p);
    piece(p, e);
    p = gap = e;
  }
  if (gap < n) piece(gap, n);
}

}  // namespace loom
