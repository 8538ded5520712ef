#!/usr/bin/env python3
"""PyTorch peer for loom's CPU benchmark: nanoGPT's model (model.py) and training step.

The model is nanoGPT's GPT written out again (attention-first blocks, LayerNorm with optional
bias, tied wte/lm_head, GELU exact, GPT-2 init with c_proj weights at 0.02/sqrt(2*n_layer)).
Attention is F.scaled_dot_product_attention where the PyTorch has it (2.x), else nanoGPT's manual
causal path (PyTorch 1.13, Debian 12's python3-torch; the path nanoGPT itself takes then). The
optimizer is nanoGPT's configure_optimizers: AdamW with weight decay on every parameter of 2+
dims; nanoGPT asks for `fused` only on CUDA, the bench asks for it on CPU too (--fused-adamw, the
default where the PyTorch has a fused CPU AdamW: 2.4 and later).

Two modes:

  bench   time full training steps (forward + backward + clip + AdamW + zero_grad) on a fixed
          random batch; prints one JSON object with every step's time.
            torch_gpt.py bench --n-layer 4 --n-head 4 --n-embd 128 --vocab 65 --block 64
                               --batch 12 --seq 64 --steps 30 --warmup 5 [--bias]
                               [--dtype bfloat16] [--compile] [--no-fused-adamw]
          --dtype bfloat16 runs forward and loss under torch.autocast("cpu", torch.bfloat16) (fp32
          parameters and optimizer, as loom's bfloat16 with fp32 masters); --compile wraps the model
          in torch.compile (nanoGPT's compile=True; its compilation falls in the warm-up steps, and
          the first step's time is reported apart as first_step_s).
  train   nanoGPT's CPU recipe on tiny Shakespeare (char level) from data/shakespeare_char
          (nanoGPT's train.py loop: get_batch, get_lr, estimate_loss every eval_interval, clip),
          then the loss on the whole validation split; prints JSON lines.
            torch_gpt.py train --data data/shakespeare_char --seed 1337

Run it with OMP_WAIT_POLICY=PASSIVE (bench/run.sh and bench/nanogpt_reference.sh do): without it
PyTorch's OpenMP pool and OpenBLAS's threads spin against each other on 2 cores.
"""
import argparse
import inspect
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F


# ---------------------------------------------------------------------------------------------
# nanoGPT's model.py (Karpathy), without the generate/from_pretrained/crop helpers.
# ---------------------------------------------------------------------------------------------
class LayerNorm(nn.Module):
    """LayerNorm but with an optional bias. PyTorch doesn't support simply bias=False"""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.flash = hasattr(torch.nn.functional, "scaled_dot_product_attention")
        if not self.flash:
            # causal mask to ensure that attention is only applied to the left in the input sequence
            self.register_buffer(
                "bias",
                torch.tril(torch.ones(config.block_size, config.block_size)).view(
                    1, 1, config.block_size, config.block_size
                ),
            )

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.flash:
            y = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True
            )
        else:
            # manual implementation of attention
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        y = self.resid_dropout(self.c_proj(y))
        return y


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        x = self.c_fc(x)
        x = self.gelu(x)
        x = self.c_proj(x)
        x = self.dropout(x)
        return x


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def get_num_params(self, non_embedding=True):
        n_params = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n_params -= self.transformer.wpe.weight.numel()
        return n_params

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        assert t <= self.config.block_size
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        tok_emb = self.transformer.wte(idx)
        pos_emb = self.transformer.wpe(pos)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type, fused=None):
        """fused: None for nanoGPT's choice (fused on CUDA only), else asked for as given."""
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [
            {"params": decay_params, "weight_decay": weight_decay},
            {"params": nodecay_params, "weight_decay": 0.0},
        ]
        fused_available = "fused" in inspect.signature(torch.optim.AdamW).parameters
        use_fused = fused_available and (device_type == "cuda" if fused is None else fused)
        extra_args = dict(fused=True) if use_fused else dict()
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas, **extra_args)


def env_info(threads):
    return dict(
        torch=torch.__version__,
        python=platform.python_version(),
        threads=torch.get_num_threads(),
        threads_requested=threads,
        interop_threads=torch.get_num_interop_threads(),
        omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", ""),
        openblas_coretype=os.environ.get("OPENBLAS_CORETYPE", ""),
        aten_cpu_capability=cpu_capability(),
        aten_cpu_capability_env=os.environ.get("ATEN_CPU_CAPABILITY", ""),
        onednn_max_cpu_isa_env=os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
    )


def cpu_capability():
    """ATen's kernel ISA as torch.__config__.show() reports it ("CPU capability usage: AVX2")."""
    show = torch.__config__.show()
    key = "CPU capability usage: "
    return show.split(key, 1)[1].split()[0] if key in show else ""


