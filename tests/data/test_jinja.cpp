// loom's Jinja2 subset (src/data/jinja.h) on templates written for these tests: each exercises
// constructs the real chat templates use (REFERENCE-models.md section 10), with the expected
// text worked out from jinja2's documented semantics in transformers' environment (trim_blocks,
// lstrip_blocks). tools/check_chat_templates.sh compares the renderer with jinja2 itself on the
// real templates.
#include "data/jinja.h"

#include <gtest/gtest.h>

#include <string>

#include "support/files.h"

namespace loom {
namespace {

using jinja::Json;
using jinja::Spans;
using jinja::Template;
using testing::user_error;

std::string render(const std::string& src, const Json& ctx = Json::object()) { return Template(src, "t").render(ctx); }

TEST(Jinja, TextAndOutput) {
  EXPECT_EQ(render("Hello {{ name }}!", {{"name", "loom"}}), "Hello loom!");
  EXPECT_EQ(render("{{ 'a' }}{{ \"b\" }}{{ 1 }}{{ 2.5 }}"), "ab12.5");
  EXPECT_EQ(render("{{ '\\n' }}|{{ 'it\\'s' }}|{{ '\\u00e9' }}"), "\n|it's|\xC3\xA9");
  // One trailing newline of the template is dropped, as jinja2's keep_trailing_newline=False.
  EXPECT_EQ(render("x\n"), "x");
  EXPECT_EQ(render("x\n\n"), "x\n");
  EXPECT_EQ(render("a\r\nb"), "a\nb");
}

TEST(Jinja, TrimBlocksAndLstripBlocks) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the indentation before it.
  EXPECT_EQ(render("{% if true %}\n  yes\n{% endif %}\nend"), "  yes\nend");
  EXPECT_EQ(render("a\n    {% if true %}\nb\n    {% endif %}\nc"), "a\nb\nc");
  // Not after {{ }}: an output tag keeps the newline after it and the indentation before it.
  EXPECT_EQ(render("  {{ 'x' }}\ny"), "  x\ny");
  // Text before the tag on the same line is not only whitespace: nothing is stripped.
  EXPECT_EQ(render("a {% if true %}b{% endif %}"), "a b");
  // Comments trim like blocks.
  EXPECT_EQ(render("a\n  {# note #}\nb"), "a\nb");
}

TEST(Jinja, ManualWhitespaceControl) {
  EXPECT_EQ(render("a  \n {%- if true -%} \n b {%- endif %}"), "ab");
  EXPECT_EQ(render("x\n\n  {{- 'y' -}}  \n\nz"), "xyz");
  // `+` keeps the newline trim_blocks would take and the indentation lstrip_blocks would take.
  EXPECT_EQ(render("{% if true +%}\nx{% endif %}"), "\nx");
  EXPECT_EQ(render("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
  EXPECT_EQ(render("{#- c -#}  \n  x"), "x");
}

TEST(Jinja, IfElifElse) {
  const std::string t = "{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %}";
  EXPECT_EQ(render(t, {{"n", 1}}), "one");
  EXPECT_EQ(render(t, {{"n", 2}}), "two");
  EXPECT_EQ(render(t, {{"n", 7}}), "many");
}

TEST(Jinja, ForLoopVariables) {
  const Json ctx = {{"xs", {"a", "b", "c"}}};
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ x }}{{ loop.length }}"
                   "{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %},{% endfor %}",
                   ctx),
            "10a3F,21b3,32c3L,");
  EXPECT_EQ(render("{% for x in xs %}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.previtem }}|{% endfor %}", ctx),
            "32|21a|10b|");
  // An inline filter counts only the kept items, as jinja2's loop over a filtered iterable.
  EXPECT_EQ(
      render("{% for x in xs if x != 'a' %}{{ loop.index }}{{ x }}{% if loop.last %}!{% endif %}{% endfor %}", ctx),
      "1b2c!");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in missing %}x{% endfor %}."), ".");  // undefined iterates as empty
  EXPECT_EQ(render("{% for x in xs %}{% if x == 'b' %}{% continue %}{% endif %}{% if x == 'c' %}{% break %}"
                   "{% endif %}{{ x }}{% endfor %}",
                   ctx),
            "a");
  EXPECT_EQ(render("{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"z", 1}, {"a", 2}}}}),
            "z=1;a=2;");  // insertion order, as a Python dict
  EXPECT_EQ(render("{% for k, v in d.items() if k != 'z' %}{{ k }}{{ v }}{% endfor %}", {{"d", {{"z", 1}, {"a", 2}}}}),
            "a2");
  EXPECT_EQ(render("{% for c in 'h\xC3\xA9' %}[{{ c }}]{% endfor %}"), "[h][\xC3\xA9]");
  // Nested loops: `loop` is the innermost one's.
  EXPECT_EQ(
      render("{% for a in [1, 2] %}{% for b in [1, 2, 3] %}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}"),
      "12311232");
}

