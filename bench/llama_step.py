"""Llama-style blocks against GPT-2 blocks of the same width, depth and tokens (issue 16, point 1):
the training step's model GFLOP/s of each, float32 and bfloat16, from `loom profile` (its
summary.json: model FLOPs of one step, forward + backward without recompute, over the median
step time). Target: Llama-style >= 90 % of GPT-2's rate in both dtypes, i.e. the new ops
(RMSNorm, fused SwiGLU, RoPE, grouped-query attention) have no slow path.

  python3 bench/llama_step.py [--loom build/loom] [--repeats 3] [--steps 8]

Runs are interleaved (every repeat runs each variant once, in turn), so machine noise falls on
both sides; the table shows medians. Writes bench/results/llama_step.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

from host import describe

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

COMMON = ["data.kind=random_tokens", "data.dir=", "train.eval_interval=0", "train.sample_tokens=0",
          "model.dropout_rate=0", "model.use_bias=false", "model.tie_embeddings=true"]
# width C, layers L, head_dim D, key/value heads of the Llama variant, batch B x T, vocabulary V
SHAPES = [
    dict(id="c", C=384, L=6, D=64, KV=2, B=8, T=256, V=65),
    dict(id="wide", C=768, L=4, D=64, KV=4, B=4, T=256, V=8192),
]
VARIANTS = {
    "gpt2": ["model.norm=layernorm", "model.mlp=gelu_tanh", "model.position=learned", "model.num_kv_heads=0"],
    "llama": ["model.norm=rmsnorm", "model.mlp=swiglu", "model.position=rope"],
}


def overrides(shape, variant, dtype):
    o = COMMON + [f"model.hidden_size={shape['C']}", f"model.num_layers={shape['L']}", f"model.head_dim={shape['D']}",
                  f"model.max_seq_len={shape['T']}", f"data.seq_len={shape['T']}", f"data.batch_size={shape['B']}",
                  f"model.vocab_size={shape['V']}", f"model.num_outputs={shape['V']}", f"data.vocab_size={shape['V']}",
                  f"model.dtype={dtype}"] + VARIANTS[variant]
    if variant == "llama":
        o.append(f"model.num_kv_heads={shape['KV']}")
    return o


def profile(loom, shape, variant, dtype, steps):
    with tempfile.TemporaryDirectory(prefix="loom-llama-") as td:
        cmd = [loom, "profile", os.path.join(ROOT, "configs/shakespeare_char.toml"), *overrides(shape, variant, dtype),
               "--steps", str(steps), "--warmup", "2", "--no-ceiling", "--out", td]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"loom failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
        s = json.load(open(os.path.join(td, "summary.json")))
    gflop, ms = s["model_step_gflop"], s["median_step_ms"]
    return dict(model_step_gflop=gflop, median_step_ms=ms, gflops=gflop / (ms / 1e3),
                other_cpus=s["machine_load"].get("other_cpus"), cmd=" ".join(cmd))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", default=os.path.join(ROOT, "build", "loom"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    runs = {}
    for r in range(a.repeats):
        for shape in SHAPES:
            for dtype in ("float32", "bfloat16"):
                for variant in VARIANTS:
                    res = profile(a.loom, shape, variant, dtype, a.steps)
                    runs.setdefault((shape["id"], dtype, variant), []).append(res)
                    print(f"repeat {r + 1}: {shape['id']} {dtype} {variant}: {res['gflops']:.1f} GFLOP/s "
                          f"({res['median_step_ms']:.1f} ms, other processes {res['other_cpus']:.2f} CPUs)", flush=True)
    rows = []
    print("\n| shape | dtype | GPT-2 GFLOP/s | Llama-style GFLOP/s | ratio | target >= 0.90 |")
    print("|---|---|---|---|---|---|")
    for shape in SHAPES:
        for dtype in ("float32", "bfloat16"):
            g = statistics.median(x["gflops"] for x in runs[(shape["id"], dtype, "gpt2")])
            l = statistics.median(x["gflops"] for x in runs[(shape["id"], dtype, "llama")])
            ok = l / g >= 0.9
            rows.append(dict(shape=shape, dtype=dtype, gpt2_gflops=g, llama_gflops=l, ratio=l / g, met=ok,
                             runs={v: runs[(shape["id"], dtype, v)] for v in VARIANTS}))
            print(f"| {shape['id']} (C {shape['C']}, L {shape['L']}, {shape['B']}x{shape['T']}, V {shape['V']}) "
                  f"| {dtype} | {g:.1f} | {l:.1f} | {l / g:.2f} | {'met' if ok else 'NOT met'} |")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "llama_step.json"), "w") as f:
        json.dump(dict(host=describe(), rows=rows, repeats=a.repeats, steps=a.steps), f, indent=1)


if __name__ == "__main__":
    main()