# ---------------------------------------------------------------------------------------------
# bench: time training steps on a fixed random batch.
# ---------------------------------------------------------------------------------------------
def build_model(args):
    """nanoGPT's GPT for the bench flags, initialised from --seed (the same weights in every process)."""
    torch.manual_seed(args.seed)
    cfg = GPTConfig(
        block_size=args.block, vocab_size=args.vocab, n_layer=args.n_layer, n_head=args.n_head,
        n_embd=args.n_embd, dropout=0.0, bias=args.bias,
    )
    model = GPT(cfg)
    model.train()
    return model


def random_batch(args):
    """The fixed random batch: inputs x and next-token targets y, each (--batch, --seq) int64."""
    g = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(1, args.vocab, (args.batch, args.seq + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def train_step(model, opt, x, y, grad_clip, autocast_dtype=None):
    """One timed training step (forward, backward, clip, AdamW, zero_grad); returns the loss. model may
    be a DistributedDataParallel wrapper, whose backward sums the gradients over the ranks. With
    autocast_dtype, forward and loss run under CPU autocast to it (backward follows autocast's casts)."""
    with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
        _, loss = model(x, y)
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def fused_cpu_adamw():
    """Whether this PyTorch has a fused AdamW for CPU tensors (2.4 and later; 1.13 has none)."""
    if "fused" not in inspect.signature(torch.optim.AdamW).parameters:
        return False
    try:
        p = torch.nn.Parameter(torch.zeros(2))
        p.grad = torch.zeros(2)
        torch.optim.AdamW([p], fused=True).step()
        return True
    except (RuntimeError, ValueError):
        return False


def bench(args):
    model = build_model(args)
    fused = args.fused_adamw and fused_cpu_adamw()
    opt = model.configure_optimizers(args.weight_decay, args.lr, (args.beta1, args.beta2), "cpu", fused=fused)
    x, y = random_batch(args)
    net = model  # the module itself: torch.compile's wrapper forwards calls, not every attribute
    if args.compile:
        model = torch.compile(model)
    autocast = torch.bfloat16 if args.dtype == "bfloat16" else None

    times, losses = [], []
    for it in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        losses.append(train_step(model, opt, x, y, args.grad_clip, autocast))
        times.append(time.perf_counter() - t0)
    out = dict(
        framework="pytorch",
        mode="bench",
        dtype=args.dtype, compiled=args.compile, fused_adamw=fused,
        sdpa=hasattr(F, "scaled_dot_product_attention"), first_step_s=times[0],
        params=sum(p.numel() for p in net.parameters()),
        params_no_pos=net.get_num_params(non_embedding=True),
        step_time_s=times,
        warmup=args.warmup,
        losses=losses,
        env=env_info(args.threads),
    )
    print(json.dumps(out))


# ---------------------------------------------------------------------------------------------
# train: nanoGPT's train.py loop, CPU recipe for shakespeare_char.
# ---------------------------------------------------------------------------------------------
def train(args):
    # nanoGPT: torch.manual_seed(1337 + seed_offset) before building the model; every random
    # draw afterwards (init, get_batch, estimate_loss) comes from the global generator, in the
    # same order as train.py.
    torch.manual_seed(args.seed)
    block_size, batch_size = args.block, args.batch
    train_data = np.memmap(os.path.join(args.data, "train.bin"), dtype=np.uint16, mode="r")
    val_data = np.memmap(os.path.join(args.data, "val.bin"), dtype=np.uint16, mode="r")
    with open(os.path.join(args.data, "meta.json")) as f:
        meta = json.load(f)
    vocab = int(meta["vocab_size"])

    def get_batch(split):
        data = train_data if split == "train" else val_data
        ix = torch.randint(len(data) - block_size, (batch_size,))
        x = torch.stack([torch.from_numpy((data[i : i + block_size]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1 : i + 1 + block_size]).astype(np.int64)) for i in ix])
        return x, y

    cfg = GPTConfig(block_size=block_size, vocab_size=vocab, n_layer=args.n_layer, n_head=args.n_head,
                    n_embd=args.n_embd, dropout=0.0, bias=args.bias)
    model = GPT(cfg)
    opt = model.configure_optimizers(args.weight_decay, args.lr, (args.beta1, args.beta2), "cpu")

    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split in ["train", "val"]:
            losses = torch.zeros(args.eval_iters)
            for k in range(args.eval_iters):
                X, Y = get_batch(split)
                _, loss = model(X, Y)
                losses[k] = loss.item()
            out[split] = losses.mean().item()
        model.train()
        return out

    @torch.no_grad()
    def full_val_loss():
        # Every non-overlapping window of the validation split: starts 0, T, 2T, ... while
        # start + T + 1 <= len, so the labels are tokens 1 .. W*T, each exactly once. Mean loss
        # per token (the windows are batched, which does not change the mean).
        model.eval()
        n = len(val_data)
        W = (n - 1) // block_size
        arr = torch.from_numpy(np.asarray(val_data[: W * block_size + 1]).astype(np.int64))
        total, count = 0.0, 0
        for s in range(0, W, 128):
            e = min(W, s + 128)
            X = torch.stack([arr[i * block_size : (i + 1) * block_size] for i in range(s, e)])
            Y = torch.stack([arr[i * block_size + 1 : (i + 1) * block_size + 1] for i in range(s, e)])
            logits, _ = model(X, Y)
            total += F.cross_entropy(logits.view(-1, logits.size(-1)), Y.view(-1), reduction="sum").item()
            count += Y.numel()
        model.train()
        return total / count, W, count

    def get_lr(it):
        if it < args.warmup_iters:
            return args.lr * (it + 1) / (args.warmup_iters + 1)
        if it > args.lr_decay_iters:
            return args.min_lr
        decay_ratio = (it - args.warmup_iters) / (args.lr_decay_iters - args.warmup_iters)
        coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
        return args.min_lr + coeff * (args.lr - args.min_lr)

    jlog = open(args.log, "a") if args.log else None

    def emit(d, text):
        # JSON lines to --log (or stdout without one); a readable line on stdout.
        if jlog:
            jlog.write(json.dumps(d) + "\n")
            jlog.flush()
            print(text, flush=True)
        else:
            print(json.dumps(d), flush=True)

    emit(dict(event="start", seed=args.seed, params=model.get_num_params(), env=env_info(args.threads)),
         f"   seed {args.seed}: {model.get_num_params()} params (without wpe), torch {torch.__version__}, "
         f"{torch.get_num_threads()} threads")
    t_start = time.perf_counter()
    eval_s = 0.0
    iter_num = 0
    X, Y = get_batch("train")
    result = {}
    while True:
        lr = get_lr(iter_num)
        for param_group in opt.param_groups:
            param_group["lr"] = lr
        if iter_num % args.eval_interval == 0:
            te = time.perf_counter()
            losses = estimate_loss()
            eval_s += time.perf_counter() - te
            el = time.perf_counter() - t_start
            emit(dict(event="eval", iter=iter_num, train_loss=losses["train"], val_loss=losses["val"], elapsed_s=el),
                 f"   iter {iter_num:5d}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f} "
                 f"(20-batch estimates), {el:.0f} s")
            if iter_num == args.max_iters:
                result["estimate"] = losses
        if iter_num >= args.max_iters:
            # nanoGPT runs one more (unused) optimizer step at max_iters before it stops; the
            # reported numbers are those of the evaluation above, after max_iters steps.
            break
        _, loss = model(X, Y)
        X, Y = get_batch("train")
        loss.backward()
        if args.grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        iter_num += 1
    train_s = time.perf_counter() - t_start
    tf = time.perf_counter()
    full, windows, tokens = full_val_loss()
    full_s = time.perf_counter() - tf
    d = dict(
        event="final", seed=args.seed, iters=iter_num,
        val_loss_full=full, val_windows=windows, val_tokens=tokens,
        val_loss_estimate=result.get("estimate", {}).get("val"),
        train_loss_estimate=result.get("estimate", {}).get("train"),
        wall_s=train_s, eval_s=eval_s, train_only_s=train_s - eval_s, full_val_s=full_s,
        ms_per_iter=(train_s - eval_s) / max(1, iter_num) * 1e3,
    )
    emit(d, f"   seed {args.seed}: iter {iter_num} val loss on the whole split {full:.4f} ({tokens} tokens), "
            f"20-batch estimate {d['val_loss_estimate']:.4f}; wall {train_s:.0f} s "
            f"({d['ms_per_iter']:.1f} ms/iter without evaluations)")


def add_model_args(ap, threads):
    """The flags of the model, its fixed random batch and its optimizer step (bench here, torch_ddp.py)."""
    ap.add_argument("--threads", type=int, default=threads)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=65)
    ap.add_argument("--block", type=int, default=64, help="block_size (rows of wpe)")
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--seq", type=int, default=64, help="bench: tokens per sequence (<= block)")
    ap.add_argument("--bias", action="store_true", help="bias in Linear and LayerNorm (nanoGPT's bias)")
    ap.add_argument("--steps", type=int, default=20, help="bench: timed steps after warm-up")
    ap.add_argument("--warmup", type=int, default=3, help="bench: untimed warm-up steps")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.99)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["bench", "train"])
    add_model_args(ap, threads=2)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup-iters", type=int, default=100)
    ap.add_argument("--lr-decay-iters", type=int, default=2000)
    ap.add_argument("--max-iters", type=int, default=2000)
    ap.add_argument("--eval-interval", type=int, default=250)
    ap.add_argument("--eval-iters", type=int, default=20)
    ap.add_argument("--data", default="data/shakespeare_char")
    ap.add_argument("--log", default="", help="train: append JSON lines here and print readable lines")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="bench: bfloat16 = forward and loss under CPU autocast to bfloat16")
    ap.add_argument("--compile", action="store_true", help="bench: torch.compile the model")
    ap.add_argument("--no-fused-adamw", dest="fused_adamw", action="store_false",
                    help="bench: the for-each AdamW even where a fused CPU AdamW exists")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.mode == "bench":
        bench(args)
    else:
        train(args)


if __name__ == "__main__":
    sys.exit(main())
