#include "data/jinja.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>

#include "core/error.h"
#include "data/unicode.h"

namespace loom::jinja {

// ---- values ---------------------------------------------------------------------------------

namespace {

// A template value: JSON data, jinja2's Undefined (a missing variable, key or attribute; `what`
// says which, for errors), a namespace() object (shared, so `set ns.x` inside a loop is seen
// after it), or a global function.
struct Value {
  enum class Kind { undefined, data, ns, func };
  Kind kind = Kind::undefined;
  std::shared_ptr<const Json> d;  // data: owned, or a part of a bigger value sharing its owner
  std::shared_ptr<Json> ns;
  std::string what;             // undefined: what is missing; func: the function's name
  const Node* macro = nullptr;  // func: a {% macro %} of the template, else a global

  static Value undef(std::string what) { return {Kind::undefined, nullptr, nullptr, std::move(what)}; }
  static Value of(Json j) { return {Kind::data, std::make_shared<const Json>(std::move(j)), nullptr, {}}; }
  // A part of `whole`'s data (a list item, a dict value): no copy, it keeps `whole` alive. Looking
  // into messages[i]['content'] this way costs nothing whatever the size of messages.
  static Value part(const Value& whole, const Json& p) {
    return {Kind::data, std::shared_ptr<const Json>(whole.d, &p), nullptr, {}};
  }
  // Data that outlives the rendering (the caller's context).
  static Value borrow(const Json& j) {
    return {Kind::data, std::shared_ptr<const Json>(std::shared_ptr<const Json>(), &j), nullptr, {}};
  }
  static Value func(std::string name) { return {Kind::func, nullptr, nullptr, std::move(name)}; }
  const Json& j() const {
    static const Json null;
    return d ? *d : null;
  }
  bool defined() const { return kind != Kind::undefined; }
  bool is_data() const { return kind == Kind::data; }
  bool is_string() const { return is_data() && j().is_string(); }
  bool is_none() const { return is_data() && j().is_null(); }
};

std::u32string to_u32(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t c;
    const int n = utf8_decode(s, i, c);
    if (n == 0) {  // not UTF-8: keep the byte as a code point so nothing is lost
      out.push_back(static_cast<unsigned char>(s[i]));
      ++i;
    } else {
      out.push_back(c);
      i += static_cast<size_t>(n);
    }
  }
  return out;
}

std::string to_u8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

bool is_space(char32_t c) { return (c >= 0x1C && c <= 0x1F) || classify(c) == kSpace; }

// Python's repr() of a string: single quotes unless the text has ' and no ".
std::string py_repr_string(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : to_u32(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else {
      utf8_append(out, c);
    }
  }
  out += q;
  return out;
}

std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  return Json(d).dump();  // shortest round-trip digits, "1.0" for integral values, as repr()
}

// Python's repr() of data (what str() prints inside lists and dicts).
std::string py_repr(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "None";
    case Json::value_t::boolean:
      return v.get<bool>() ? "True" : "False";
    case Json::value_t::string:
      return py_repr_string(v.get_ref<const std::string&>());
    case Json::value_t::number_float:
      return py_float(v.get<double>());
    case Json::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + py_repr(v[i]);
      return out + "]";
    }
    case Json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.items()) {
        out += (first ? "" : ", ") + py_repr_string(k) + ": " + py_repr(x);
        first = false;
      }
      return out + "}";
    }
    default:
      return v.dump();  // integers
  }
}

// str(value), what {{ }} prints.
std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined:
      return "";
    case Value::Kind::ns:
      return "<Namespace " + py_repr(*v.ns) + ">";
    case Value::Kind::func:
      return "<function " + v.what + ">";
    case Value::Kind::data:
      break;
  }
  if (v.j().is_string()) return v.j().get<std::string>();
  return py_repr(v.j());
}

void python_json_into(const Json& v, int indent, int level, std::string& out) {
  const bool nl = indent >= 0;
  auto newline = [&](int lvl) {
    out += '\n';
    out.append(static_cast<size_t>(indent * lvl), ' ');
  };
  if (v.is_array() && !v.empty()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += nl ? "," : ", ";
      if (nl) newline(level + 1);
      python_json_into(v[i], indent, level + 1, out);
    }
    if (nl) newline(level);
    out += ']';
  } else if (v.is_object() && !v.empty()) {
    out += '{';
    bool first = true;
    for (const auto& [k, x] : v.items()) {
      if (!first) out += nl ? "," : ", ";
      first = false;
      if (nl) newline(level + 1);
      out += Json(k).dump(-1, ' ', false, Json::error_handler_t::replace);
      out += ": ";
      python_json_into(x, indent, level + 1, out);
    }
    if (nl) newline(level);
    out += '}';
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : py_float(d);
  } else {
    out += v.dump(-1, ' ', false, Json::error_handler_t::replace);  // strings unescaped beyond JSON's needs
  }
}

}  // namespace

std::string python_json(const Json& v, int indent) {
  std::string out;
  python_json_into(v, indent, 0, out);
  return out;
}

// ---- lexer ----------------------------------------------------------------------------------

namespace {

enum class Tok { name, string, integer, floating, op, end };

struct Token {
  Tok type = Tok::end;
  std::string text;  // name, operator, or the unescaped string
  Json number;
  int line = 0;
};

// One piece of the template: text, or a tag's tokens.
struct Piece {
  enum Kind { kText, kVar, kBlock } kind = kText;
  std::string text;
  std::vector<Token> tokens;  // var/block: the expression tokens, ending with Tok::end
  int line = 0;
};

[[noreturn]] void fail_at(const std::string& name, int line, const std::string& problem, const std::string& hint = {}) {
  throw UserError(name + " line " + std::to_string(line), problem, hint);
}

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Python's string-literal escapes, as jinja2 unescapes its string tokens.
std::string unescape(std::string_view s, const std::string& name, int line) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char e = s[++i];
    auto hex = [&](size_t n) {
      const std::string digits(s.substr(i + 1, n));
      if (digits.size() != n || digits.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
        fail_at(name, line, "a malformed \\x/\\u escape in a string");
      i += n;
      utf8_append(out, static_cast<char32_t>(std::stoul(digits, nullptr, 16)));
    };
    switch (e) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '0':
        out += '\0';
        break;
      case '\n':
        break;  // a backslash-newline continues the line
      case 'x':
        hex(2);
        break;
      case 'u':
        hex(4);
        break;
      case 'U':
        hex(8);
        break;
      default:  // unknown escapes keep their backslash, as Python's
        out += '\\';
        out += e;
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string source, const std::string& name) : src_(std::move(source)), name_(name) {}

