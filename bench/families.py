#!/usr/bin/env python3
"""Speed and memory of each model family's features (issue 27.5, docs/performance.md "Model families").

Each family runs at the dimensions of its smallest release with the layers cut to --layers, next to
its Llama-style twin: the same dimensions with the family's own features switched off (llama3 rope
scaling, Qwen2's q/k/v biases, Qwen3's q/k norms, Mistral's sliding window, Gemma 3's blocks). A
feature should cost no more than its FLOPs: the target is the family's achieved GFLOP/s (the cost
rules' FLOPs over the median step of `loom profile`) within 10 % of its twin's, as the median of
--repeats interleaved pairs (ABBA order) of family / twin, in float32 and bfloat16.

Then the memory plan against the measured peak (as bench/memory_rss.py measures it: `loom train`'s
maximum RSS minus `loom params`' baseline) for each family, and the sliding window's cost at several
windows: it should fall in proportion to the window. The window sweep runs Llama 3.2 1B's attention
(32 query heads of 64, 8 key/value heads) in one layer at --window-seq tokens, with a small
vocabulary and MLP, so that a step is mostly attention; `window` times attention + attention_grad
(the profile's op totals, median of the rounds, windows interleaved), `window_ir` counts the
instructions inside the two kernels (callees included) in one training step under valgrind's
callgrind, which no other load on the host changes. Callgrind cannot run AVX-512 code: give it a
loom built without it (bench/build_loom_avx2.sh) with --loom-ir; it runs one head, one thread.

    python3 bench/families.py                      # ~25 min on a loaded 2-core host
    python3 bench/families.py --only qwen --dtypes bfloat16 --repeats 1
    python3 bench/families.py --parts window      # only the sliding-window timing sweep
    python3 bench/families.py --parts window_ir --loom-ir bench/build/loom-avx2/loom   # ~5 min
    python3 bench/families.py --quick              # dimensions divided by 8: a smoke test of the script

Standard library only. Prints markdown tables and writes bench/results/families.json.
"""
import argparse
import concurrent.futures
import datetime
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from host import describe, summary  # noqa: E402
from memory_rss import MB, TARGET_RATIO, TARGET_SLACK, max_rss_bytes  # noqa: E402

LLAMA_STYLE = ["model.kind=transformer", "model.block_order=attn_first", "model.norm=rmsnorm", "model.mlp=swiglu",
               "model.position=rope", "model.use_bias=false", "model.layer_norm_eps=1e-6", "model.dropout_rate=0",
               "model.tie_embeddings=true"]
NO_EXTRAS = ["data.kind=random_tokens", "train.eval_interval=0", "train.sample_tokens=0"]


def dims(hidden, head_dim, heads, kv, inter, vocab, theta):
    return [f"model.hidden_size={hidden}", f"model.head_dim={head_dim}", f"model.num_heads={heads}",
            f"model.num_kv_heads={kv}", f"model.intermediate_size={inter}", f"model.vocab_size={vocab}",
            f"model.num_outputs={vocab}", f"data.vocab_size={vocab}", f"model.rope_theta={theta}"]


# (name, release whose dimensions are used, dimensions, the family's features; the twin omits them)
FAMILIES = [
    ("llama3", "Llama 3.2 1B", dims(2048, 64, 32, 8, 8192, 128256, 500000),
     ["model.rope_scaling=llama3", "model.rope_factor=32", "model.rope_original_max_position=8192"]),
    ("qwen2", "Qwen2.5 0.5B", dims(896, 64, 14, 2, 4864, 151936, 1000000), ["model.qkv_bias=true"]),
    ("qwen3", "Qwen3 0.6B", dims(1024, 128, 16, 8, 3072, 151936, 1000000), ["model.qk_norm=true"]),
    ("mistral", "Llama 3.2 1B with Mistral's window", dims(2048, 64, 32, 8, 8192, 128256, 500000),
     ["model.sliding_window=128"]),
    ("gemma3", "Gemma 3 270M", dims(640, 256, 4, 1, 2048, 262144, 1000000),
     ["model.norm=gemma_rmsnorm", "model.mlp=geglu", "model.post_norms=true", "model.qk_norm=true",
      "model.sliding_window=128"]),
]