TEST(Jinja, SetScopesAndNamespaces) {
  // A set inside a loop is the loop's own; a namespace carries values out, as in Qwen3's template.
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [5, 6] %}{% set x = i %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace(last=-1, found=false) %}{% for m in ms %}{% if m == 'u' %}"
                   "{% set ns.last = loop.index0 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.last }}"
                   "{{ ns.found }}",
                   {{"ms", {"u", "a", "u", "a"}}}),
            "2True");
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.i = 0 %}{% for x in [1,2,3] %}{% set ns.i = ns.i + x %}"
                   "{% endfor %}{{ ns.i }}"),
            "6");
  // A top-level set inside an if is seen after it (if makes no scope).
  EXPECT_EQ(render("{% if true %}{% set y = 'in' %}{% endif %}{{ y }}"), "in");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(render("{% set s %}block {{ 1 + 1 }}{% endset %}[{{ s }}]"), "[block 2]");
  // Rebinding a context variable, as Llama's `set messages = messages[1:]`.
  EXPECT_EQ(render("{% set xs = xs[1:] %}{{ xs | length }}", {{"xs", {1, 2, 3}}}), "2");
}

TEST(Jinja, OperatorsAndPrecedence) {
  EXPECT_EQ(render("{{ xs | length - 1 }}", {{"xs", {1, 2, 3}}}), "2");  // the filter binds tighter than -
  EXPECT_EQ(render("{{ 'a' + 'b' ~ 1 }}"), "ab1");
  EXPECT_EQ(render("{{ 7 % 3 }} {{ -7 % 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 6 / 3 }}"),
            "1 2 3 -4 3.5 1024 2.0");
  EXPECT_EQ(render("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ -2 + 5 }}"), "7 9 3");
  EXPECT_EQ(render("{{ 1 < 2 }} {{ 'b' > 'a' }} {{ 2 >= 3 }} {{ 1 == 1.0 }} {{ 'x' != 'x' }}"),
            "True True False True False");
  EXPECT_EQ(render("{{ 'ell' in 'hello' }} {{ 2 in [1, 2] }} {{ 'k' in d }} {{ 'q' not in d }}", {{"d", {{"k", 0}}}}),
            "True True True True");
  // and/or give an operand, as in Python.
  EXPECT_EQ(render("{{ 'x' in missing }}"), "False");  // Undefined iterates as empty
  EXPECT_EQ(render("{{ '' or 'fallback' }} {{ 'x' and 'y' }} {{ 0 and 1 }} {{ not '' }}"), "fallback y 0 True");
  EXPECT_EQ(render("{{ 'yes' if n > 1 else 'no' }}{{ 'only' if false }}.", {{"n", 2}}), "yes.");
  EXPECT_EQ(render("{{ not(a and b) }}", {{"a", true}, {"b", false}}), "True");
  // Gemma's alternation check: (role == 'user') != (index % 2 == 0).
  EXPECT_EQ(render("{{ ('user' == 'user') != (3 % 2 == 0) }}"), "True");
  EXPECT_EQ(render("{{ [1, 2] + [3] }} {{ 'ab' * 2 }}"), "[1, 2, 3] abab");
}

