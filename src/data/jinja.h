// A Jinja2 renderer for chat templates: the subset of the language that the chat templates of
// Llama 3.x, Qwen2.5/3, Mistral, Gemma 2/3, SmolLM2 and their kin use, evaluated the way
// transformers' apply_chat_template evaluates them (jinja2's ImmutableSandboxedEnvironment with
// trim_blocks=True, lstrip_blocks=True and the loopcontrols extension). Loom renders templates
// itself so that `loom prepare chat` needs no Python; tools/check_chat_templates.sh compares the
// output byte for byte with Python's jinja2 on real templates.
//
//   jinja::Template t(source, "tokenizer_config.json chat_template");
//   std::string text = t.render({{"messages", messages}, {"add_generation_prompt", true}});
//
// What is supported (anything else is a UserError naming the construct and the template line):
//   text and whitespace   {{ }}, {% %}, {# #}; `-` trimming on either side, `+` to turn off
//                         lstrip/trim for one tag; trim_blocks (a block or comment tag eats the
//                         newline after it) and lstrip_blocks (spaces and tabs before a block or
//                         comment tag alone on its line are dropped); one trailing newline of the
//                         template is dropped; \r\n and \r become \n (jinja2's defaults)
//   statements            if/elif/else, for (tuple targets, an inline `if` filter, else, break,
//                         continue, loop.index/index0/revindex/revindex0/first/last/length/
//                         previtem/nextitem), set (a name, names, or `ns.attr` of a namespace),
//                         block set ({% set x %}...{% endset %}), macro (parameters with
//                         defaults, called by position or name; no caller/varargs),
//                         generation/endgeneration (transformers' AssistantTracker tag; its
//                         body is rendered as is, and render() can report where it landed)
//   expressions           literals (strings with Python escapes, integers, floats, true/false/
//                         none in either case, lists, tuples, dicts), names, `.attr`, `[key]`,
//                         slices [a:b:c], calls with keyword arguments, `x if c else y`,
//                         and/or/not, == != < <= > >=, in / not in, + - * / // % **, ~, unary -
//   filters               abs capitalize count d default first float indent int items join last length
//                         list lower map reject rejectattr replace reverse safe select selectattr
//                         string title tojson trim unique upper (not dictsort, sort, format)
//   tests (`is`, `is not`) boolean callable defined divisibleby eq equalto even false float ge gt
//                         in integer iterable le lower lt mapping ne none number odd sameas
//                         sequence string true undefined upper
//   methods               str: startswith endswith strip lstrip rstrip split replace upper lower
//                         title capitalize find count join format is... ; dict: items keys values get
//   globals               raise_exception(msg) (a UserError with msg), namespace(...),
//                         strftime_now(fmt) (local time), range(...)
// Values follow Python: truthiness, `and`/`or` returning an operand, string slicing by code
// point, `{{ }}` of None/True/a list printing Python's repr. Undefined values act as jinja2's
// default Undefined: falsy, printed as "", iterated as empty, an error when used in arithmetic,
// called or looked into. tojson is transformers' (json.dumps with ensure_ascii=False: ", " and
// ": " separators, or "," and ": " with indent; keys in insertion order, no HTML escaping).
// String case mapping (upper, lower, title) covers ASCII only.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::jinja {

// Template data: JSON with the keys of objects in insertion order, as Python dicts keep them.
using Json = nlohmann::ordered_json;

struct Node;

// Byte ranges [first, second) of a rendered text.
using Spans = std::vector<std::pair<size_t, size_t>>;

class Template {
 public:
  // Parses `source`. `name` names the template in errors ("<name> line 3: ..."). A syntax error
  // or an unsupported construct is a UserError naming it and its line.
  Template(std::string_view source, std::string name);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the variables of `context` (a JSON object: messages, add_generation_prompt,
  // bos_token, ...). Errors during rendering (raise_exception, an undefined value used where a
  // value is needed, a type error) are UserErrors naming the template line.
  // With `generation_spans`, also the byte ranges of the output that {% generation %} blocks wrote,
  // in order (what transformers' return_assistant_tokens_mask marks); a generation block inside a
  // macro or a {% set %} block is then a UserError, as its text's place in the output is unknown.
  std::string render(const Json& context, Spans* generation_spans = nullptr) const;
  // The template has a {% generation %} block.
  bool has_generation() const { return has_generation_; }

  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::vector<std::unique_ptr<Node>> body_;
  bool loop_items_ = false;  // the template uses loop.previtem/nextitem
  bool has_generation_ = false;
};

// json.dumps(v, ensure_ascii=False, indent=indent) as Python writes it (indent < 0: no indent).
std::string python_json(const Json& v, int indent = -1);

}  // namespace loom::jinja