# The window sweep's model: Llama 3.2 1B's attention, with a vocabulary and MLP too small to matter.
WINDOW_MODEL = dims(2048, 64, 32, 8, 512, 512, 500000)
# The instruction count's: one head of 64 (callgrind runs ~50x slower; the work per head is the same).
WINDOW_IR_MODEL = dims(64, 64, 1, 1, 128, 512, 500000)


def window_pairs(T, W, block=64):
    """(query, key) pairs that are unmasked (what the cost rule counts), and that the CPU kernel
    computes in its blocks of `block` query rows (src/backend/cpu/attention.cpp: each block from its
    first row's first key rounded down to a block), for causal attention over T with window W (0: none)."""
    unmasked = T * (T + 1) // 2 if W == 0 or W >= T else W * (W + 1) // 2 + (T - W) * W
    computed = 0
    for r0 in range(0, T, block):
        r1 = min(T, r0 + block)
        k0 = max(0, r0 - W + 1) // block * block if W else 0
        computed += (r1 - r0) * (r1 - k0)
    return unmasked, computed


IR_ENV = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
KERNELS = ("cpu_attention", "cpu_attention_grad")


def attention_instructions(loom, ov):
    """Instructions inside loom's attention and attention_grad kernels (callees included) in one
    training step of one thread under callgrind: {"attention": Ir, "attention_grad": Ir}."""
    with tempfile.TemporaryDirectory() as d:
        out = pathlib.Path(d) / "callgrind.out"
        p = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--collect-atstart=no",
                            # Exact names: a pattern ending in * also matches the OpenMP-outlined bodies
                            # ("... [clone ._omp_fn.0]"), whose entry would toggle collection off again.
                            *(f"--toggle-collect=loom::{k}(loom::KernelArgs const&)" for k in KERNELS),
                            loom, "train", "configs/shakespeare_char.toml", *ov, "threads=1", "train.steps=1",
                            "train.log_every=1", "--out", str(pathlib.Path(d) / "run")],
                           cwd=ROOT, capture_output=True, text=True, env=IR_ENV)
        if p.returncode != 0:
            sys.exit(f"callgrind {' '.join(ov)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        ann = subprocess.run(["callgrind_annotate", "--inclusive=yes", str(out)], capture_output=True, text=True,
                             check=True).stdout
    ir = {}
    for line in ann.splitlines():
        m = re.match(r"\s*([\d,]+) .*loom::cpu_(attention(?:_grad)?)\(", line)
        if m and m.group(2) not in ir:
            ir[m.group(2)] = int(m.group(1).replace(",", ""))
    if set(ir) != {"attention", "attention_grad"}:
        sys.exit(f"callgrind_annotate names no loom::cpu_attention / cpu_attention_grad:\n{ann[:3000]}")
    return ir