TEST(Jinja, IndexingAndSlicing) {
  const Json ctx = {{"xs", {1, 2, 3, 4}}, {"s", "h\xC3\xA9llo"}, {"m", {{"role", "user"}}}};
  EXPECT_EQ(render("{{ xs[0] }}{{ xs[-1] }}{{ xs[1:] }}{{ xs[:-1] }}{{ xs[::-1] }}{{ xs[::2] }}{{ xs[1:3] }}", ctx),
            "14[2, 3, 4][1, 2, 3][4, 3, 2, 1][1, 3][2, 3]");
  // Strings slice by code point.
  EXPECT_EQ(render("{{ s[1] }}|{{ s[::-1] }}|{{ s[:-1] }}|{{ s[-3:] }}", ctx), "\xC3\xA9|oll\xC3\xA9h|h\xC3\xA9ll|llo");
  EXPECT_EQ(render("{{ m.role }}{{ m['role'] }}{{ xs.0 }}", ctx), "useruser1");
  // Missing keys and indices are undefined, which prints as nothing and tests as not defined.
  EXPECT_EQ(render("[{{ m.content }}][{{ xs[9] }}]{{ m.content is defined }}", ctx), "[][]False");
}

TEST(Jinja, StringMethods) {
  const Json ctx = {{"c", "<think>\nplan\n</think>\n\nanswer"}};
  EXPECT_EQ(render("{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n')"
                   ".split('<think>')[-1].lstrip('\\n') }}",
                   ctx),
            "answer|plan");
  EXPECT_EQ(render("{{ c.startswith('<think>') }}{{ c.endswith('wer') }}{{ c.startswith(('x', '<t')) }}", ctx),
            "TrueTrueTrue");
  EXPECT_EQ(render("[{{ '  a b \\n'.strip() }}][{{ '\\n\\nx\\n'.strip('\\n') }}][{{ 'xxaxx'.lstrip('x') }}]"),
            "[a b][x][axx]");
  EXPECT_EQ(render("{{ ' a  b '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }}"),
            "['a', 'b'] ['a', 'b', '', 'c'] ['a', 'b,c']");
  EXPECT_EQ(render("{{ 'aXbX'.replace('X', '-') }} {{ 'Mixed'.upper() }} {{ 'Mixed'.lower() }}"
                   " {{ \"they're here\".title() }} {{ 'hELLO'.capitalize() }}"),
            "a-b- MIXED mixed They'Re Here Hello");
  EXPECT_EQ(render("{{ d.get('a') }} {{ d.get('zz', 'none') }} {{ d.keys() | list }} {{ d.values() | list }}",
                   {{"d", {{"a", 1}, {"b", 2}}}}),
            "1 none ['a', 'b'] [1, 2]");
}

TEST(Jinja, Filters) {
  EXPECT_EQ(render("[{{ '  x y \\n' | trim }}]"), "[x y]");
  EXPECT_EQ(render("{{ 'abc' | length }} {{ [1, 2] | length }} {{ {'a': 1} | count }} {{ missing | length }}"),
            "3 2 1 0");
  EXPECT_EQ(render("{{ missing | default('d') }} {{ '' | default('e') }} {{ '' | default('f', true) }}"), "d  f");
  EXPECT_EQ(render("{{ 'aB' | upper }}{{ 'aB' | lower }} {{ 'hello wide-world' | title }}"), "ABab Hello Wide-World");
  EXPECT_EQ(render("{{ ['a', 'b'] | join(', ') }} {{ [1, 2] | join }} {{ 'ab' | list }}"), "a, b 12 ['a', 'b']");
  EXPECT_EQ(render("{{ [3, 1] | first }}{{ [3, 1] | last }}{{ [1, 2] | reverse | list }}{{ 'ab' | reverse }}"),
            "31[2, 1]ba");
  EXPECT_EQ(render("{{ 5 | string ~ 'x' }} {{ none | string }} {{ -3 | abs }} {{ '4' | int + 1 }}"), "5x None 3 5");
  EXPECT_EQ(render("[{{ 'a\\nb\\n\\nc' | indent(2) }}][{{ 'a\\nb' | indent('> ', first=true) }}]"),
            "[a\n  b\n\n  c][> a\n> b]");
  EXPECT_EQ(render("{{ 'a\\n\\nb' | indent(2, blank=true) }}"), "a\n  \n  b");
  EXPECT_EQ(render("{{ 'a-b' | replace('-', '+') }} {{ [1, 1, 2] | unique | list }}"), "a+b [1, 2]");
  const Json ms = {{"ms", {{{"role", "system"}}, {{"role", "user"}, {"n", 1}}, {{"role", "user"}, {"n", 2}}}}};
  EXPECT_EQ(render("{{ (ms | selectattr('role', 'equalto', 'user') | list)[-1].n }} "
                   "{{ ms | rejectattr('role', 'equalto', 'user') | list | length }} "
                   "{{ ms | selectattr('n') | map(attribute='n') | join('+') }}",
                   ms),
            "2 1 1+2");
  // Selecting from none (a template's `tools` when there are none) gives nothing, as jinja2's.
  EXPECT_EQ(render("{{ n | selectattr('type', 'equalto', 'x') | list | length }}{{ n | map(attribute='a') | list }}",
                   {{"n", nullptr}}),
            "0[]");
  EXPECT_EQ(render("{{ ['a', 'code', 'b'] | reject('equalto', 'code') | join(', ') }} "
                   "{{ [1, 2, 3, 4] | select('odd') | list }}"),
            "a, b [1, 3]");
}