  std::vector<Piece> run() {
    std::vector<Piece> pieces;
    bool line_start = true;  // the next text starts a line (lstrip_blocks may apply)
    int strip_next = 0;      // 1: drop one '\n' (trim_blocks); 2: drop all whitespace (`-`)
    size_t pos = 0;
    while (pos <= src_.size()) {
      size_t tag = find_tag(pos);
      std::string text = src_.substr(pos, tag - pos);
      const int text_line = line_;
      count_lines(pos, tag);
      if (strip_next == 2) text.erase(0, std::min(text.size(), text.find_first_not_of(" \t\n\r\v\f")));
      if (strip_next == 1 && !text.empty() && text[0] == '\n') text.erase(0, 1);
      if (tag == src_.size()) {
        push_text(pieces, std::move(text), text_line);
        break;
      }
      const char kind = src_[tag + 1];  // '{', '%' or '#'
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign == '-') {
        const size_t keep = text.find_last_not_of(" \t\n\r\v\f");
        text.erase(keep == std::string::npos ? 0 : keep + 1);
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks
        const size_t nl = text.rfind('\n');
        const size_t from = nl == std::string::npos ? 0 : nl + 1;
        if ((nl != std::string::npos || line_start) && from < text.size() &&
            text.find_first_not_of(" \t\r\v\f", from) == std::string::npos)
          text.erase(from);
      }
      push_text(pieces, std::move(text), text_line);
      pos = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      const int tag_line = line_;
      char end_sign = 0;
      if (kind == '#') {
        const size_t close = src_.find("#}", pos);
        if (close == std::string::npos) fail_at(name_, tag_line, "a comment {# is never closed with #}");
        end_sign = close > pos ? src_[close - 1] : 0;
        count_lines(pos, close);
        pos = close + 2;
      } else {
        Piece p;
        p.kind = kind == '{' ? Piece::kVar : Piece::kBlock;
        p.line = tag_line;
        pos = lex_tag(pos, kind == '{' ? '}' : '%', p.tokens, end_sign);
        pieces.push_back(std::move(p));
      }
      strip_next = end_sign == '-' ? 2 : (kind != '{' && end_sign != '+') ? 1 : 0;
      line_start = strip_next == 1 && pos < src_.size() && src_[pos] == '\n';
      if (strip_next == 2) {
        const size_t next = src_.find_first_not_of(" \t\n\r\v\f", pos);
        const size_t stop = next == std::string::npos ? src_.size() : next;
        line_start = stop > pos && src_[stop - 1] == '\n';
      }
    }
    return pieces;
  }

 private:
  void push_text(std::vector<Piece>& pieces, std::string text, int line) {
    if (text.empty()) return;
    Piece p;
    p.text = std::move(text);
    p.line = line;
    pieces.push_back(std::move(p));
  }
  void count_lines(size_t from, size_t to) {
    line_ += static_cast<int>(
        std::count(src_.begin() + static_cast<long>(from), src_.begin() + static_cast<long>(to), '\n'));
  }
  size_t find_tag(size_t pos) const {
    for (size_t p = src_.find('{', pos); p != std::string::npos; p = src_.find('{', p + 1))
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    return src_.size();
  }

  // Tokens of a {{ }} or {% %} tag from `pos` to its closing `close`} (when no bracket is open);
  // returns the position after the tag and sets `end_sign` to the '-' or '+' before it.
  size_t lex_tag(size_t pos, char close, std::vector<Token>& out, char& end_sign) {
    int depth = 0;
    static const char* kTwo[] = {"==", "!=", "<=", ">=", "//", "**"};
    while (true) {
      while (pos < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos]))) {
        if (src_[pos] == '\n') ++line_;
        ++pos;
      }
      if (pos >= src_.size()) fail_at(name_, line_, std::string("a tag is never closed with ") + close + "}");
      const char c = src_[pos];
      if (depth == 0) {
        for (char s : {'-', '+', '\0'}) {
          const size_t at = pos + (s ? 1 : 0);
          if ((s == 0 || c == s) && at + 1 < src_.size() && src_[at] == close && src_[at + 1] == '}') {
            end_sign = s;
            out.push_back({Tok::end, "", {}, line_});
            return at + 2;
          }
        }
      }
      Token t;
      t.line = line_;
      if (is_name_start(c)) {
        size_t e = pos;
        while (e < src_.size() && is_name_char(src_[e])) ++e;
        t.type = Tok::name;
        t.text = src_.substr(pos, e - pos);
        pos = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = pos;
        while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        bool is_float = false;
        if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
          is_float = true;
          for (++e; e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_');) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t x = e + 1;
          if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
          if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
            is_float = true;
            for (e = x; e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]));) ++e;
          }
        }
        std::string digits = src_.substr(pos, e - pos);
        digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
        t.type = is_float ? Tok::floating : Tok::integer;
        try {
          t.number = is_float ? Json(std::stod(digits)) : Json(std::stoll(digits));
        } catch (const std::out_of_range&) {
          fail_at(name_, line_, "the number " + digits + " is out of range");
        }
        pos = e;
      } else if (c == '\'' || c == '"') {
        size_t e = pos + 1;
        while (e < src_.size() && src_[e] != c) e += src_[e] == '\\' ? 2 : 1;
        if (e >= src_.size()) fail_at(name_, line_, "a string literal is never closed");
        t.type = Tok::string;
        t.text = unescape(std::string_view(src_).substr(pos + 1, e - pos - 1), name_, line_);
        count_lines(pos, e);
        pos = e + 1;
      } else {
        t.type = Tok::op;
        for (const char* two : kTwo)
          if (src_.compare(pos, 2, two) == 0) t.text = two;
        if (t.text.empty()) {
          if (std::string_view("+-*/%~<>=()[]{}.,:|").find(c) == std::string_view::npos)
            fail_at(name_, line_, std::string("unexpected character '") + c + "' in a tag");
          t.text = std::string(1, c);
        }
        if (c == '(' || c == '[' || c == '{') ++depth;
        if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        pos += t.text.size();
      }
      out.push_back(std::move(t));
    }
  }

  std::string src_;
  const std::string& name_;
  int line_ = 1;
};

}  // namespace

// ---- AST ------------------------------------------------------------------------------------

namespace {

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum class K { literal, name, list, dict, attr, index, slice, call, filter, test, unary, binary, cond };
  K k;
  int line = 0;
  Json literal;
  std::string name;         // name, attribute, filter, test, operator
  bool negate = false;      // `is not`
  std::vector<ExprP> args;  // operands, elements (dict: key, value, ...), call/filter/test arguments
  std::vector<std::pair<std::string, ExprP>> kwargs;
  ExprP target;  // attr/index/slice/call/filter/test: the object
};

}  // namespace

struct Node {
  enum class K { text, output, if_, for_, set, set_block, break_, continue_, generation, macro };
  K k;
  int line = 0;
  std::string text;
  ExprP expr;                                                                  // output, set value, for iterable
  std::vector<std::string> names;                                              // set / for targets
  std::string attr;                                                            // set ns.attr
  ExprP filter;                                                                // for ... if filter
  std::vector<std::pair<ExprP, std::vector<std::unique_ptr<Node>>>> branches;  // if/elif; for: the body
  std::vector<std::unique_ptr<Node>> else_body;
  std::vector<ExprP> defaults;  // macro: per parameter (names[1..]), or null
};

namespace {

using NodeP = std::unique_ptr<Node>;
using Body = std::vector<NodeP>;

class Parser {
 public:
  Parser(std::vector<Piece> pieces, const std::string& name) : pieces_(std::move(pieces)), name_(name) {}

  Body parse_template() {
    std::string end;
    Body b = parse_body({}, end);
    return b;
  }

 private:
  [[noreturn]] void fail(int line, const std::string& problem) const {
    fail_at(name_, line, problem,
            "check the template's syntax; loom renders the Jinja2 subset that chat templates use "
            "(src/data/jinja.h lists it): give another template with --template FILE");
  }

  // Parses pieces until a block tag whose keyword is in `ends`; returns that keyword in `end`
  // (tokens_ then point after the keyword).
  Body parse_body(const std::set<std::string>& ends, std::string& end) {
    Body body;
    while (at_ < pieces_.size()) {
      Piece& p = pieces_[at_++];
      if (p.kind == Piece::kText) {
        auto n = std::make_unique<Node>();
        n->k = Node::K::text;
        n->text = std::move(p.text);
        n->line = p.line;
        body.push_back(std::move(n));
        continue;
      }
      toks_ = &p.tokens;
      ti_ = 0;
      if (p.kind == Piece::kVar) {
        auto n = std::make_unique<Node>();
        n->k = Node::K::output;
        n->line = p.line;
        n->expr = parse_expr();
        expect_end();
        body.push_back(std::move(n));
        continue;
      }
      const Token& kw = next();
      if (kw.type != Tok::name) fail(kw.line, "a block tag {% %} must start with a keyword");
      if (ends.count(kw.text)) {
        end = kw.text;
        return body;
      }
      body.push_back(parse_statement(kw));
    }
    if (!ends.empty()) {
      std::string list;
      for (const auto& e : ends) list += (list.empty() ? "" : " or ") + ("{% " + e + " %}");
      fail(pieces_.empty() ? 1 : pieces_.back().line, "the template ends before " + list);
    }
    return body;
  }

  NodeP parse_statement(const Token& kw) {
    auto n = std::make_unique<Node>();
    n->line = kw.line;
    const std::string& w = kw.text;
    if (w == "if") {
      n->k = Node::K::if_;
      ExprP cond = parse_expr();
      expect_end();
      while (true) {
        std::string end;
        Body b = parse_body({"elif", "else", "endif"}, end);
        n->branches.emplace_back(std::move(cond), std::move(b));
        if (end == "elif") {
          cond = parse_expr();
          expect_end();
          continue;
        }
        if (end == "else") {
          expect_end();
          n->else_body = parse_body({"endif"}, end);
        }
        expect_end();
        break;
      }
    } else if (w == "for") {
      n->k = Node::K::for_;
      do {
        const Token& t = next();
        if (t.type != Tok::name) fail(t.line, "expected a loop variable name after 'for'");
        n->names.push_back(t.text);
      } while (accept_op(","));
      if (!accept_name("in")) fail(kw.line, "expected 'in' in the for loop");
      n->expr = parse_or_cond(/*allow_if=*/false);
      if (accept_name("if")) n->filter = parse_expr();
      if (accept_name("recursive")) fail(kw.line, "recursive for loops are not supported");
      expect_end();
      std::string end;
      Body b = parse_body({"else", "endfor"}, end);
      n->branches.emplace_back(nullptr, std::move(b));
      if (end == "else") {
        expect_end();
        n->else_body = parse_body({"endfor"}, end);
      }
      expect_end();
    } else if (w == "set") {
      const Token& t = next();
      if (t.type != Tok::name) fail(t.line, "expected a variable name after 'set'");
      n->names.push_back(t.text);
      if (accept_op(".")) {
        const Token& a = next();
        if (a.type != Tok::name) fail(a.line, "expected an attribute name after '.' in set");
        n->attr = a.text;
      } else {
        while (accept_op(",")) {
          const Token& more = next();
          if (more.type != Tok::name) fail(more.line, "expected a variable name in set");
          n->names.push_back(more.text);
        }
      }
      if (accept_op("=")) {
        n->k = Node::K::set;
        n->expr = parse_expr();
        if (peek().type == Tok::op && peek().text == ",") {  // set a, b = x, y
          auto tuple = std::make_unique<Expr>();
          tuple->k = Expr::K::list;
          tuple->line = kw.line;
          tuple->args.push_back(std::move(n->expr));
          while (accept_op(",")) tuple->args.push_back(parse_expr());
          n->expr = std::move(tuple);
        }
        expect_end();
      } else {
        if (!n->attr.empty() || n->names.size() != 1) fail(kw.line, "a block set takes one variable name");
        if (peek().type == Tok::op && peek().text == "|") fail(kw.line, "filters on a block set are not supported");
        n->k = Node::K::set_block;
        expect_end();
        std::string end;
        n->branches.emplace_back(nullptr, parse_body({"endset"}, end));
        expect_end();
      }
    } else if (w == "break" || w == "continue") {
      n->k = w == "break" ? Node::K::break_ : Node::K::continue_;
      expect_end();
    } else if (w == "macro") {
      n->k = Node::K::macro;
      const Token& name = next();
      if (name.type != Tok::name) fail(name.line, "expected the macro's name");
      n->names.push_back(name.text);
      expect_op("(");
      while (!accept_op(")")) {
        const Token& p = next();
        if (p.type != Tok::name) fail(p.line, "expected a parameter name in the macro");
        n->names.push_back(p.text);
        n->defaults.push_back(accept_op("=") ? parse_expr() : nullptr);
        if (!accept_op(",")) {
          expect_op(")");
          break;
        }
      }
      expect_end();
      std::string end;
      n->branches.emplace_back(nullptr, parse_body({"endmacro"}, end));
      expect_end();
    } else if (w == "generation") {
      n->k = Node::K::generation;
      expect_end();
      std::string end;
      n->branches.emplace_back(nullptr, parse_body({"endgeneration"}, end));
      expect_end();
    } else {
      fail(kw.line, "the statement '{% " + w + " %}' is not supported");
    }
    return n;
  }

