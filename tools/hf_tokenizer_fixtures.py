"""SentencePiece-style tokenizer fixtures and decode expectations for loom's tokenizer.json reader,
made with the `tokenizers` library alone (make_hf_fixtures.py calls make_all; this file also runs on
its own: tools/make_hf_fixtures.sh --tokenizers-only).

  tokenizers/<variant>.json     BPE models with byte fallback in each family's pipeline shape, their
                                merges trained here on the corpus with a Metaspace pre-tokenizer and
                                a small alphabet (so rare characters need byte fallback), the
                                vocabulary reordered as the family's (specials, then <0x00>..<0xFF>),
                                its alphabet Latin and four CJK characters (in_alphabet):
    llama2          Llama 2 / TinyLlama (legacy): normalizer Prepend("▁") + Replace(" ", "▁"), no
                    pre-tokenizer, decoder Replace + ByteFallback + Fuse + Strip(" ", 1, 0); unk
                    <unk> with fuse_unk; </s> matched normalized (as "▁</s>"); BOS template
    mistral         Mistral (legacy = false): Metaspace(prepend_scheme "first", split false), the
                    same decoder; [INST] [/INST] <|im_start|> <|im_end|> specials, <mask> lstrip,
                    <|end|> rstrip
    gemma           Gemma: normalizer Replace(" ", "▁"), Split(" ", MergedWithPrevious), decoder
                    Replace + ByteFallback + Fuse; pad/eos/bos/unk = 0/1/2/3,
                    <start_of_turn> <end_of_turn>
    llama2_gaps     older Llama-style files: Metaspace pre-tokenizer and decoder (prepend_scheme
                    "always", split), and no <0xF0>..<0xFF>: a 4-byte character falls back to
                    <unk>, consecutive ones fused
  tokenizers/expected_spm.json  {"texts": [...], "ids": {variant: [[ids of text k]]},
                                "decoded": {variant: [decode(ids of text k)]},
                                "prefixes": {variant: [{"ids": ids, "decoded": [decode(ids[:n]) for
                                n = 0..len]}]}}, ids of texts and ODD_TOKENS, for the variants above and the byte-level ones
                                (gpt2, smollm, llama3, qwen2), all with add_special_tokens=False and
                                skip_special_tokens=False

Deterministic: running it twice gives the same files.
"""

import argparse
import json
import os

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

SP = "\u2581"  # ▁

# Trained on with tiny Shakespeare by every tokenizer fixture.
MULTILINGUAL = (
    "Café crème, naïve façade — déjà vu! Straße, Übermaß, ÆØÅ æøå. 日本語のテキストと中文文本。"
    "Русский текст, ελληνικά, العربية ١٢٣, हिन्दी. Numbers 12345 and 3.14159; x² ½ ⅓. "
    "Emoji 😀🎉 and tabs\tand\r\nCRLF lines.\n"
)

# Encoded by every variant: ASCII, accented Latin, CJK, emoji (with ZWJ and skin tone), control
# characters, characters only byte fallback can encode, the metaspace itself, non-NFC text, and the
# special tokens of the families.
TEXTS = [
    "Hello world! It's 2024.\n\n  ok",
    "Café crème, naïve façade — déjà vu! Straße, Übermaß.",
    "日本語のテキストと中文文本。",
    "Emoji 😀🎉 and 👍🏽, family 👨‍👩‍👧!",
    "tab\there\x00nul\x07bell\x1b[0m\r\nCRLF\x7f del",
    "Ωμέγα ꙮ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ᚠᛇᚻ ﷽",
    SP + "already" + SP + "has " + SP + SP + "metaspace",
    "cafe\u0301 (not NFC)",
    "<s>Hello</s> again </s>x",
    "[INST] What is 2+2? [/INST] 4</s>",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<|im_start|>system\nYou are kind.<|im_end|>\n<|im_start|>user\n",
    "a <mask> b   <mask>c",
    "x<|end|>  \n y<|end|>",
    "",
    " ",
    "  leading and trailing spaces  ",
    "multiple   spaces\n\nand newlines\n",
]

# decode(ids[:n]) for every n of the ids of these texts: cuts inside characters and byte-fallback
# runs.
PREFIX_TEXTS = [3, 5]
# Tokens no text encodes to but a model may generate: a complete character's bytes and then a
# byte that makes the run (ByteFallback) or the sequence invalid, then more text.
ODD_BYTES = [0xE2, 0x82, 0xAC, 0xC0, None, 0xE2, 0x82, 0xAC, 0xE2, None, 0xCE, 0xA9, 0x80]  # None: a word


def gpt2_symbol(b):
    """GPT-2's bytes_to_unicode."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    if b in printable:
        return chr(b)
    return chr(256 + [x for x in range(256) if x not in printable].index(b))


def odd_tokens(byte_level):
    words = iter(["a", "b"] if byte_level else [SP + "a", SP + "b"])
    return [next(words) if b is None else gpt2_symbol(b) if byte_level else "<0x%02X>" % b for b in ODD_BYTES]


def bytes_tokens():
    return ["<0x%02X>" % b for b in range(256)]


def in_alphabet(c):
    """The characters the trained vocabularies have: Latin and four CJK ones. The rest of the
    corpus (Greek, Cyrillic, Arabic, most CJK, emoji, ...) only byte fallback encodes."""
    return ord(c) < 0x250 or c in "日本語文"


def trained_pieces(corpus, specials):
    """Merges and pieces of a BPE trained over Metaspace words of the corpus's alphabet."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=list(specials), show_progress=False)
    # Characters outside the alphabet become spaces (limit_alphabet would pick among equally
    # frequent characters in no fixed order).
    tok.train_from_iterator(["".join(c if in_alphabet(c) else " " for c in t) for t in corpus], trainer=trainer)
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    pieces = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if t not in specials]
    return pieces, j["model"]["merges"]