TEST(Jinja, ToJsonIsTransformers) {
  // json.dumps(ensure_ascii=False): ", " and ": " separators, insertion order, no HTML escaping.
  const Json tool = Json::parse(R"({"name": "f", "b": [1, 2.5, true, null], "s": "<a&b> \"q\" é\n"})");
  EXPECT_EQ(render("{{ t | tojson }}", {{"t", tool}}),
            "{\"name\": \"f\", \"b\": [1, 2.5, true, null], \"s\": \"<a&b> \\\"q\\\" \xC3\xA9\\n\"}");
  EXPECT_EQ(render("{{ t | tojson(indent=2) }}", {{"t", Json::parse(R"({"a": [1, {}], "e": []})")}}),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"e\": []\n}");
  EXPECT_EQ(jinja::python_json(Json::parse("[1.0, 1e20, 0.1]")), "[1.0, 1e+20, 0.1]");
  // Mistral's `out[:-1]` on a tojson string.
  EXPECT_EQ(render("{% set out = f | tojson %}{{ out[:-1] }}, \"id\": 1}", {{"f", {{"name", "g"}}}}),
            "{\"name\": \"g\", \"id\": 1}");
}

TEST(Jinja, Macros) {
  // Arguments by position, by name and by default; the body does not see the caller's loop
  // variables, but does see the render's variables and the template's top-level ones.
  const std::string t =
      "{% set top = 'T' %}{% macro show(x, sep=': ', tail='') %}{{ who }}{{ sep }}{{ x }}{{ tail }}{{ top }}"
      "{{ item is defined }}{% endmacro %}{% for item in [1] %}{{ show('a') }}|{{ show('b', tail='!') }}|"
      "{{ show('c', '=') }}{% endfor %}";
  EXPECT_EQ(render(t, {{"who", "W"}}), "W: aTFalse|W: b!TFalse|W=cTFalse");
  EXPECT_EQ(render("{% macro twice(s) %}{{ s }}{{ s }}{% endmacro %}{{ twice(twice('x') ~ '-') | length }}"), "6");
  EXPECT_NE(user_error([] { render("{% macro m(a) %}{% endmacro %}{{ m(b=1) }}"); }).find("no parameter 'b'"),
            std::string::npos);
}

TEST(Jinja, Tests) {
  const Json ctx = {{"s", "x"}, {"n", nullptr}, {"d", {{"a", 1}}}, {"l", {1}}, {"f", false}, {"i", 3}};
  EXPECT_EQ(render("{{ s is defined }}{{ zz is defined }}{{ zz is undefined }}{{ not zz is defined }}", ctx),
            "TrueFalseTrueTrue");
  EXPECT_EQ(render("{{ n is none }}{{ n is not none }}{{ s is string }}{{ d is string }}", ctx), "TrueFalseTrueFalse");
  EXPECT_EQ(
      render("{{ d is mapping }}{{ l is mapping }}{{ l is iterable }}{{ s is iterable }}{{ i is iterable }}", ctx),
      "TrueFalseTrueTrueFalse");
  EXPECT_EQ(
      render("{{ f is false }}{{ f is true }}{{ 0 is false }}{{ i is odd }}{{ i is even }}{{ i is number }}", ctx),
      "TrueFalseFalseTrueFalseTrue");
  EXPECT_EQ(render("{{ i is equalto 3 }}{{ i is divisibleby(3) }}{{ s is in ['x'] }}", ctx), "TrueTrueTrue");
}

