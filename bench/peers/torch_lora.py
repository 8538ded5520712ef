#!/usr/bin/env python3
"""PyTorch + PEFT peer for loom's LoRA benchmark (bench/lora_vs_peft.py, issue 30 point 6).

A transformers LlamaForCausalLM with random weights at the given shape (nothing is downloaded),
PEFT's LoraConfig(r, lora_alpha, target_modules="all-linear", lora_dropout=0) on it, and
training steps as a PEFT user runs them on a CPU: forward and loss under
torch.autocast("cpu", torch.bfloat16) with float32 parameters (as loom's bfloat16 with float32
masters), backward, AdamW over the adapters, zero_grad. One fixed batch of random tokens.
--compile wraps the model in torch.compile; its compilation falls in the warm-up steps.

  torch_lora.py --hidden 2048 --layers 16 --heads 32 --kv-heads 8 --intermediate 8192 \
                --vocab 128256 --batch 1 --seq 512 --steps 4 --warmup 2 [--compile]

Prints one JSON object: every timed step's seconds, tokens/s from their median, and the process's
peak resident set (ru_maxrss) at the end. Run with OMP_WAIT_POLICY=PASSIVE.
"""
import argparse
import json
import resource
import statistics
import time


def main():
    ap = argparse.ArgumentParser()
    for k, v in dict(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=128256, batch=1, seq=512,
                     steps=4, warmup=2, rank=16, alpha=32, threads=2).items():
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    ap.add_argument("--tie", action="store_true", help="tie the embedding and the output head (Llama 3.2)")
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()

    import torch
    import peft
    import transformers

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
                                   num_key_value_heads=a.kv_heads, intermediate_size=a.intermediate,
                                   vocab_size=a.vocab, max_position_embeddings=a.seq, tie_word_embeddings=a.tie,
                                   attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(cfg)
    model = peft.get_peft_model(model, peft.LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=0.0,
                                                       target_modules="all-linear"))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4)
    fwd = torch.compile(model) if a.compile else model
    ids = torch.randint(0, a.vocab, (a.batch, a.seq))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    t0 = time.perf_counter()
    for _ in range(a.warmup):
        step()
    warm_s = time.perf_counter() - t0
    times = []
    for _ in range(a.steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    print(json.dumps(dict(impl="torch+peft " + ("compile" if a.compile else "eager"), torch=torch.__version__,
                          peft=peft.__version__, step_s=times, warmup_s=warm_s, median_step_s=med,
                          tokens_per_s=a.batch * a.seq / med,
                          trainable_params=sum(p.numel() for p in trainable),
                          peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)))


if __name__ == "__main__":
    main()