  // ---- expressions: jinja2's precedence, loosest first ----
  ExprP parse_expr() { return parse_or_cond(true); }

  ExprP parse_or_cond(bool allow_if) {
    ExprP e = parse_or();
    while (allow_if && accept_name("if")) {
      auto c = make(Expr::K::cond, e->line);
      c->args.push_back(parse_or());  // condition
      c->args.push_back(std::move(e));
      c->args.push_back(accept_name("else") ? parse_or_cond(true) : nullptr);
      e = std::move(c);
    }
    return e;
  }
  ExprP parse_or() {
    ExprP e = parse_and();
    while (accept_name("or")) e = binary("or", std::move(e), parse_and());
    return e;
  }
  ExprP parse_and() {
    ExprP e = parse_not();
    while (accept_name("and")) e = binary("and", std::move(e), parse_not());
    return e;
  }
  ExprP parse_not() {
    if (peek().type == Tok::name && peek().text == "not") {
      const int line = next().line;
      auto u = make(Expr::K::unary, line);
      u->name = "not";
      u->args.push_back(parse_not());
      return u;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    ExprP e = parse_math1();
    ExprP chain;  // a < b < c is (a < b) and (b < c); b is evaluated twice, which is harmless here
    while (true) {
      std::string op;
      const Token& t = peek();
      if (t.type == Tok::op &&
          (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" || t.text == "<=" || t.text == ">="))
        op = next().text;
      else if (t.type == Tok::name && t.text == "in")
        op = (next(), "in");
      else if (t.type == Tok::name && t.text == "not" && peek(1).type == Tok::name && peek(1).text == "in")
        op = (next(), next(), "not in");
      else
        break;
      ExprP rhs = parse_math1();
      if (!chain) {
        e = binary(op, std::move(e), std::move(rhs));
        chain = std::make_unique<Expr>();  // marks that a comparison was seen
        continue;
      }
      fail(t.line, "chained comparisons (a < b < c) are not supported");
    }
    return e;
  }
  ExprP parse_math1() {
    ExprP e = parse_concat();
    while (peek().type == Tok::op && (peek().text == "+" || peek().text == "-")) {
      const std::string op = next().text;
      e = binary(op, std::move(e), parse_concat());
    }
    return e;
  }
  ExprP parse_concat() {
    ExprP e = parse_math2();
    while (accept_op("~")) e = binary("~", std::move(e), parse_math2());
    return e;
  }
  ExprP parse_math2() {
    ExprP e = parse_pow();
    while (peek().type == Tok::op &&
           (peek().text == "*" || peek().text == "/" || peek().text == "//" || peek().text == "%")) {
      const std::string op = next().text;
      e = binary(op, std::move(e), parse_pow());
    }
    return e;
  }
  ExprP parse_pow() {
    ExprP e = parse_unary(true);
    while (accept_op("**")) e = binary("**", std::move(e), parse_unary(true));
    return e;
  }
  ExprP parse_unary(bool with_filter) {
    ExprP e;
    if (peek().type == Tok::op && (peek().text == "-" || peek().text == "+")) {
      const Token& t = next();
      e = make(Expr::K::unary, t.line);
      e->name = t.text;
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filters(std::move(e)) : std::move(e);
  }
  ExprP parse_primary() {
    const Token& t = next();
    if (t.type == Tok::string) {
      auto e = make(Expr::K::literal, t.line);
      e->literal = t.text;
      while (peek().type == Tok::string) e->literal = e->literal.get<std::string>() + next().text;  // 'a' 'b'
      return e;
    }
    if (t.type == Tok::integer || t.type == Tok::floating) {
      auto e = make(Expr::K::literal, t.line);
      e->literal = t.number;
      return e;
    }
    if (t.type == Tok::name) {
      auto e = make(Expr::K::literal, t.line);
      if (t.text == "true" || t.text == "True")
        e->literal = true;
      else if (t.text == "false" || t.text == "False")
        e->literal = false;
      else if (t.text == "none" || t.text == "None")
        e->literal = nullptr;
      else {
        e->k = Expr::K::name;
        e->name = t.text;
      }
      return e;
    }
    if (t.type == Tok::op && t.text == "(") {
      if (accept_op(")")) return make(Expr::K::list, t.line);  // ()
      ExprP e = parse_expr();
      if (peek().type == Tok::op && peek().text == ",") {  // a tuple: a list here
        auto list = make(Expr::K::list, t.line);
        list->args.push_back(std::move(e));
        while (accept_op(",")) {
          if (peek().type == Tok::op && peek().text == ")") break;
          list->args.push_back(parse_expr());
        }
        e = std::move(list);
      }
      expect_op(")");
      return e;
    }
    if (t.type == Tok::op && t.text == "[") {
      auto e = make(Expr::K::list, t.line);
      while (!accept_op("]")) {
        e->args.push_back(parse_expr());
        if (!accept_op(",")) {
          expect_op("]");
          break;
        }
      }
      return e;
    }
    if (t.type == Tok::op && t.text == "{") {
      auto e = make(Expr::K::dict, t.line);
      while (!accept_op("}")) {
        e->args.push_back(parse_expr());
        expect_op(":");
        e->args.push_back(parse_expr());
        if (!accept_op(",")) {
          expect_op("}");
          break;
        }
      }
      return e;
    }
    fail(t.line, t.type == Tok::end ? "an expression is missing" : "unexpected '" + t.text + "' in an expression");
  }
  ExprP parse_postfix(ExprP e) {
    while (true) {
      if (accept_op(".")) {
        const Token& a = next();
        auto x = make(Expr::K::attr, a.line);
        if (a.type == Tok::integer) {  // foo.0 is foo[0]
          x->k = Expr::K::index;
          auto lit = make(Expr::K::literal, a.line);
          lit->literal = a.number;
          x->args.push_back(std::move(lit));
        } else if (a.type != Tok::name) {
          fail(a.line, "expected an attribute name after '.'");
        }
        x->name = a.text;
        x->target = std::move(e);
        e = std::move(x);
      } else if (peek().type == Tok::op && peek().text == "[") {
        const int line = next().line;
        ExprP parts[3];
        int colons = 0;
        while (!(peek().type == Tok::op && peek().text == "]")) {
          if (accept_op(":")) {
            if (++colons > 2) fail(line, "a slice has at most two ':'");
            continue;
          }
          if (parts[colons]) fail(line, "expected ':' or ']' in a subscript");
          parts[colons] = parse_expr();
        }
        next();
        ExprP x = make(colons ? Expr::K::slice : Expr::K::index, line);
        if (!colons && !parts[0]) fail(line, "an empty subscript []");
        for (int i = 0; i < (colons ? 3 : 1); ++i) x->args.push_back(std::move(parts[i]));
        x->target = std::move(e);
        e = std::move(x);
      } else if (peek().type == Tok::op && peek().text == "(") {
        auto x = make(Expr::K::call, next().line);
        parse_call_args(*x);
        x->target = std::move(e);
        e = std::move(x);
      } else {
        return e;
      }
    }
  }
  // After '(': positional and name=value arguments up to ')'.
  void parse_call_args(Expr& call) {
    while (!accept_op(")")) {
      if (peek().type == Tok::name && peek(1).type == Tok::op && peek(1).text == "=") {
        std::string key = next().text;
        next();
        call.kwargs.emplace_back(std::move(key), parse_expr());
      } else {
        if (!call.kwargs.empty()) fail(peek().line, "a positional argument follows a keyword argument");
        call.args.push_back(parse_expr());
      }
      if (!accept_op(",")) {
        expect_op(")");
        break;
      }
    }
  }
  ExprP parse_filters(ExprP e) {
    while (true) {
      if (accept_op("|")) {
        const Token& f = next();
        if (f.type != Tok::name) fail(f.line, "expected a filter name after '|'");
        auto x = make(Expr::K::filter, f.line);
        x->name = f.text;
        if (accept_op("(")) parse_call_args(*x);
        x->target = std::move(e);
        e = std::move(x);
      } else if (peek().type == Tok::name && peek().text == "is") {
        const int line = next().line;
        auto x = make(Expr::K::test, line);
        x->negate = accept_name("not");
        const Token& tn = next();
        if (tn.type != Tok::name) fail(tn.line, "expected a test name after 'is'");
        x->name = tn.text;
        if (accept_op("(")) {
          parse_call_args(*x);
        } else {
          const Token& a = peek();
          const bool arg = a.type == Tok::string || a.type == Tok::integer || a.type == Tok::floating ||
                           (a.type == Tok::op && (a.text == "[" || a.text == "{" || a.text == "(")) ||
                           (a.type == Tok::name && a.text != "else" && a.text != "or" && a.text != "and" &&
                            a.text != "if" && a.text != "is" && a.text != "in" && a.text != "not");
          if (arg) x->args.push_back(parse_postfix(parse_primary()));
        }
        x->target = std::move(e);
        e = std::move(x);
      } else {
        return e;
      }
    }
  }

  ExprP make(Expr::K k, int line) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->line = line;
    return e;
  }
  ExprP binary(const std::string& op, ExprP a, ExprP b) {
    auto e = make(Expr::K::binary, a->line);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }
  const Token& peek(size_t ahead = 0) const {
    const size_t i = std::min(ti_ + ahead, toks_->size() - 1);
    return (*toks_)[i];
  }
  const Token& next() {
    const Token& t = peek();
    if (ti_ < toks_->size() - 1) ++ti_;
    return t;
  }
  bool accept_op(const char* op) {
    if (peek().type == Tok::op && peek().text == op) return next(), true;
    return false;
  }
  bool accept_name(const char* w) {
    if (peek().type == Tok::name && peek().text == w) return next(), true;
    return false;
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) fail(peek().line, std::string("expected '") + op + "'" + found());
  }
  void expect_end() {
    if (peek().type != Tok::end) fail(peek().line, "expected the end of the tag" + found());
  }
  std::string found() const {
    return peek().type == Tok::end ? " but the tag ends" : " but found '" + peek().text + "'";
  }

  std::vector<Piece> pieces_;
  const std::string& name_;
  size_t at_ = 0;
  std::vector<Token>* toks_ = nullptr;
  size_t ti_ = 0;
};

}  // namespace

// ---- evaluation -----------------------------------------------------------------------------

namespace {

enum class Flow { normal, break_, continue_ };

class Renderer {
 public:
  // `loop_items`: the template mentions loop.previtem or loop.nextitem (copies made only then).
  // `spans`: when not null, receives the byte ranges of `root` (the output) that generation blocks wrote.
  Renderer(const std::string& name, const Json& context, bool loop_items, const std::string* root = nullptr,
           Spans* spans = nullptr)
      : name_(name), loop_items_(loop_items), root_(root), spans_(spans) {
    frames_.emplace_back();
    for (const auto& [k, v] : context.items()) frames_.back()[k] = Value::borrow(v);
    frames_.emplace_back();  // the template's own top-level variables
  }