TEST(Jinja, PythonReprOfValues) {
  EXPECT_EQ(render("{{ n }} {{ t }} {{ f }} {{ l }} {{ d }}",
                   {{"n", nullptr}, {"t", true}, {"f", false}, {"l", {"a", 1, nullptr}}, {"d", {{"k", "it's"}}}}),
            "None True False ['a', 1, None] {'k': \"it's\"}");
  EXPECT_EQ(render("{{ missing }}|{{ missing ~ 'x' }}"), "|x");
}

TEST(Jinja, GlobalsAndSpecialVariables) {
  EXPECT_EQ(render("{{ bos_token }}{% if add_generation_prompt %}gen{% endif %}",
                   {{"bos_token", "<s>"}, {"add_generation_prompt", true}}),
            "<s>gen");
  EXPECT_EQ(render("{% for i in range(3) %}{{ i }}{% endfor %}{{ range(1, 7, 2) | list }}"), "012[1, 3, 5]");
  EXPECT_EQ(render("{{ strftime_now is defined }}{{ strftime_now('%Y') | length }}"), "True4");
  // {% generation %} (transformers' AssistantTracker) renders its body.
  EXPECT_EQ(render("a{% generation %}b{% endgeneration %}c"), "abc");
}

TEST(Jinja, GenerationBlocksReportWhereTheirTextLands) {
  const Template t("{% for m in messages %}<{{ m }}>{% if m == 'a' %}{% generation %}{{ m * 3 }}!"
                   "{% endgeneration %}{% endif %}{% endfor %}{% generation %}{% endgeneration %}",
                   "t");
  EXPECT_TRUE(t.has_generation());
  EXPECT_FALSE(Template("{% if x %}{% for y in z %}{{ y }}{% endfor %}{% endif %}", "t").has_generation());
  Spans spans = {{7, 7}};  // replaced, not appended to
  const std::string out = t.render({{"messages", {"a", "b", "a"}}}, &spans);
  EXPECT_EQ(out, "<a>aaa!<b><a>aaa!");
  EXPECT_EQ(spans, (Spans{{3, 7}, {13, 17}, {17, 17}}));
  EXPECT_EQ(t.render({{"messages", {"a"}}}), "<a>aaa!");  // without spans, as before
  // In a macro or a set block the text's place in the output is unknown.
  const Template in_macro("{% macro f() %}{% generation %}x{% endgeneration %}{% endmacro %}{{ f() }}", "m");
  EXPECT_TRUE(in_macro.has_generation());
  EXPECT_EQ(in_macro.render(Json::object()), "x");
  EXPECT_NE(user_error([&] { in_macro.render(Json::object(), &spans); }).find("inside a macro"), std::string::npos);
}

TEST(Jinja, RaiseExceptionNamesTheMessageAndLine) {
  const std::string msg = user_error([] {
    render("line one\n{% if true %}\n  {{ raise_exception('Conversation roles must alternate') }}\n{% endif %}");
  });
  EXPECT_NE(msg.find("t line 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Conversation roles must alternate"), std::string::npos) << msg;
}

TEST(Jinja, UnsupportedConstructsAreNamed) {
  std::string msg = user_error([] { Template("ok\n{% filter upper %}x{% endfilter %}", "tmpl"); });
  EXPECT_NE(msg.find("tmpl line 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'{% filter %}' is not supported"), std::string::npos) << msg;
  msg = user_error([] { render("{{ x | wordwrap }}", {{"x", "a"}}); });
  EXPECT_NE(msg.find("the filter 'wordwrap' is not supported"), std::string::npos) << msg;
  msg = user_error([] { render("\n\n{{ x is sameish }}"); });
  EXPECT_NE(msg.find("t line 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'is sameish'"), std::string::npos) << msg;
  msg = user_error([] { render("{{ 'a'.zfill(3) }}"); });
  EXPECT_NE(msg.find("no method 'zfill'"), std::string::npos) << msg;
  msg = user_error([] { render("{{ '%s' % 1 }}"); });
  EXPECT_NE(msg.find("'%' string formatting"), std::string::npos) << msg;
}

