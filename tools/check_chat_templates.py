"""Compares loom's chat-template renderer with Python's jinja2, byte for byte.

For each template file in TEMPLATE_DIR, a scratch model directory gets a tokenizer_config.json
holding the template (and bos_token "<s>", eos_token "</s>"). Each conversation is rendered
with and without add_generation_prompt:
  - by jinja2 in the environment of transformers' apply_chat_template
    (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, a {% generation %}
    tag, json.dumps as tojson, raise_exception and strftime_now as globals; the variables
    messages, tools, documents, add_generation_prompt, bos_token, eos_token);
  - by `loom prepare chat MODEL_DIR CONVERSATIONS.jsonl --render-only`.
A conversation both sides refuse counts as a match; when the template raised it (raise_exception,
e.g. on roles that do not alternate) loom's error must carry the same message. Prints one line per template and the first difference of each mismatch;
exits 1 when any mismatch.

    python tools/check_chat_templates.py TEMPLATE_DIR --loom build/loom [--conversations F.jsonl]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

BOS, EOS = "<s>", "</s>"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "Name of the city"}},
                "required": ["city"],
            },
        },
    }
]

# Multi-turn, with and without a system prompt, text that trim and strip act on, non-ASCII
# text, quotes, a reasoning block (Qwen3 moves it), tools, and conversations some templates refuse.
CONVERSATIONS = [
    {"messages": [{"role": "user", "content": "Hello!"}]},
    {"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."}]},
    {
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7"},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello. How can I help?"},
            {"role": "user", "content": "Tell me a joke."},
            {"role": "assistant", "content": "Why did the chicken cross the road?"},
            {"role": "user", "content": "Why?"},
        ]
    },
    {
        "messages": [
            {"role": "system", "content": "  Answer in French.\n"},
            {"role": "user", "content": "  Say 'hello' and \"goodbye\".  \n"},
            {"role": "assistant", "content": "\nBonjour et au revoir — à bientôt !\n\n"},
            {"role": "user", "content": "Et en japonais ? 日本語で"},
            {"role": "assistant", "content": "こんにちは、さようなら。"},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "Think first: 3 * 7?"},
            {"role": "assistant", "content": "<think>\n3 * 7 = 21\n</think>\n\n21"},
            {"role": "user", "content": "And 3 * 8?"},
            {"role": "assistant", "content": "<think>\nAdd 3.\n</think>\n\n24"},
        ]
    },
    {
        "messages": [
            {"role": "system", "content": "Use the tools when they help."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "Let me check."},
        ],
        "tools": TOOLS,
    },
    {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "abc123def",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "abc123def", "content": '{"temp": 21}'},
            {"role": "assistant", "content": "It is 21 degrees."},
        ],
        "tools": TOOLS,
    },
    {"messages": [{"role": "user", "content": "One"}, {"role": "user", "content": "Two"}]},
    {"messages": [{"role": "system", "content": "Only a system prompt."}]},
]


class Generation(Extension):
    """transformers' {% generation %}...{% endgeneration %} tag, rendering its body as is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def transformers_env():
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_python(env, template_text, conv, add_generation_prompt):
    try:
        t = env.from_string(template_text)
        text = t.render(
            messages=conv["messages"],
            tools=conv.get("tools"),
            documents=None,
            add_generation_prompt=add_generation_prompt,
            bos_token=BOS,
            eos_token=EOS,
        )
        return {"text": text}
    except Exception as e:  # noqa: BLE001 - any refusal counts as one
        # A template's own raise_exception must give loom the same message; other errors (a type
        # error, a missing list element) need only be errors in loom too.
        return {"error": str(e) if type(e) is TemplateError else ""}


def render_loom(loom, model_dir, conv_file, add_generation_prompt):
    cmd = [loom, "prepare", "chat", str(model_dir), str(conv_file), "--render-only"]
    if add_generation_prompt:
        cmd.append("--add-generation-prompt")
    p = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8")
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.strip()]
    if p.returncode not in (0, 1) or not lines:
        return None, p.stdout + p.stderr
    return lines, ""


def first_difference(a, b):
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    return f"at character {i}: jinja2 {a[max(0, i - 30):i + 30]!r} vs loom {b[max(0, i - 30):i + 30]!r}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("template_dir", type=Path)
    ap.add_argument("--loom", default="build/loom")
    ap.add_argument("--conversations", type=Path, help="JSON Lines of {messages, tools?} (default: a built-in set)")
    args = ap.parse_args()

    if args.conversations:
        convs = [json.loads(x) for x in args.conversations.read_text(encoding="utf-8").splitlines() if x.strip()]
    else:
        convs = CONVERSATIONS
    env = transformers_env()
    templates = sorted(p for p in args.template_dir.iterdir() if p.is_file())
    if not templates:
        sys.exit(f"{args.template_dir}: no template files")
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        conv_file = Path(tmp) / "conversations.jsonl"
        conv_file.write_text("".join(json.dumps(c, ensure_ascii=False) + "\n" for c in convs), encoding="utf-8")
        for path in templates:
            text = path.read_text(encoding="utf-8")
            model_dir = Path(tmp) / path.stem
            model_dir.mkdir()
            config = {"chat_template": text, "bos_token": BOS, "eos_token": EOS}
            (model_dir / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
            same = refused = total = 0
            problems = []
            for agp in (False, True):
                loom_lines, err = render_loom(args.loom, model_dir, conv_file, agp)
                if loom_lines is None:
                    problems.append(f"loom failed: {err.strip()}")
                    total += len(convs)
                    continue
                for k, conv in enumerate(convs):
                    total += 1
                    py = render_python(env, text, conv, agp)
                    lm = loom_lines[k] if k < len(loom_lines) else {"error": "no line"}
                    if "error" in py and "error" in lm and py["error"] in lm["error"]:
                        same += 1
                        refused += 1
                    elif py.get("text") is not None and py.get("text") == lm.get("text"):
                        same += 1
                    elif "error" in py or "error" in lm:
                        problems.append(f"conversation {k} (add_generation_prompt={agp}): jinja2 "
                                        f"{py.get('error', 'rendered')!s} / loom {lm.get('error', 'rendered')!s}")
                    else:
                        problems.append(f"conversation {k} (add_generation_prompt={agp}): "
                                        + first_difference(py["text"], lm["text"]))
            status = "MATCH" if same == total else "DIFFER"
            failed += same != total
            print(f"{status:6} {path.name}: {same}/{total} renderings identical ({refused} refused by both)")
            for p in problems[:5]:
                print(f"         {p}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