  Flow exec(const Body& body, std::string& out) {
    for (const auto& n : body) {
      const Flow f = exec(*n, out);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

 private:
  [[noreturn]] void fail(int line, const std::string& problem) const { fail_at(name_, line, problem); }

  Flow exec(const Node& n, std::string& out) {
    switch (n.k) {
      case Node::K::text:
        out += n.text;
        return Flow::normal;
      case Node::K::output:
        out += to_str(eval(*n.expr));
        return Flow::normal;
      case Node::K::if_:
        for (const auto& [cond, body] : n.branches)
          if (truthy(eval(*cond))) return exec(body, out);
        return exec(n.else_body, out);
      case Node::K::for_:
        return exec_for(n, out);
      case Node::K::set:
        assign(n, eval(*n.expr));
        return Flow::normal;
      case Node::K::set_block: {
        std::string text;
        exec(n.branches[0].second, text);
        assign(n, Value::of(text));
        return Flow::normal;
      }
      case Node::K::break_:
        return Flow::break_;
      case Node::K::continue_:
        return Flow::continue_;
      case Node::K::generation: {
        if (!spans_) return exec(n.branches[0].second, out);
        // As transformers' AssistantTracker: the span is where the block's text lands in the output,
        // which is only known when the block writes to the output itself.
        if (&out != root_)
          fail(n.line,
               "a {% generation %} block inside a macro or a {% set %} block: where its text lands in the "
               "output is unknown");
        const size_t begin = out.size();
        const Flow f = exec(n.branches[0].second, out);
        spans_->emplace_back(begin, out.size());
        return f;
      }
      case Node::K::macro: {
        Value m = Value::func(n.names[0]);
        m.macro = &n;
        frames_.back()[n.names[0]] = std::move(m);
        return Flow::normal;
      }
    }
    return Flow::normal;
  }

  void assign(const Node& n, Value v) {
    if (!n.attr.empty()) {
      const Value ns = lookup(n.names[0]);
      if (ns.kind != Value::Kind::ns)
        fail(n.line, "'set " + n.names[0] + "." + n.attr + "' needs " + n.names[0] + " to be a namespace()");
      if (!v.is_data()) fail(n.line, "only data can be stored in a namespace");
      (*ns.ns)[n.attr] = v.j();
      return;
    }
    if (n.names.size() == 1) {
      frames_.back()[n.names[0]] = std::move(v);
      return;
    }
    if (!v.is_data() || !v.j().is_array() || v.j().size() != n.names.size())
      fail(n.line, "cannot unpack the value into " + std::to_string(n.names.size()) + " names");
    for (size_t i = 0; i < n.names.size(); ++i) frames_.back()[n.names[i]] = Value::of(v.j()[i]);
  }

  Flow exec_for(const Node& n, std::string& out) {
    const Value seq = eval(*n.expr);
    std::vector<Value> items;
    if (seq.is_data() && seq.j().is_array()) {  // the items themselves, not copies
      for (const Json& x : seq.j()) items.push_back(Value::part(seq, x));
    } else {
      for (Json& x : iterate(seq, n.line)) items.push_back(Value::of(std::move(x)));
    }
    if (n.filter) {
      std::vector<Value> kept;
      for (auto& item : items) {
        frames_.emplace_back();
        bind_targets(n, item);
        const bool keep = truthy(eval(*n.filter));
        frames_.pop_back();
        if (keep) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(n.else_body, out);
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      frames_.emplace_back();
      Json loop = {{"index", i + 1},  {"index0", i},          {"revindex", len - i}, {"revindex0", len - i - 1},
                   {"first", i == 0}, {"last", i == len - 1}, {"length", len},       {"depth", 1},
                   {"depth0", 0}};
      if (loop_items_ && i > 0) loop["previtem"] = items[static_cast<size_t>(i - 1)].j();
      if (loop_items_ && i + 1 < len) loop["nextitem"] = items[static_cast<size_t>(i + 1)].j();
      frames_.back()["loop"] = Value::of(std::move(loop));
      bind_targets(n, items[static_cast<size_t>(i)]);
      const Flow f = exec(n.branches[0].second, out);
      frames_.pop_back();
      if (f == Flow::break_) break;
    }
    return Flow::normal;
  }

  void bind_targets(const Node& n, const Value& item) {
    if (n.names.size() == 1) {
      frames_.back()[n.names[0]] = item;
      return;
    }
    if (!item.j().is_array() || item.j().size() != n.names.size())
      fail(n.line, "cannot unpack a loop item into " + std::to_string(n.names.size()) + " names");
    for (size_t i = 0; i < n.names.size(); ++i) frames_.back()[n.names[i]] = Value::part(item, item.j()[i]);
  }

  // The items a for loop (or list()) walks: list items, dict keys, string characters.
  std::vector<Json> iterate(const Value& v, int line) const {
    std::vector<Json> items;
    if (!v.defined()) return items;  // jinja2's Undefined iterates as empty
    if (v.kind == Value::Kind::ns || v.kind == Value::Kind::func || v.j().is_null() || v.j().is_number() ||
        v.j().is_boolean())
      fail(line, "cannot iterate over " + type_name(v));
    if (v.j().is_array()) items.assign(v.j().begin(), v.j().end());
    if (v.j().is_object())
      for (const auto& [k, x] : v.j().items()) items.emplace_back(k);
    if (v.j().is_string())
      for (char32_t c : to_u32(v.j().get_ref<const std::string&>())) items.emplace_back(to_u8(std::u32string(1, c)));
    return items;
  }

  Value lookup(const std::string& name) const {
    for (auto f = frames_.rbegin(); f != frames_.rend(); ++f)
      if (auto it = f->find(name); it != f->end()) return it->second;
    if (name == "raise_exception" || name == "namespace" || name == "strftime_now" || name == "range")
      return Value::func(name);
    return Value::undef("'" + name + "' is undefined");
  }

  static std::string type_name(const Value& v) {
    switch (v.kind) {
      case Value::Kind::undefined:
        return "an undefined value (" + v.what + ")";
      case Value::Kind::ns:
        return "a namespace";
      case Value::Kind::func:
        return "the function " + v.what;
      case Value::Kind::data:
        break;
    }
    switch (v.j().type()) {
      case Json::value_t::null:
        return "none";
      case Json::value_t::boolean:
        return "a boolean";
      case Json::value_t::string:
        return "a string";
      case Json::value_t::array:
        return "a list";
      case Json::value_t::object:
        return "a dict";
      case Json::value_t::number_float:
        return "a float";
      default:
        return "an integer";
    }
  }

  static bool truthy(const Value& v) {
    if (v.kind != Value::Kind::data) return v.defined();
    const Json& j = v.j();
    if (j.is_null()) return false;
    if (j.is_boolean()) return j.get<bool>();
    if (j.is_number_float()) return j.get<double>() != 0.0;
    if (j.is_number()) return j.get<int64_t>() != 0;
    if (j.is_string()) return !j.get_ref<const std::string&>().empty();
    if (j.is_array() || j.is_object()) return !j.empty();
    return true;
  }

  // The value of a data operand; an undefined one is jinja2's UndefinedError.
  const Json& data(const Value& v, int line, const char* use) const {
    if (v.kind == Value::Kind::data) return v.j();
    if (v.kind == Value::Kind::ns) return *v.ns;
    if (!v.defined()) fail(line, v.what + " (used in " + use + ")");
    fail(line, "the function " + v.what + " cannot be used in " + use);
  }
  const std::string& str_arg(const Value& v, int line, const char* use) const {
    const Json& j = data(v, line, use);
    if (!j.is_string()) fail(line, std::string(use) + " needs a string, not " + type_name(v));
    return j.get_ref<const std::string&>();
  }
  int64_t int_arg(const Value& v, int line, const char* use) const {
    const Json& j = data(v, line, use);
    if (!j.is_number_integer()) fail(line, std::string(use) + " needs an integer, not " + type_name(v));
    return j.get<int64_t>();
  }

  Value eval(const Expr& e) {
    switch (e.k) {
      case Expr::K::literal:
        return Value::of(e.literal);
      case Expr::K::name:
        return lookup(e.name);
      case Expr::K::list: {
        Json a = Json::array();
        for (const auto& x : e.args) a.push_back(data(eval(*x), e.line, "a list"));
        return Value::of(std::move(a));
      }
      case Expr::K::dict: {
        Json o = Json::object();
        for (size_t i = 0; i < e.args.size(); i += 2)
          o[str_arg(eval(*e.args[i]), e.line, "a dict key")] = data(eval(*e.args[i + 1]), e.line, "a dict");
        return Value::of(std::move(o));
      }
      case Expr::K::attr:
        return get_attr(eval(*e.target), e.name, e.line);
      case Expr::K::index:
        return get_item(eval(*e.target), eval(*e.args[0]), e.line);
      case Expr::K::slice:
        return slice(e);
      case Expr::K::call:
        return call(e);
      case Expr::K::filter:
        return filter(e);
      case Expr::K::test: {
        const bool r = test(e.name, eval(*e.target), args_of(e), e.line);
        return Value::of(e.negate ? !r : r);
      }
      case Expr::K::unary: {
        const Value v = eval(*e.args[0]);
        if (e.name == "not") return Value::of(!truthy(v));
        const Json& j = data(v, e.line, "unary -");
        if (!j.is_number() || j.is_boolean()) fail(e.line, "unary " + e.name + " needs a number");
        if (e.name == "+") return v;
        return Value::of(j.is_number_float() ? Json(-j.get<double>()) : Json(-j.get<int64_t>()));
      }
      case Expr::K::binary:
        return binary(e);
      case Expr::K::cond:
        if (truthy(eval(*e.args[0]))) return eval(*e.args[1]);
        if (e.args[2]) return eval(*e.args[2]);
        return Value::undef("the inline if had no else");
    }
    return Value::undef("?");
  }

  std::vector<Value> args_of(const Expr& e) {
    std::vector<Value> out;
    for (const auto& a : e.args) out.push_back(eval(*a));
    return out;
  }
  // Positional argument i, or keyword `key`, or `dflt`.
  Value arg(const Expr& e, std::vector<Value>& pos, size_t i, const char* key, Value dflt = Value::undef("")) {
    if (i < pos.size()) return pos[i];
    for (const auto& [k, x] : e.kwargs)
      if (k == key) return eval(*x);
    return dflt;
  }
  void check_kwargs(const Expr& e, std::initializer_list<const char*> known, const std::string& what) const {
    for (const auto& [k, x] : e.kwargs)
      if (std::none_of(known.begin(), known.end(), [&](const char* s) { return k == s; }))
        fail(e.line, what + " has no keyword argument '" + k + "'");
  }

  Value get_attr(const Value& obj, const std::string& attr, int line) const {
    if (!obj.defined()) fail(line, obj.what + " (reading ." + attr + ")");
    if (obj.kind == Value::Kind::ns) {
      if (auto it = obj.ns->find(attr); it != obj.ns->end()) return Value::of(*it);
      return Value::undef("the namespace has no attribute '" + attr + "'");
    }
    if (obj.is_data() && obj.j().is_object())
      if (auto it = obj.j().find(attr); it != obj.j().end()) return Value::part(obj, *it);
    return Value::undef(type_name(obj) + " has no attribute '" + attr + "'");
  }

  Value get_item(const Value& obj, const Value& key, int line) const {
    if (!obj.defined()) fail(line, obj.what + " (subscripted)");
    if (obj.kind == Value::Kind::ns)
      return key.is_string() ? get_attr(obj, key.j().get<std::string>(), line) : Value::undef("");
    const Json& j = obj.j();
    if (j.is_object()) {
      if (key.is_string())
        if (auto it = j.find(key.j().get<std::string>()); it != j.end()) return Value::part(obj, *it);
      return Value::undef("the dict has no key " + (key.is_data() ? py_repr(key.j()) : std::string("?")));
    }
    if ((j.is_array() || j.is_string()) && key.is_data() && key.j().is_number_integer()) {
      int64_t i = key.j().get<int64_t>();
      if (j.is_array()) {
        const auto n = static_cast<int64_t>(j.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return Value::part(obj, j[static_cast<size_t>(i)]);
        return Value::undef("list index " + std::to_string(key.j().get<int64_t>()) + " is out of range");
      }
      const std::u32string s = to_u32(j.get_ref<const std::string&>());
      const auto n = static_cast<int64_t>(s.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value::of(to_u8(s.substr(static_cast<size_t>(i), 1)));
      return Value::undef("string index out of range");
    }
    if (key.is_string()) return get_attr(obj, key.j().get<std::string>(), line);
    return Value::undef(type_name(obj) + " cannot be subscripted with " + type_name(key));
  }

  // Python's slice semantics, on lists and on strings by code point.
  Value slice(const Expr& e) {
    const Value obj = eval(*e.target);
    const Json& j = data(obj, e.line, "a slice");
    auto bound = [&](const ExprP& x, bool& given) -> int64_t {
      given = false;
      if (!x) return 0;
      const Value v = eval(*x);
      if (v.is_none()) return 0;
      given = true;
      return int_arg(v, e.line, "a slice bound");
    };
    bool has_start, has_stop, has_step;
    const int64_t start0 = bound(e.args[0], has_start), stop0 = bound(e.args[1], has_stop);
    int64_t step = bound(e.args[2], has_step);
    if (!has_step) step = 1;
    if (step == 0) fail(e.line, "slice step cannot be zero");
    std::u32string s;
    int64_t n;
    if (j.is_string()) {
      s = to_u32(j.get_ref<const std::string&>());
      n = static_cast<int64_t>(s.size());
    } else if (j.is_array()) {
      n = static_cast<int64_t>(j.size());
    } else {
      fail(e.line, "cannot slice " + type_name(obj));
    }
    auto clamp = [&](int64_t v, bool given, int64_t dflt) {
      if (!given) return dflt;
      if (v < 0) v += n;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t start = clamp(start0, has_start, step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(stop0, has_stop, step > 0 ? n : -1);
    Json out = j.is_string() ? Json("") : Json::array();
    std::u32string text;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (j.is_string())
        text.push_back(s[static_cast<size_t>(i)]);
      else
        out.push_back(j[static_cast<size_t>(i)]);
    }
    if (j.is_string()) out = to_u8(text);
    return Value::of(std::move(out));
  }

  static bool py_equal(const Value& a, const Value& b) {
    if (a.kind != b.kind) return false;
    if (a.kind == Value::Kind::undefined) return true;
    if (a.kind == Value::Kind::ns) return a.ns == b.ns;
    if (a.kind == Value::Kind::func) return a.what == b.what;
    if (a.j().is_number() && b.j().is_number() && !a.j().is_boolean() && !b.j().is_boolean())
      return a.j().get<double>() == b.j().get<double>();
    return a.j() == b.j();
  }

  // -1, 0, 1 for numbers or strings; anything else is an error, as in Python.
  int compare(const Value& a, const Value& b, int line, const std::string& op) const {
    const Json& x = data(a, line, op.c_str());
    const Json& y = data(b, line, op.c_str());
    if (x.is_number() && y.is_number()) {
      const double p = x.get<double>(), q = y.get<double>();
      return p < q ? -1 : p > q ? 1 : 0;
    }
    if (x.is_string() && y.is_string()) {
      const auto c = to_u32(x.get_ref<const std::string&>()).compare(to_u32(y.get_ref<const std::string&>()));
      return c < 0 ? -1 : c > 0 ? 1 : 0;
    }
    fail(line, "cannot compare " + type_name(a) + " and " + type_name(b) + " with " + op);
  }

  bool contains(const Value& hay, const Value& needle, int line) const {
    if (!hay.defined()) return false;  // jinja2's Undefined iterates as empty
    const Json& h = data(hay, line, "'in'");
    if (h.is_string())
      return h.get_ref<const std::string&>().find(str_arg(needle, line, "'in' on a string")) != std::string::npos;
    if (h.is_array())
      return std::any_of(h.begin(), h.end(), [&](const Json& x) { return py_equal(Value::of(x), needle); });
    if (h.is_object()) return needle.is_string() && h.contains(needle.j().get<std::string>());
    fail(line, "'in' needs a string, list or dict on its right, not " + type_name(hay));
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value a = eval(*e.args[0]);
      return truthy(a) ? eval(*e.args[1]) : a;
    }
    if (op == "or") {
      Value a = eval(*e.args[0]);
      return truthy(a) ? a : eval(*e.args[1]);
    }
    const Value a = eval(*e.args[0]);
    const Value b = eval(*e.args[1]);
    if (op == "==") return Value::of(py_equal(a, b));
    if (op == "!=") return Value::of(!py_equal(a, b));
    if (op == "<") return Value::of(compare(a, b, e.line, op) < 0);
    if (op == ">") return Value::of(compare(a, b, e.line, op) > 0);
    if (op == "<=") return Value::of(compare(a, b, e.line, op) <= 0);
    if (op == ">=") return Value::of(compare(a, b, e.line, op) >= 0);
    if (op == "in") return Value::of(contains(b, a, e.line));
    if (op == "not in") return Value::of(!contains(b, a, e.line));
    if (op == "~") return Value::of(to_str(a) + to_str(b));
    const Json& x = data(a, e.line, ("'" + op + "'").c_str());
    const Json& y = data(b, e.line, ("'" + op + "'").c_str());
    if (op == "+" && x.is_string() && y.is_string()) return Value::of(x.get<std::string>() + y.get<std::string>());
    if (op == "+" && x.is_array() && y.is_array()) {
      Json r = x;
      for (const auto& v : y) r.push_back(v);
      return Value::of(std::move(r));
    }
    if (op == "*" && ((x.is_string() && y.is_number_integer()) || (x.is_number_integer() && y.is_string()))) {
      const std::string& s = x.is_string() ? x.get_ref<const std::string&>() : y.get_ref<const std::string&>();
      std::string r;
      for (int64_t k = 0, n = (x.is_string() ? y : x).get<int64_t>(); k < n; ++k) r += s;
      return Value::of(r);
    }
    if (op == "%" && x.is_string()) fail(e.line, "'%' string formatting is not supported");
    if (!x.is_number() || !y.is_number())
      fail(e.line, "'" + op + "' needs two numbers (or two strings or lists for '+'), not " + type_name(a) + " and " +
                       type_name(b));
    const bool ints = x.is_number_integer() && y.is_number_integer();
    if (ints && op != "/" && op != "**") {
      const int64_t p = x.get<int64_t>(), q = y.get<int64_t>();
      if ((op == "//" || op == "%") && q == 0) fail(e.line, "integer division or modulo by zero");
      if (op == "+") return Value::of(p + q);
      if (op == "-") return Value::of(p - q);
      if (op == "*") return Value::of(p * q);
      const int64_t d = p / q - ((p % q != 0 && ((p < 0) != (q < 0))) ? 1 : 0);  // floor, as Python
      if (op == "//") return Value::of(d);
      return Value::of(p - d * q);
    }
    const double p = x.get<double>(), q = y.get<double>();
    if ((op == "/" || op == "//" || op == "%") && q == 0.0) fail(e.line, "division by zero");
    if (op == "+") return Value::of(p + q);
    if (op == "-") return Value::of(p - q);
    if (op == "*") return Value::of(p * q);
    if (op == "/") return Value::of(p / q);
    if (op == "//") return Value::of(std::floor(p / q));
    if (op == "%") return Value::of(p - std::floor(p / q) * q);
    if (ints && y.get<int64_t>() >= 0) {
      int64_t r = 1;
      for (int64_t k = 0; k < y.get<int64_t>(); ++k) r *= x.get<int64_t>();
      return Value::of(r);
    }
    return Value::of(std::pow(p, q));
  }

  // ---- calls: globals and methods ----
  Value call(const Expr& e) {
    std::vector<Value> pos = args_of(e);
    if (e.target->k == Expr::K::attr) {
      const Value obj = eval(*e.target->target);
      if (obj.is_data() && (obj.j().is_string() || obj.j().is_object())) return method(e, obj, e.target->name, pos);
      if (!obj.defined()) fail(e.line, obj.what + " (calling ." + e.target->name + "())");
      fail(e.line, type_name(obj) + " has no method '" + e.target->name + "' that loom knows");
    }
    const Value f = eval(*e.target);
    if (f.kind != Value::Kind::func) {
      if (!f.defined()) fail(e.line, f.what + " (called as a function)");
      fail(e.line, type_name(f) + " is not a function");
    }
    if (f.macro) return call_macro(e, *f.macro, pos);
    const std::string& fn = f.what;
    if (fn == "raise_exception") {
      const std::string msg = pos.empty() ? std::string() : to_str(pos[0]);
      fail_at(name_, e.line, "the template raised an error: " + msg,
              "the conversation does not have the form this model's template accepts");
    }
    if (fn == "namespace") {
      Value ns;
      ns.kind = Value::Kind::ns;
      ns.ns = std::make_shared<Json>(Json::object());
      for (const auto& p : pos) {
        const Json& d = data(p, e.line, "namespace()");
        if (!d.is_object()) fail(e.line, "namespace() takes a dict or keyword arguments");
        for (const auto& [k, v] : d.items()) (*ns.ns)[k] = v;
      }
      for (const auto& [k, x] : e.kwargs) (*ns.ns)[k] = data(eval(*x), e.line, "namespace()");
      return ns;
    }
    if (fn == "strftime_now") {
      const std::string fmt = str_arg(arg(e, pos, 0, "format"), e.line, "strftime_now()");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
      return Value::of(std::string(buf, n));
    }
    // range(stop) / range(start, stop[, step])
    if (pos.empty() || pos.size() > 3) fail(e.line, "range() takes 1 to 3 integers");
    int64_t start = 0, stop = 0, step = 1;
    if (pos.size() == 1) {
      stop = int_arg(pos[0], e.line, "range()");
    } else {
      start = int_arg(pos[0], e.line, "range()");
      stop = int_arg(pos[1], e.line, "range()");
      if (pos.size() == 3) step = int_arg(pos[2], e.line, "range()");
    }
    if (step == 0) fail(e.line, "range() step cannot be zero");
    Json r = Json::array();
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) r.push_back(i);
    return Value::of(std::move(r));
  }

  // A {% macro %}: its arguments bound by position, name or default (missing ones undefined);
  // the body sees them, the render's variables and the template's top-level ones, not the
  // caller's loop variables, and its output is the call's value.
  Value call_macro(const Expr& e, const Node& m, const std::vector<Value>& pos) {
    const size_t np = m.names.size() - 1;
    if (pos.size() > np)
      fail(e.line, "the macro " + m.names[0] + " takes " + std::to_string(np) + " arguments, not " +
                       std::to_string(pos.size()));
    for (const auto& [k, x] : e.kwargs)
      if (std::find(m.names.begin() + 1, m.names.end(), k) == m.names.end())
        fail(e.line, "the macro " + m.names[0] + " has no parameter '" + k + "'");
    std::map<std::string, Value> args;
    for (size_t i = 0; i < np; ++i) {
      const std::string& p = m.names[i + 1];
      Value v = Value::undef("the macro argument '" + p + "' was not given");
      if (i < pos.size()) v = pos[i];
      for (const auto& [k, x] : e.kwargs)
        if (k == p) v = eval(*x);
      if (!v.defined() && m.defaults[i]) v = eval(*m.defaults[i]);
      args[p] = std::move(v);
    }
    std::vector<std::map<std::string, Value>> caller = std::move(frames_);
    frames_ = {caller[0], caller[1], std::move(args)};
    std::string out;
    try {
      exec(m.branches[0].second, out);
    } catch (...) {
      frames_ = std::move(caller);
      throw;
    }
    frames_ = std::move(caller);
    return Value::of(out);
  }

  static std::u32string strip_set(const Value& chars) {
    return chars.is_string() ? to_u32(chars.j().get_ref<const std::string&>()) : std::u32string();
  }
  // Python's str.strip/lstrip/rstrip: `chars` (none: whitespace).
  static std::string py_strip(const std::string& s, const std::u32string& chars, bool left, bool right) {
    const std::u32string u = to_u32(s);
    auto drop = [&](char32_t c) { return chars.empty() ? is_space(c) : chars.find(c) != std::u32string::npos; };
    size_t b = 0, e = u.size();
    while (left && b < e && drop(u[b])) ++b;
    while (right && e > b && drop(u[e - 1])) --e;
    return to_u8(std::u32string_view(u).substr(b, e - b));
  }
  static std::string ascii_map(std::string s, int (*f)(int)) {
    for (char& c : s)
      if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(f(static_cast<unsigned char>(c)));
    return s;
  }
  // Python's str.title(): a letter after a non-letter is upper-cased, others lower-cased.
  static std::string py_title(const std::string& s) {
    std::string out = s;
    bool prev_letter = false;
    for (char& c : out) {
      const auto u = static_cast<unsigned char>(c);
      const bool letter = std::isalpha(u) || u >= 0x80;
      if (u < 0x80) c = static_cast<char>(prev_letter ? std::tolower(u) : std::toupper(u));
      prev_letter = letter;
    }
    return out;
  }
  static std::string py_capitalize(const std::string& s) {
    std::string out = ascii_map(s, [](int c) { return std::tolower(c); });
    if (!out.empty() && static_cast<unsigned char>(out[0]) < 0x80)
      out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
    return out;
  }
  static std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
    std::string out;
    size_t at = 0;
    int64_t done = 0;
    if (from.empty()) {  // Python inserts `to` between characters and at both ends
      const std::u32string u = to_u32(s);
      for (size_t i = 0; i <= u.size(); ++i) {
        if (count < 0 || done < count) out += to, ++done;
        if (i < u.size()) utf8_append(out, u[i]);
      }
      return out;
    }
    for (size_t hit; (count < 0 || done < count) && (hit = s.find(from, at)) != std::string::npos; ++done) {
      out.append(s, at, hit - at);
      out += to;
      at = hit + from.size();
    }
    out.append(s, at, std::string::npos);
    return out;
  }
  Json py_split(const std::string& s, const Value& sep, int64_t maxsplit, int line) const {
    Json out = Json::array();
    if (!sep.defined() || sep.is_none()) {  // runs of whitespace, no empty strings
      const std::u32string u = to_u32(s);
      size_t i = 0;
      while (true) {
        while (i < u.size() && is_space(u[i])) ++i;
        if (i >= u.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
          size_t e = u.size();
          while (e > i && is_space(u[e - 1])) --e;
          out.push_back(to_u8(u.substr(i, e - i)));
          break;
        }
        size_t j = i;
        while (j < u.size() && !is_space(u[j])) ++j;
        out.push_back(to_u8(u.substr(i, j - i)));
        i = j;
      }
      return out;
    }
    const std::string& d = str_arg(sep, line, "split()");
    if (d.empty()) fail(line, "split() separator cannot be empty");
    size_t at = 0;
    for (size_t hit;
         (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) && (hit = s.find(d, at)) != std::string::npos;) {
      out.push_back(s.substr(at, hit - at));
      at = hit + d.size();
    }
    out.push_back(s.substr(at));
    return out;
  }

  Value method(const Expr& e, const Value& obj, const std::string& m, std::vector<Value>& pos) {
    const int line = e.line;
    if (obj.j().is_object()) {
      if (m == "items" || m == "keys" || m == "values") {
        Json r = Json::array();
        for (const auto& [k, v] : obj.j().items())
          r.push_back(m == "items" ? Json::array({k, v}) : m == "keys" ? Json(k) : v);
        return Value::of(std::move(r));
      }
      if (m == "get") {
        const Value k = arg(e, pos, 0, "key");
        if (k.is_string())
          if (auto it = obj.j().find(k.j().get<std::string>()); it != obj.j().end()) return Value::part(obj, *it);
        return arg(e, pos, 1, "default", Value::of(nullptr));
      }
      fail(line, "a dict has no method '" + m + "' that loom knows (items, keys, values, get)");
    }
    const std::string& s = obj.j().get_ref<const std::string&>();
    if (m == "startswith" || m == "endswith") {
      const Value p = arg(e, pos, 0, "prefix");
      std::vector<std::string> options;
      if (p.is_data() && p.j().is_array())
        for (const auto& x : p.j()) options.push_back(str_arg(Value::of(x), line, m.c_str()));
      else
        options.push_back(str_arg(p, line, m.c_str()));
      return Value::of(std::any_of(options.begin(), options.end(), [&](const std::string& o) {
        return o.size() <= s.size() &&
               (m == "startswith" ? s.compare(0, o.size(), o) == 0 : s.compare(s.size() - o.size(), o.size(), o) == 0);
      }));
    }
    if (m == "strip" || m == "lstrip" || m == "rstrip")
      return Value::of(py_strip(s, strip_set(arg(e, pos, 0, "chars")), m != "rstrip", m != "lstrip"));
    if (m == "split") {
      const Value mx = arg(e, pos, 1, "maxsplit", Value::of(-1));
      return Value::of(py_split(s, arg(e, pos, 0, "sep"), int_arg(mx, line, "split()"), line));
    }
    if (m == "replace") {
      const Value c = arg(e, pos, 2, "count", Value::of(-1));
      return Value::of(py_replace(s, str_arg(arg(e, pos, 0, "old"), line, "replace()"),
                                  str_arg(arg(e, pos, 1, "new"), line, "replace()"), int_arg(c, line, "replace()")));
    }
    if (m == "upper") return Value::of(ascii_map(s, [](int c) { return std::toupper(c); }));
    if (m == "lower") return Value::of(ascii_map(s, [](int c) { return std::tolower(c); }));
    if (m == "title") return Value::of(py_title(s));
    if (m == "capitalize") return Value::of(py_capitalize(s));
    if (m == "find" || m == "count") {
      const std::string sub = str_arg(arg(e, pos, 0, "sub"), line, m.c_str());
      if (m == "find") {
        const size_t at = s.find(sub);
        return Value::of(at == std::string::npos ? int64_t{-1} : static_cast<int64_t>(to_u32(s.substr(0, at)).size()));
      }
      if (sub.empty()) return Value::of(static_cast<int64_t>(to_u32(s).size()) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
      return Value::of(n);
    }
    if (m == "join") {
      std::string out;
      const std::vector<Json> items = iterate(arg(e, pos, 0, "iterable"), line);
      for (size_t i = 0; i < items.size(); ++i) out += (i ? s : "") + str_arg(Value::of(items[i]), line, "join()");
      return Value::of(out);
    }
    if (m == "isdigit" || m == "isalpha" || m == "isspace" || m == "isupper" || m == "islower") {
      const std::u32string u = to_u32(s);
      bool ok = !u.empty();
      for (char32_t c : u) {
        if (m == "isdigit") ok = ok && c < 0x80 && std::isdigit(static_cast<int>(c));
        if (m == "isalpha") ok = ok && classify(c) == kLetter;
        if (m == "isspace") ok = ok && is_space(c);
      }
      if (m == "isupper" || m == "islower")
        ok =
            std::any_of(u.begin(), u.end(), [](char32_t c) { return c < 0x80 && std::isalpha(static_cast<int>(c)); }) &&
            std::none_of(u.begin(), u.end(), [&](char32_t c) {
              return c < 0x80 &&
                     (m == "isupper" ? std::islower(static_cast<int>(c)) : std::isupper(static_cast<int>(c)));
            });
      return Value::of(ok);
    }
    fail(line, "a string has no method '" + m + "' that loom knows");
  }

  // ---- tests ----
  bool test(const std::string& t, const Value& v, const std::vector<Value>& a, int line) const {
    auto need = [&](size_t n) {
      if (a.size() < n) fail(line, "the test '" + t + "' needs an argument");
    };
    const bool d = v.is_data();
    const Json& j = v.j();
    if (t == "defined") return v.defined();
    if (t == "undefined") return !v.defined();
    if (t == "none") return v.is_none();
    if (t == "string") return v.is_string();
    if (t == "boolean") return d && j.is_boolean();
    if (t == "true") return d && j.is_boolean() && j.get<bool>();
    if (t == "false") return d && j.is_boolean() && !j.get<bool>();
    if (t == "integer") return d && j.is_number_integer();
    if (t == "float") return d && j.is_number_float();
    if (t == "number") return d && (j.is_number() || j.is_boolean());
    if (t == "mapping") return d && j.is_object();
    if (t == "iterable") return !v.defined() || (d && (j.is_string() || j.is_array() || j.is_object()));
    if (t == "sequence") return d && (j.is_string() || j.is_array() || j.is_object());
    if (t == "callable") return v.kind == Value::Kind::func;
    if (t == "lower" || t == "upper") {
      if (!v.is_string()) return false;
      const std::string& s = j.get_ref<const std::string&>();
      return s ==
             ascii_map(
                 s, t == "lower" ? +[](int c) { return std::tolower(c); } : +[](int c) { return std::toupper(c); });
    }
    if (t == "odd" || t == "even") {
      const int64_t n = int_arg(v, line, "the odd/even test");
      return (((n % 2) + 2) % 2 == 1) == (t == "odd");
    }
    if (t == "divisibleby") {
      need(1);
      const int64_t q = int_arg(a[0], line, "divisibleby");
      return q != 0 && int_arg(v, line, "divisibleby") % q == 0;
    }
    if (t == "equalto" || t == "eq" || t == "==" || t == "sameas") return need(1), py_equal(v, a[0]);
    if (t == "ne" || t == "!=") return need(1), !py_equal(v, a[0]);
    if (t == "lt" || t == "<") return need(1), compare(v, a[0], line, t) < 0;
    if (t == "le" || t == "<=") return need(1), compare(v, a[0], line, t) <= 0;
    if (t == "gt" || t == ">") return need(1), compare(v, a[0], line, t) > 0;
    if (t == "ge" || t == ">=") return need(1), compare(v, a[0], line, t) >= 0;
    if (t == "in") return need(1), contains(a[0], v, line);
    fail(line, "the test 'is " + t + "' is not supported");
  }

  // ---- filters ----
  // Item `attr` of x, where attr may be dotted ("function.name") or an integer index.
  Value attr_path(const Json& x, const Value& attr, int line) const {
    if (attr.is_data() && attr.j().is_number_integer()) return get_item(Value::of(x), attr, line);
    Value cur = Value::of(x);
    const std::string& path = str_arg(attr, line, "attribute");
    for (size_t at = 0; at <= path.size();) {
      const size_t dot = std::min(path.find('.', at), path.size());
      if (!cur.defined()) return cur;
      cur = get_item(cur, Value::of(path.substr(at, dot - at)), line);
      at = dot + 1;
    }
    return cur;
  }

  Value filter(const Expr& e) {
    const std::string& f = e.name;
    const int line = e.line;
    Value v = eval(*e.target);
    std::vector<Value> pos = args_of(e);
    const Json& j = v.j();
    if (f == "safe") return v;
    if (f == "default" || f == "d") {
      check_kwargs(e, {"default_value", "boolean"}, "default");
      const bool boolean = truthy(arg(e, pos, 1, "boolean", Value::of(false)));
      if (!v.defined() || (boolean && !truthy(v))) return arg(e, pos, 0, "default_value", Value::of(""));
      return v;
    }
    if (f == "length" || f == "count") {
      if (!v.defined()) return Value::of(0);
      const Json& x = data(v, line, "length");
      if (x.is_string()) return Value::of(static_cast<int64_t>(to_u32(x.get_ref<const std::string&>()).size()));
      if (x.is_array() || x.is_object()) return Value::of(static_cast<int64_t>(x.size()));
      fail(line, type_name(v) + " has no length");
    }
    if (f == "tojson") {
      check_kwargs(e, {"indent", "ensure_ascii", "separators", "sort_keys"}, "tojson");
      const Value ind = arg(e, pos, 0, "indent", Value::of(nullptr));
      if (arg(e, pos, 2, "separators", Value::of(nullptr)).defined() &&
          !arg(e, pos, 2, "separators", Value::of(nullptr)).is_none())
        fail(line, "tojson(separators=...) is not supported");
      if (truthy(arg(e, pos, 3, "sort_keys", Value::of(false)))) fail(line, "tojson(sort_keys=true) is not supported");
      return Value::of(python_json(data(v, line, "tojson"),
                                   ind.is_none() ? -1 : static_cast<int>(int_arg(ind, line, "tojson indent"))));
    }
    if (f == "string") return Value::of(to_str(v));
    if (f == "trim") {
      return Value::of(py_strip(to_str(v), strip_set(arg(e, pos, 0, "chars")), true, true));
    }
    if (f == "upper") return Value::of(ascii_map(to_str(v), [](int c) { return std::toupper(c); }));
    if (f == "lower") return Value::of(ascii_map(to_str(v), [](int c) { return std::tolower(c); }));
    if (f == "capitalize") return Value::of(py_capitalize(to_str(v)));
    if (f == "title") {  // jinja2: each word (split at runs of -, whitespace, ( { [ <) upper-cased first
      std::string s = to_str(v), out;
      bool word_start = true;
      for (char c : s) {
        const auto u = static_cast<unsigned char>(c);
        const bool sep = u < 0x80 && (std::isspace(u) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<');
        if (u < 0x80 && !sep) c = static_cast<char>(word_start ? std::toupper(u) : std::tolower(u));
        out += c;
        word_start = sep;
      }
      return Value::of(out);
    }
    if (f == "replace") {
      const Value c = arg(e, pos, 2, "count", Value::of(-1));
      return Value::of(py_replace(to_str(v), str_arg(arg(e, pos, 0, "old"), line, "replace"),
                                  str_arg(arg(e, pos, 1, "new"), line, "replace"),
                                  c.is_none() ? -1 : int_arg(c, line, "replace")));
    }
    if (f == "indent") {  // jinja2's do_indent, lines split at \n only
      check_kwargs(e, {"width", "first", "blank"}, "indent");
      const Value w = arg(e, pos, 0, "width", Value::of(4));
      const std::string ind =
          w.is_string() ? w.j().get<std::string>()
                        : std::string(static_cast<size_t>(std::max<int64_t>(0, int_arg(w, line, "indent"))), ' ');
      const bool first = truthy(arg(e, pos, 1, "first", Value::of(false)));
      const bool blank = truthy(arg(e, pos, 2, "blank", Value::of(false)));
      const std::string text = to_str(v) + "\n";
      std::string out;
      for (size_t at = 0, k = 0; at < text.size(); ++k) {
        const size_t end = text.find('\n', at);
        const std::string ln = text.substr(at, end - at);
        if (k > 0) out += "\n" + ((blank || !ln.empty()) ? ind : std::string());
        out += ln;
        at = end + 1;
      }
      return Value::of(first ? ind + out : out);
    }
    if (f == "abs") {
      const Json& x = data(v, line, "abs");
      if (x.is_number_float()) return Value::of(std::fabs(x.get<double>()));
      return Value::of(std::llabs(int_arg(v, line, "abs")));
    }
    if (f == "int") {
      if (v.is_data() && j.is_number()) return Value::of(static_cast<int64_t>(j.get<double>()));
      try {
        return Value::of(std::stoll(py_strip(to_str(v), {}, true, true)));
      } catch (const std::exception&) {
        return arg(e, pos, 0, "default", Value::of(0));
      }
    }
    if (f == "float") {
      if (v.is_data() && j.is_number()) return Value::of(j.get<double>());
      try {
        return Value::of(std::stod(py_strip(to_str(v), {}, true, true)));
      } catch (const std::exception&) {
        return arg(e, pos, 0, "default", Value::of(0.0));
      }
    }
    if (f == "items") {
      if (!v.defined()) return Value::of(Json::array());
      const Json& x = data(v, line, "items");
      if (!x.is_object()) fail(line, "the items filter needs a dict, not " + type_name(v));
      Json r = Json::array();
      for (const auto& [k, y] : x.items()) r.push_back(Json::array({k, y}));
      return Value::of(std::move(r));
    }
    // jinja2's select, reject, selectattr, rejectattr and map give nothing for a falsy value
    // (none included) instead of iterating it.
    const bool selecting = f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr" || f == "map";
    if (selecting && !truthy(v)) return Value::of(Json::array());
    // The rest walk a sequence.
    std::vector<Json> items = iterate(v, line);
    if (f == "list") return Value::of(Json(items));
    if (f == "first" || f == "last") {
      if (items.empty()) return Value::undef("the sequence is empty (" + f + ")");
      return Value::of(f == "first" ? items.front() : items.back());
    }
    if (f == "reverse") {
      if (v.is_string()) {
        std::u32string u = to_u32(j.get_ref<const std::string&>());
        std::reverse(u.begin(), u.end());
        return Value::of(to_u8(u));
      }
      std::reverse(items.begin(), items.end());
      return Value::of(Json(items));
    }
    if (f == "join") {
      check_kwargs(e, {"d", "attribute"}, "join");
      const std::string sep = to_str(arg(e, pos, 0, "d", Value::of("")));
      const Value attr = arg(e, pos, 1, "attribute");
      std::string out;
      for (size_t i = 0; i < items.size(); ++i)
        out += (i ? sep : "") + to_str(attr.defined() ? attr_path(items[i], attr, line) : Value::of(items[i]));
      return Value::of(out);
    }
    if (f == "unique") {
      Json r = Json::array();
      for (const auto& x : items)
        if (std::none_of(r.begin(), r.end(), [&](const Json& y) { return py_equal(Value::of(x), Value::of(y)); }))
          r.push_back(x);
      return Value::of(std::move(r));
    }
    if (f == "map") {
      Json r = Json::array();
      for (const auto& [k, x] : e.kwargs)
        if (k == "attribute") {
          const Value attr = eval(*x);
          Value dflt = arg(e, pos, 99, "default");
          for (const auto& item : items) {
            Value got = attr_path(item, attr, line);
            r.push_back(data(got.defined() ? got : dflt, line, "map"));
          }
          return Value::of(std::move(r));
        }
      if (pos.empty()) fail(line, "map needs attribute=NAME or a filter name");
      fail(line, "map with a filter name is not supported; use map(attribute=...)");
    }
    if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
      const bool by_attr = f == "selectattr" || f == "rejectattr";
      const bool want = f == "select" || f == "selectattr";
      const size_t t0 = by_attr ? 1 : 0;
      if (by_attr && pos.empty()) fail(line, f + " needs an attribute name");
      Json r = Json::array();
      for (const auto& item : items) {
        const Value x = by_attr ? attr_path(item, pos[0], line) : Value::of(item);
        bool ok;
        if (pos.size() <= t0) {
          ok = truthy(x);
        } else {
          const std::string& tname = str_arg(pos[t0], line, "the test name");
          ok = test(tname, x, std::vector<Value>(pos.begin() + static_cast<long>(t0) + 1, pos.end()), line);
        }
        if (ok == want) r.push_back(item);
      }
      return Value::of(std::move(r));
    }
    fail(line, "the filter '" + f + "' is not supported");
  }

  const std::string& name_;
  bool loop_items_;
  const std::string* root_;
  Spans* spans_;
  std::vector<std::map<std::string, Value>> frames_;
};

}  // namespace

// ---- Template -------------------------------------------------------------------------------

namespace {
bool contains_generation(const Body& body) {
  return std::any_of(body.begin(), body.end(), [](const NodeP& n) {
    return n->k == Node::K::generation || contains_generation(n->else_body) ||
           std::any_of(n->branches.begin(), n->branches.end(), [](const auto& b) { return contains_generation(b.second); });
  });
}
}  // namespace

Template::Template(std::string_view source, std::string name) : name_(std::move(name)) {
  // jinja2's defaults: newlines normalised to \n, one trailing newline dropped.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  loop_items_ = src.find("previtem") != std::string::npos || src.find("nextitem") != std::string::npos;
  Parser parser(Lexer(std::move(src), name_).run(), name_);
  body_ = parser.parse_template();
  has_generation_ = contains_generation(body_);
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Json& context, Spans* generation_spans) const {
  LOOM_ASSERT(context.is_object(), "Template::render takes a JSON object of variables");
  std::string out;
  if (generation_spans) generation_spans->clear();
  Renderer r(name_, context, loop_items_, &out, generation_spans);
  const Flow f = r.exec(body_, out);
  if (f != Flow::normal) throw UserError(name_, "{% break %} or {% continue %} outside a for loop");
  return out;
}

}  // namespace loom::jinja