def quick(ov):
    """Dimensions divided by 8 (heads kept), for a fast check that the script runs."""
    out = []
    for o in ov:
        k, v = o.split("=", 1)
        if k in ("model.hidden_size", "model.intermediate_size", "model.vocab_size", "model.num_outputs",
                 "data.vocab_size"):
            v = str(max(int(v) // 8, 64))
        elif k == "model.head_dim":
            v = str(max(int(v) // 8, 8))
        out.append(f"{k}={v}")
    return out


def profile(loom, ov, steps, warmup):
    """`loom profile` with overrides ov: (achieved GFLOP/s, median step ms, attention ms per step)."""
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run([loom, "profile", "configs/shakespeare_char.toml", *ov, "threads=2", "--steps", str(steps),
                            "--warmup", str(warmup), "--no-ceiling", "--out", d], cwd=ROOT, capture_output=True,
                           text=True)
        if p.returncode != 0:
            sys.exit(f"loom profile {' '.join(ov)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        s = json.loads((pathlib.Path(d) / "summary.json").read_text())
    attn = sum(k["total_ms"] for k in s["op_kinds"] if k["op"] in ("attention", "attention_grad")) / s["steps"]
    return s["step_gflop"] / (s["median_step_ms"] / 1e3), s["median_step_ms"], attn


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loom", default=str(ROOT / "build" / "loom"))
    ap.add_argument("--only", default="", help="only the families whose name contains this")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--windows", default="1024,512,256,128", help="sliding windows of the window sweep")
    ap.add_argument("--window-seq", type=int, default=2048, help="the window sweep's sequence length")
    ap.add_argument("--parts", default="speed,memory,window",
                    help="which tables to measure: speed, memory, window (time), window_ir (instructions)")
    ap.add_argument("--loom-ir", default="", help="a loom without AVX-512 for window_ir (bench/build_loom_avx2.sh)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "families.json"))
    a = ap.parse_args()
    shape = lambda d: quick(d) if a.quick else d  # noqa: E731
    common = LLAMA_STYLE + NO_EXTRAS + [f"model.num_layers={a.layers}", f"data.batch_size={a.batch}",
                                        f"data.seq_len={a.seq}", f"model.max_seq_len={max(a.seq, 2048)}",
                                        "optimizer.num_minibatches=1"]
    fams = [f for f in FAMILIES if a.only in f[0]]
    parts = a.parts.split(",")
    host = describe()
    print(f"host: {summary(host)}; loom {a.loom}\n")

    speed = []
    if "speed" in parts:
        print("| family | dimensions of | dtype | family GFLOP/s | twin GFLOP/s | family / twin (median of pairs, range) | target ≥ 0.90 |")
        print("|---|---|---|---|---|---|---|")
    for name, release, d, features in fams if "speed" in parts else []:
        for dt in a.dtypes.split(","):
            base = common + shape(d) + [f"model.dtype={dt}"]
            runs = {"family": [], "twin": []}
            # Rounds of one pair each, their order alternating (ABBA), so a change of load hits both sides;
            # the figure is the median of the pairs' ratios, which one slow round on a shared host cannot move.
            for i in range(a.repeats):
                for side in (("twin", "family") if i % 2 == 0 else ("family", "twin")):
                    runs[side].append(profile(a.loom, base + (features if side == "family" else []), a.steps, 1))
            pairs = [f[0] / t[0] for f, t in zip(runs["family"], runs["twin"])]
            ratio = statistics.median(pairs)
            med = {k: statistics.median(r[0] for r in v) for k, v in runs.items()}
            speed.append({"family": name, "release": release, "dtype": dt, "overrides": base, "features": features,
                          "family_gflop_per_s": med["family"], "twin_gflop_per_s": med["twin"],
                          "family_step_ms": [r[1] for r in runs["family"]], "twin_step_ms": [r[1] for r in runs["twin"]],
                          "pair_ratios": pairs, "ratio": ratio, "within_target": ratio >= 0.9})
            print(f"| {name} | {release} | {dt} | {med['family']:.1f} | {med['twin']:.1f} | {ratio:.3f} "
                  f"({min(pairs):.2f}–{max(pairs):.2f}) | {'yes' if ratio >= 0.9 else 'NO'} |", flush=True)

    memory = []
    if "memory" in parts:
        print("\n| family | dtype | plan total | measured net peak | net / plan | target (3 % + 24 MB) |")
        print("|---|---|---|---|---|---|")
    train = ["train.steps=2", "train.log_every=1"]
    for name, _, d, features in fams if "memory" in parts else []:
        for dt in a.dtypes.split(","):
            ov = common + shape(d) + features + [f"model.dtype={dt}"]
            cfg = "configs/shakespeare_char.toml"
            plan = json.loads(subprocess.run([a.loom, "memory", cfg, *ov, "--json"], cwd=ROOT, check=True,
                                             capture_output=True, text=True).stdout)
            net = max_rss_bytes([a.loom, "train", cfg, *ov, *train]) - max_rss_bytes([a.loom, "params", cfg, *ov])
            total = plan["total_bytes"]
            ok = abs(net - total) <= TARGET_RATIO * total + TARGET_SLACK
            memory.append({"family": name, "dtype": dt, "overrides": ov, "plan_total_bytes": total,
                           "net_peak_bytes": net, "net_over_plan": net / total, "within_target": ok})
            print(f"| {name} | {dt} | {total / MB:.1f} MB | {net / MB:.1f} MB | {net / total:.3f} | "
                  f"{'yes' if ok else 'NO'} |", flush=True)

    window = []
    ws = [0] + [int(x) for x in a.windows.split(",")] if a.windows else []
    T = a.window_seq
    wbase = LLAMA_STYLE + NO_EXTRAS + [f"data.seq_len={T}", f"model.max_seq_len={T}", "model.num_layers=1",
                                       "data.batch_size=1", "optimizer.num_minibatches=1"]
    if "window" in parts and ws:
        print(f"\n| sliding window (sequence {T}) | attention + attention_grad ms per step (median) | share of none "
              "| unmasked pairs' share | computed pairs' share |")
        print("|---|---|---|---|---|")
        base = wbase + shape(WINDOW_MODEL) + ["model.dtype=bfloat16"]
        times = {w: [] for w in ws}
        for _ in range(a.repeats):  # each window once per round, so a change of load hits all
            for w in ws:
                times[w].append(profile(a.loom, base + [f"model.sliding_window={w}"], a.steps, 1)[2])
        med = {w: statistics.median(t) for w, t in times.items()}
        for w in ws:
            (u, c), (u0, c0) = window_pairs(T, w), window_pairs(T, 0)
            window.append({"window": w, "attention_ms": times[w], "share": med[w] / med[0]})
            print(f"| {w or 'none'} | {med[w]:.1f} | {med[w] / med[0]:.3f} | {u / u0:.3f} | {c / c0:.3f} |", flush=True)

    window_ir = []
    if "window_ir" in parts and ws:
        if not a.loom_ir:
            sys.exit("window_ir needs --loom-ir: a loom built without AVX-512 (bash bench/build_loom_avx2.sh)")
        print(f"\n| sliding window (sequence {T}) | attention Ir | attention_grad Ir | share of none "
              "| unmasked pairs' share | computed pairs' share |")
        print("|---|---|---|---|---|---|")
        base = wbase + shape(WINDOW_IR_MODEL) + ["model.dtype=float32"]
        # A run reads the matmul ceiling from its cache, measuring it when missing: about a second of
        # large products natively, far longer than the step under callgrind, so it is cached first.
        # The cache key names oneDNN's ISA, and callgrind shows the program no AVX-512: both runs hold
        # oneDNN to AVX2, so they share the key.
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([a.loom_ir, "train", "configs/shakespeare_char.toml", *base, "threads=1", "train.steps=1",
                            "--out", str(pathlib.Path(d) / "run")], cwd=ROOT, check=True, capture_output=True,
                           env=IR_ENV)
        # Counts do not depend on the load: the windows run at once.
        with concurrent.futures.ThreadPoolExecutor(len(ws)) as pool:
            irs = dict(zip(ws, pool.map(lambda w: attention_instructions(a.loom_ir, base + [f"model.sliding_window={w}"]),
                                        ws)))
        for w in ws:
            (u, c), (u0, c0) = window_pairs(T, w), window_pairs(T, 0)
            total, total0 = sum(irs[w].values()), sum(irs[0].values())
            window_ir.append({"window": w, "instructions": irs[w], "share": total / total0})
            print(f"| {w or 'none'} | {irs[w]['attention'] / 1e9:.3f} G | {irs[w]['attention_grad'] / 1e9:.3f} G | "
                  f"{total / total0:.3f} | {u / u0:.3f} | {c / c0:.3f} |", flush=True)

    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": datetime.datetime.now().isoformat(timespec="seconds"), "host": host,
                               "loom": a.loom, "args": vars(a), "speed": speed, "memory": memory,
                               "window": window, "window_ir": window_ir}, indent=1) + "\n")
    print(f"\nwrote {out}")
    return 0 if all(r["within_target"] for r in speed + memory) else 1


if __name__ == "__main__":
    sys.exit(main())
