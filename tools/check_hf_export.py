"""Checks a directory written by `loom export hf` with transformers (run in the venv of
tools/make_hf_fixtures.sh):

  .venv-hf/bin/python tools/check_hf_export.py OUTDIR [--expected EXPECTED] [--loom-text FILE --prompt P --tokens N]
                                                [--chat-like MODEL_DIR] [--loom-chat FILE --chat MESSAGE]

- loads OUTDIR with AutoModelForCausalLM.from_pretrained (float32) and its tokenizer.json;
- --expected: a fixture's expected.safetensors (tests/golden/hf/<model>): the logits of the
  exported model on its fixed ids against the expected logits (for an export of the unchanged
  fixture; max abs difference printed, must be <= 1e-4);
- --loom-text: what `loom sample RUN --prompt P --temperature 0 --tokens N` printed: transformers'
  greedy continuation (N tokens) of the same prompt must be the same text (keep the prompt and
  the N tokens within the model's positions: loom slides its window past them, transformers
  cannot).
- --chat-like: the model directory the run started from (or whose tokenizer it was prepared
  with): AutoTokenizer on OUTDIR must render and tokenize a few conversations with
  apply_chat_template (with and without the generation prompt) exactly as on MODEL_DIR, and
  OUTDIR's generation_config.json must equal MODEL_DIR's, but for the end-of-turn ids `loom
  export hf` adds to eos_token_id after MODEL_DIR's own.
- --loom-chat: what `loom sample RUN --chat MESSAGE --temperature 0` printed: transformers'
  apply_chat_template of the one-message conversation with the generation prompt, then greedy
  generate() with the export's own generation config (no eos given), must reply the same and stop
  at one of its eos_token_id (the end of the turn) within --tokens tokens.
Exits 1 when a check fails.
"""

import argparse
import sys

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

CONVERSATIONS = [
    [{"role": "user", "content": "Hello there!"}],
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "2 + 2?"},
     {"role": "assistant", "content": "Four."}, {"role": "user", "content": "And 3 + 3?"}],
]


def same_chat(outdir, model_dir):
    """Whether OUTDIR's tokenizer renders the conversations as MODEL_DIR's does."""
    ok = True
    ours, theirs = AutoTokenizer.from_pretrained(outdir), AutoTokenizer.from_pretrained(model_dir)
    for conv in CONVERSATIONS:
        for gen in (False, True):
            a = ours.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
            b = theirs.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
            # transformers 5 returns a BatchEncoding (whose list() is its keys): compare the ids.
            ids_a = ours.apply_chat_template(conv, add_generation_prompt=gen, return_dict=True)["input_ids"]
            ids_b = theirs.apply_chat_template(conv, add_generation_prompt=gen, return_dict=True)["input_ids"]
            same = a == b and list(ids_a) == list(ids_b)
            print(f"apply_chat_template ({len(conv)} messages, generation prompt {gen}): "
                  f"{'the same' if same else 'DIFFERENT'} ({len(a)} characters, {len(ids_a)} tokens)")
            ok &= same
    try:
        want = GenerationConfig.from_pretrained(model_dir).to_dict()
    except OSError:
        want = None
    if want is not None:
        got = GenerationConfig.from_pretrained(outdir).to_dict()
        ids = lambda e: [] if e is None else e if isinstance(e, list) else [e]  # noqa: E731
        own, eos = ids(want.get("eos_token_id")), ids(got.get("eos_token_id"))
        rest = lambda c: {k: v for k, v in c.items() if k not in ("transformers_version", "eos_token_id")}  # noqa: E731
        same = rest(got) == rest(want) and eos[:len(own)] == own
        print(f"generation_config.json: {'the same' if same else 'DIFFERENT'} (eos_token_id {own} -> {eos})")
        ok &= same
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--expected")
    ap.add_argument("--loom-text")
    ap.add_argument("--prompt", default="")
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--chat-like")
    ap.add_argument("--loom-chat")
    ap.add_argument("--chat", default="")
    a = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(a.outdir, dtype=torch.float32).eval()
    print(f"loaded {type(model).__name__} from {a.outdir}")
    ok = True
    if a.expected:
        e = load_file(a.expected)
        with torch.no_grad():
            logits = model(input_ids=e["inputs"].long()).logits
        diff = (logits - e["logits"]).abs().max().item()
        print(f"logits on the fixture's ids: max abs difference {diff:.3g} (range {e['logits'].abs().max().item():.3g})")
        ok &= diff <= 1e-4
    if a.loom_text:
        tok = Tokenizer.from_file(f"{a.outdir}/tokenizer.json")
        loom = open(a.loom_text, encoding="utf-8", errors="surrogateescape").read()
        ids = tok.encode(a.prompt, add_special_tokens=False).ids
        with torch.no_grad():
            for _ in range(a.tokens):
                ids.append(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax().item())
        new = ids[len(ids) - a.tokens:]
        text = a.prompt + tok.decode(new, skip_special_tokens=False)
        same = loom in (text, text + "\n")  # loom ends a sample with a newline unless it ends in one
        # How far they agree: the most leading tokens whose text begins loom's.
        agree = next(k for k in range(len(new), -1, -1)
                     if loom.startswith(a.prompt + tok.decode(new[:k], skip_special_tokens=False)))
        print(f"greedy continuation of {a.prompt!r}: {'the same as' if same else 'DIFFERENT from'} loom's "
              f"({agree} of {len(new)} tokens agree)")
        print("  transformers:", repr(text))
        print("  loom:        ", repr(loom))
        ok &= same
    if a.chat_like:
        ok &= same_chat(a.outdir, a.chat_like)
    if a.loom_chat:
        tok = AutoTokenizer.from_pretrained(a.outdir)
        ids = tok.apply_chat_template([{"role": "user", "content": a.chat}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)
        with torch.no_grad():
            # The end of turn as a user gets it: the export's generation_config.json's eos_token_id.
            out = model.generate(**ids, max_new_tokens=a.tokens, do_sample=False)
        new_ids = out[0, ids["input_ids"].shape[1]:].tolist()
        reply = tok.decode(new_ids, skip_special_tokens=True)
        loom = open(a.loom_chat, encoding="utf-8").read().rstrip("\n")
        same = reply.strip() == loom.strip()
        eos = model.generation_config.eos_token_id
        eos = [] if eos is None else eos if isinstance(eos, list) else [eos]
        stopped = bool(new_ids) and new_ids[-1] in eos
        print(f"chat reply to {a.chat!r}: {'the same as' if same else 'DIFFERENT from'} loom's")
        print("  transformers:", repr(reply))
        print("  loom:        ", repr(loom))
        print(f"generate() {'stopped at the end of turn' if stopped else 'did NOT stop'}: eos_token_id {eos}, "
              f"last token {new_ids[-1] if new_ids else None}, {len(new_ids)} of at most {a.tokens} tokens")
        ok &= same and stopped
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
