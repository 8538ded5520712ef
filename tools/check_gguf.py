"""Checks a file written by `loom export gguf` with llama.cpp's own code (run by tools/check_gguf.sh
in its venv: the `gguf` package and llama-cpp-python):

  python tools/check_gguf.py FILE.gguf [--keys] [--hf HF_EXPORT] [--loom-text FILE --prompt P --tokens N [--first K]]

- reads FILE with gguf's GGUFReader (the layout, every key); --keys prints them;
- --hf: the `loom export hf` directory of the same checkpoint: every tensor of FILE must be the
  HF tensor llama.cpp's converter would write: named by gguf's TensorNameMap, q_proj/k_proj rows
  permuted for arch llama as convert_hf_to_gguf's LlamaModel.permute does, GPT-2's Conv1D weights
  transposed, float32 for vectors and norms, and otherwise quantized by gguf.quants.quantize to the
  file's type: byte for byte;
- --loom-text: what `loom sample RUN --prompt P --temperature 0 --tokens N` printed; llama.cpp's
  greedy continuation of the same prompt (no BOS added, as loom adds none to a prompt) must be the
  same text, or with --first K, the same first K tokens (q8_0 rounds the weights).
Exits 1 when a check fails.
"""

import argparse
import json
import math
import sys

import numpy as np
import gguf
from gguf.quants import quantize
from safetensors.numpy import load_file


def field(r, key):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def expected_tensors(hf_dir, arch, n_blocks, heads, kv_heads):
    """{gguf name: float32 array} as llama.cpp's converter makes them from the HF export."""
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), n_blocks)
    out = {}
    for name, x in load_file(f"{hf_dir}/model.safetensors").items():
        x = x.astype(np.float32)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            n = heads if "q_proj" in name else kv_heads
            x = x.reshape(n, 2, x.shape[0] // n // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)
        if arch == "gpt2" and name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
            x = x.T.copy()
        gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gname is None:
            raise SystemExit(f"gguf's TensorNameMap has no name for {name}")
        out[gname] = x
    return out


def rope_freqs(hf_dir):
    """Llama 3.1's per-frequency divisors as convert_hf_to_gguf's LlamaModel.generate_extra_tensors
    makes them (in float32 with numpy here; torch's pow may differ in the last bit), or None."""
    cfg = json.load(open(f"{hf_dir}/config.json"))
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type")) != "llama3":
        return None
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    base = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    freqs = np.float32(1.0) / (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    out = []
    for f in freqs:
        wavelen = np.float32(2 * math.pi) / f
        if wavelen < np.float32(old / high):
            out.append(1.0)
        elif wavelen > np.float32(old / low):
            out.append(factor)
        else:
            smooth = (np.float32(old) / wavelen - np.float32(low)) / np.float32(high - low)
            out.append(np.float32(1) / ((np.float32(1) - smooth) / np.float32(factor) + smooth))
    return np.array(out, dtype=np.float32)


def check_tensors(r, hf_dir):
    arch = field(r, "general.architecture")
    heads = field(r, f"{arch}.attention.head_count")
    kv = field(r, f"{arch}.attention.head_count_kv") or heads
    want = expected_tensors(hf_dir, arch, field(r, f"{arch}.block_count"), heads, kv)
    ff = rope_freqs(hf_dir)
    if ff is not None:
        want["rope_freqs.weight"] = ff
    ok = set(want) == {t.name for t in r.tensors}
    if not ok:
        print("tensor names differ:", sorted(set(want) ^ {t.name for t in r.tensors}))
    for t in r.tensors:
        x = want.get(t.name)
        if x is None:
            continue
        qt = t.tensor_type
        policy = gguf.GGMLQuantizationType.F32 if x.ndim <= 1 or t.name.endswith("_norm.weight") else None
        if policy is not None and qt != policy:
            print(f"{t.name}: {qt.name}, the converter writes F32")
            ok = False
        if t.name == "rope_freqs.weight":  # numpy's float32 pow against torch's: to the last bit or so
            same = np.allclose(np.asarray(t.data), x, rtol=1e-6, atol=0)
        else:
            same = np.asarray(quantize(x, qt)).tobytes() == np.asarray(t.data).tobytes()
        if not same:
            print(f"{t.name}: {qt.name} bytes differ from gguf.quants.quantize's")
            ok = False
    print(f"{len(r.tensors)} tensors: {'each as llama.cpp converts it' if ok else 'DIFFERENT'}")
    return ok


def greedy(path, n_ctx, prompt, n):
    import llama_cpp
    import llama_cpp.llama
    from llama_cpp import Llama

    # llama.cpp's repacked CPU weights (its AMX and interleaved kernels) crash on the fixtures'
    # q8_0 tensors of 16 rows (llama-cpp-python 0.3.36, a Xeon with AMX); its plain kernels run
    # them. Llama() takes no such option, so the default model parameters are patched.
    defaults = llama_cpp.llama_model_default_params

    def plain_buffers():
        p = defaults()
        p.use_extra_bufts = False
        return p

    llama_cpp.llama.llama_cpp.llama_model_default_params = plain_buffers

    # logits_all: llama-cpp-python keeps the scores of every evaluated position (the last one read here).
    llm = Llama(model_path=path, n_ctx=n_ctx, n_threads=2, verbose=False, logits_all=True)
    ids = llm.tokenize(prompt.encode(), add_bos=False, special=True)
    out = []
    llm.eval(ids)
    for _ in range(n):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(nxt)
        llm.eval([nxt])
    return ids, out, llm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--hf")
    ap.add_argument("--loom-text")
    ap.add_argument("--prompt", default="")
    ap.add_argument("--tokens", type=int, default=30)
    ap.add_argument("--first", type=int)
    ap.add_argument("--keys", action="store_true")
    a = ap.parse_args()
    r = gguf.GGUFReader(a.gguf)
    for key in r.fields if a.keys else []:
        if key.startswith("tokenizer.ggml.") and key.split(".")[-1] in ("tokens", "token_type", "merges", "scores"):
            print(f"  {key}: {len(r.fields[key].data)} entries")
        elif not key.startswith("GGUF."):
            print(f"  {key}: {json.dumps(field(r, key))[:80]}")
    ok = True
    if a.hf:
        ok &= check_tensors(r, a.hf)
    if a.loom_text:
        loom = open(a.loom_text, encoding="utf-8", errors="surrogateescape").read()
        arch = field(r, "general.architecture")
        _, out, llm = greedy(a.gguf, field(r, f"{arch}.context_length"), a.prompt, a.tokens)
        text = a.prompt + llm.detokenize(out).decode("utf-8", errors="replace")
        if a.first:
            head = a.prompt + llm.detokenize(out[: a.first]).decode("utf-8", errors="replace")
            same = loom.startswith(head)
            what = f"its first {a.first} tokens"
        else:
            same = loom in (text, text + "\n")
            what = f"{a.tokens} tokens"
        print(f"llama.cpp's greedy continuation of {a.prompt!r}, {what}: {'the same as' if same else 'DIFFERENT from'} loom's")
        print("  llama.cpp:", repr(text))
        print("  loom:     ", repr(loom))
        ok &= same
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