def assemble(corpus, specials, unk, added, normalizer, pre_tokenizer, decoder, bos, drop_bytes=()):
    """A tokenizer.json: `specials` at ids 0.., the byte tokens, the trained pieces; `added`
    (content -> flags) are more added tokens with ids after those."""
    pieces, merges = trained_pieces(corpus, specials)
    order = list(specials) + [b for b in bytes_tokens() if b not in drop_bytes]
    order += [p for p in pieces if p not in order]
    vocab = {t: i for i, t in enumerate(order)}
    added_tokens = []
    for t in specials:
        added_tokens.append({"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True})
    for k, (t, flags) in enumerate(added.items()):
        entry = {"id": len(vocab) + k, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": True}
        entry.update(flags)
        added_tokens.append(entry)
    j = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [vocab[bos]], "tokens": [bos]}},
        },
        "decoder": decoder,
        "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    return Tokenizer.from_str(json.dumps(j))


def llama_decoder(strip):
    steps = [{"type": "Replace", "pattern": {"String": SP}, "content": " "}, {"type": "ByteFallback"},
             {"type": "Fuse"}]
    if strip:
        steps.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {"type": "Sequence", "decoders": steps}


def sentencepiece_variants(corpus):
    llama_norm = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SP},
                                                      {"type": "Replace", "pattern": {"String": " "}, "content": SP}]}
    v = {}
    v["llama2"] = assemble(corpus, ["<unk>", "<s>", "</s>"], "<unk>", {}, llama_norm, None, llama_decoder(True), "<s>")
    # Old Llama 2 files match </s> in the normalized text: as "▁</s>", so only after a space.
    j = json.loads(v["llama2"].to_str())
    for t in j["added_tokens"]:
        if t["content"] == "</s>":
            t["normalized"] = True
    v["llama2"] = Tokenizer.from_str(json.dumps(j))
    v["mistral"] = assemble(
        corpus, ["<unk>", "<s>", "</s>"], "<unk>",
        {"[INST]": {}, "[/INST]": {}, "<|im_start|>": {}, "<|im_end|>": {}, "<mask>": {"lstrip": True},
         "<|end|>": {"rstrip": True, "special": False}},
        None, {"type": "Metaspace", "replacement": SP, "prepend_scheme": "first", "split": False},
        llama_decoder(True), "<s>")
    v["gemma"] = assemble(
        corpus, ["<pad>", "<eos>", "<bos>", "<unk>"], "<unk>", {"<start_of_turn>": {}, "<end_of_turn>": {}},
        {"type": "Replace", "pattern": {"String": " "}, "content": SP},
        {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False},
        llama_decoder(False), "<bos>")
    metaspace = {"type": "Metaspace", "replacement": SP, "prepend_scheme": "always", "split": True}
    v["llama2_gaps"] = assemble(
        corpus, ["<unk>", "<s>", "</s>"], "<unk>", {}, None, metaspace, metaspace, "<s>",
        drop_bytes=["<0x%02X>" % b for b in range(0xF0, 0x100)])
    return v


def make_all(out, corpus):
    variants = sentencepiece_variants(corpus)
    for name, tok in variants.items():
        tok.save(os.path.join(out, name + ".json"))
    for name in ["gpt2", "smollm", "llama3", "qwen2"]:
        variants[name] = Tokenizer.from_file(os.path.join(out, name + ".json"))
    expected = {"texts": TEXTS, "ids": {}, "decoded": {}, "prefixes": {}}
    for name, tok in variants.items():
        if name == "qwen2":  # its NFC normalizer would change the non-NFC text, which loom refuses
            texts = [t for t in TEXTS if "\u0301" not in t]
        else:
            texts = TEXTS
        ids = [tok.encode(t, add_special_tokens=False).ids if t in texts else None for t in TEXTS]
        expected["ids"][name] = ids
        expected["decoded"][name] = [None if i is None else tok.decode(i, skip_special_tokens=False) for i in ids]
        odd = [tok.token_to_id(t) for t in odd_tokens(name in ("gpt2", "smollm", "llama3", "qwen2"))]
        assert None not in odd, name
        streams = [ids[k] for k in PREFIX_TEXTS] + [odd]
        expected["prefixes"][name] = [
            {"ids": s, "decoded": [tok.decode(s[:n], skip_special_tokens=False) for n in range(len(s) + 1)]}
            for s in streams]
    # The fixtures exercise what they are for: byte fallback and unk both occur.
    llama = variants["llama2"]
    all_ids = sum((i for i in expected["ids"]["llama2"] if i), [])
    assert any(llama.id_to_token(i).startswith("<0x") for i in all_ids)
    gaps = sum((i for i in expected["ids"]["llama2_gaps"] if i), [])
    assert variants["llama2_gaps"].token_to_id("<unk>") in gaps
    with open(os.path.join(out, "expected_spm.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=0)
        f.write("\n")


def corpus_of(shakespeare_path):
    with open(shakespeare_path, encoding="utf-8") as f:
        shakespeare = f.read()
    return [shakespeare[i:i + 1000] for i in range(0, 200000, 1000)] + [MULTILINGUAL] * 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shakespeare", required=True)
    a = ap.parse_args()
    make_all(os.path.join(a.out, "tokenizers"), corpus_of(a.shakespeare))


if __name__ == "__main__":
    main()
