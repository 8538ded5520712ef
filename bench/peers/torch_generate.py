"""PyTorch peer for bench/generate.py: greedy generation with a KV cache from a random-weight
transformers GPT2LMHeadModel of a given shape, timing the prefill (one forward pass over the
prompt, use_cache=True) and the decode (one forward per new token on the cache, argmax) apart.
Prints one JSON object.

  torch_generate.py --n-layer 4 --n-head 4 --n-embd 128 --vocab 65 --positions 64 \\
      --prompt 32 --tokens 32 --dtype float32 --threads 2
"""
import argparse
import json
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    ap = argparse.ArgumentParser()
    for k in ("n-layer", "n-head", "n-embd", "vocab", "positions", "prompt", "tokens"):
        ap.add_argument("--" + k, type=int, required=True)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=a.vocab, n_positions=a.positions, n_embd=a.n_embd, n_layer=a.n_layer,
                     n_head=a.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg).to(getattr(torch, a.dtype)).eval()
    ids = torch.randint(0, a.vocab, (1, a.prompt))
    with torch.inference_mode():
        model(ids[:, :4], use_cache=True)  # first-call set-up (allocator, kernels) outside the timings
        t0 = time.perf_counter()
        out = model(ids, use_cache=True)
        prefill_s = time.perf_counter() - t0
        past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        t0 = time.perf_counter()
        for _ in range(a.tokens):
            out = model(nxt, past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        decode_s = time.perf_counter() - t0
    print(json.dumps(dict(framework="pytorch", torch=torch.__version__, dtype=a.dtype, prompt=a.prompt,
                          tokens=a.tokens, prefill_s=prefill_s, decode_s=decode_s,
                          prefill_tok_s=a.prompt / prefill_s, decode_tok_s=a.tokens / decode_s)))


if __name__ == "__main__":
    main()