TEST(Jinja, SyntaxErrorsNameTheLine) {
  EXPECT_NE(user_error([] { Template("a\n{% if x %}b", "t"); }).find("t line 2: the template ends before"),
            std::string::npos);
  EXPECT_NE(user_error([] { Template("a\nb {{ x ", "t"); }).find("t line 2"), std::string::npos);
  EXPECT_NE(user_error([] { Template("{{ 'abc }}", "t"); }).find("never closed"), std::string::npos);
  EXPECT_NE(user_error([] { Template("{% for x xs %}{% endfor %}", "t"); }).find("expected 'in'"), std::string::npos);
  EXPECT_NE(user_error([] { Template("{% endif %}", "t"); }).find("'{% endif %}' is not supported"), std::string::npos);
}

TEST(Jinja, UndefinedUsedAsAValueIsAnError) {
  // jinja2's default Undefined: looking into it, or adding it to a string, raises.
  EXPECT_NE(user_error([] {
              render("{{ m.content.strip() }}", {{"m", Json::object()}});
            }).find("no attribute 'content'"),
            std::string::npos);
  EXPECT_NE(user_error([] { render("{{ 'a' + nope }}"); }).find("'nope' is undefined"), std::string::npos);
  EXPECT_NE(user_error([] { render("{{ nope.x }}"); }).find("'nope' is undefined"), std::string::npos);
}

// A ChatML template in the style of Qwen3's: a namespace found by walking the messages in
// reverse, string methods on the content, `messages[0].role`, loop.first/last and the generation
// prompt.
const char* kChatMl = R"({%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_query=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if message.role == "user" and ns.last_query == messages|length - 1 %}
        {%- set ns.last_query = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- if '</think>' in content %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\n' + content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)";

TEST(Jinja, ChatMlTemplate) {
  const Json messages = Json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "<think>\nsay hello\n</think>\n\nHello!"},
    {"role": "user", "content": "Bye"}])");
  const Template t(kChatMl, "chatml");
  EXPECT_EQ(t.render({{"messages", messages}, {"add_generation_prompt", true}}),
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n");
}

// In the style of Llama 3's: bos_token, the system message cut out with messages[1:], `| trim`
// binding tighter than `+`, and `'tool_calls' in message`.
const char* kLlama = R"({{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}

{%- for message in messages %}
    {%- if not (message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)";

TEST(Jinja, LlamaStyleTemplate) {
  const Json messages = Json::parse(R"([
    {"role": "system", "content": " Answer in one word.\n"},
    {"role": "user", "content": "  Capital of France?  "},
    {"role": "assistant", "content": "Paris"}])");
  EXPECT_EQ(Template(kLlama, "llama").render({{"messages", messages}, {"bos_token", "<|begin_of_text|>"}}),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nAnswer in one word.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nCapital of France?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nParis<|eot_id|>");
}

// In the style of Gemma 3's: role alternation checked with raise_exception, an inline if, `is
// string`, and content lists.
const char* kGemma = R"({{ bos_token }}
{%- for message in messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- set role = "model" if message['role'] == 'assistant' else message['role'] -%}
    {{ '<start_of_turn>' + role + '\n' + ("first: " if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- else -%}
        {%- for item in message['content'] -%}
            {{ item['text'] | trim if item['type'] == 'text' else '<image>' }}
        {%- endfor -%}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
)";

TEST(Jinja, GemmaStyleTemplate) {
  const Template t(kGemma, "gemma");
  const Json ok = Json::parse(R"([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " Hi "}]},
                                  {"role": "assistant", "content": "Hello "}])");
  EXPECT_EQ(t.render({{"messages", ok}, {"bos_token", "<bos>"}}),
            "<bos><start_of_turn>user\nfirst: <image>Hi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n");
  const Json bad = Json::parse(R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])");
  const std::string msg = user_error([&] { t.render({{"messages", bad}}); });
  EXPECT_NE(msg.find("gemma line 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("must alternate"), std::string::npos) << msg;
}

}  // namespace
}  // namespace loom
