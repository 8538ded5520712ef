"""LoRA against full fine-tuning and against PyTorch + PEFT (issue 30, point 6), interleaved on one machine.

Four implementations train on random tokens at one Llama shape, bfloat16 compute with float32 masters,
AdamW, each in its own process with the same thread count:

  loom full     `loom train` updating every parameter
  loom lora     `loom train ... lora.rank=R lora.alpha=2R lora.targets=all-linear`
  loom lean     the same with the base stored in bfloat16 and the head in vocabulary chunks
                (--lean-overrides): LoRA's smallest memory, paid for by widening the base in
                each product and recomputing the head's logits in its backward
  torch eager   bench/peers/torch_lora.py: transformers' Llama + PEFT's LoraConfig(all-linear), bf16 autocast
  torch compile the same under torch.compile

Every repeat runs each once, in turn, so machine noise falls on all of them. Per run: the median
training step (after the warm-up steps) as tokens/s, and the process's peak resident set (wait4's
ru_maxrss). The table shows medians over repeats and the targets: loom LoRA >= 1.3x loom's full
step, >= 1.5x the faster PyTorch + PEFT tokens/s, at <= 0.7x its peak memory. Writes
bench/results/lora_vs_peft.json. Run through bench/lora_vs_peft.sh (it makes the PyTorch venv).

What the frozen base saves: LoRA runs no dense_grad_weight for a base kernel (`loom profile` counts
two per adapter, none per base layer) and keeps no base gradients or Adam moments. At
bench/lora_small_llama.toml's shape on an idle host the base's weight-gradient products were 133 ms
of the full step's 540 ms (25 %) and AdamW 21 ms more (docs/performance.md, LoRA).

  python3 bench/lora_vs_peft.py --torch-python PY [--shape 1b|1b-4layers|small] [--repeats 2]
      [--steps 4] [--warmup 2] [--skip full,compile]
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from host import describe  # noqa: E402

# Llama-3.2-1B's dimensions (tied embeddings), the same with 4 of its 16 layers (its full fine-tuning
# fits a machine that 1B's 20 GB of masters and moments does not), and bench/lora_small_llama.toml's.
SHAPES = {
    "1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=128256, tie=True, batch=1,
               seq=512),
    "1b-4layers": dict(hidden=2048, layers=4, heads=32, kv_heads=8, intermediate=8192, vocab=128256, tie=True,
                       batch=1, seq=512),
    "small": dict(hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1536, vocab=8192, tie=False, batch=8,
                  seq=256),
}
IMPLS = ["full", "lora", "lean", "eager", "compile"]
LOOM_IMPLS = ("full", "lora", "lean")


def run_measured(cmd, env):
    """Runs cmd; returns (stdout, peak RSS bytes of that process)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        o, e = out.read().decode(), err.read().decode()
    if p.returncode != 0:
        raise RuntimeError(f"failed ({p.returncode}): {' '.join(cmd)}\n{o[-2000:]}{e[-3000:]}")
    return o, ru.ru_maxrss * 1024


def loom_cmd(loom, shape, impl, steps, rank, threads, out, lora_overrides=()):
    s = SHAPES[shape]
    o = ["data.kind=random_tokens", f"data.vocab_size={s['vocab']}", f"data.batch_size={s['batch']}",
         f"data.seq_len={s['seq']}", f"model.hidden_size={s['hidden']}", f"model.num_layers={s['layers']}",
         f"model.head_dim={s['hidden'] // s['heads']}", f"model.num_kv_heads={s['kv_heads']}",
         f"model.intermediate_size={s['intermediate']}", f"model.vocab_size={s['vocab']}",
         f"model.num_outputs={s['vocab']}", f"model.max_seq_len={s['seq']}",
         f"model.tie_embeddings={'true' if s['tie'] else 'false'}", f"train.steps={steps}", "train.log_every=1",
         "train.eval_interval=0", "train.sample_tokens=0", f"threads={threads}"]
    if impl != "full":
        o += [f"lora.rank={rank}", f"lora.alpha={2 * rank}", "lora.targets=all-linear", *lora_overrides]
    return [loom, "train", str(ROOT / "bench/lora_small_llama.toml"), *o, "--out", out]


def run_loom(loom, shape, impl, steps, warmup, rank, threads, env, lora_overrides=()):
    with tempfile.TemporaryDirectory(prefix="loom-lora-") as td:
        cmd = loom_cmd(loom, shape, impl, steps + warmup, rank, threads, os.path.join(td, "run"), lora_overrides)
        _, rss = run_measured(cmd, env)
        rows = [json.loads(line) for line in open(os.path.join(td, "run", "metrics.jsonl"))]
    times = [r["step_time_s"] for r in rows if "step_time_s" in r][warmup:]
    s = SHAPES[shape]
    med = statistics.median(times)
    return dict(step_s=times, median_step_s=med, tokens_per_s=s["batch"] * s["seq"] / med, peak_rss_bytes=rss,
                cmd=" ".join(cmd))


def run_torch(py, shape, impl, steps, warmup, rank, threads, env, lora_overrides=()):
    s = SHAPES[shape]
    cmd = [py, str(ROOT / "bench/peers/torch_lora.py"), "--hidden", str(s["hidden"]), "--layers", str(s["layers"]),
           "--heads", str(s["heads"]), "--kv-heads", str(s["kv_heads"]), "--intermediate", str(s["intermediate"]),
           "--vocab", str(s["vocab"]), "--batch", str(s["batch"]), "--seq", str(s["seq"]), "--steps", str(steps),
           "--warmup", str(warmup), "--rank", str(rank), "--alpha", str(2 * rank), "--threads", str(threads)]
    if s["tie"]:
        cmd.append("--tie")
    if impl == "compile":
        cmd.append("--compile")
    out, rss = run_measured(cmd, env)
    r = json.loads(out.strip().splitlines()[-1])
    r["peak_rss_bytes"] = rss
    r["cmd"] = " ".join(cmd)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", default=str(ROOT / "build" / "loom"))
    ap.add_argument("--torch-python", required=True, help="a python with torch 2.x, transformers and peft")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b-4layers")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=2, help="steps run first and not timed")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lora-overrides", default="",
                    help="space-separated loom overrides for the LoRA run, e.g. "
                         "'lora.base_dtype=bfloat16 model.head_chunk=8192'")
    ap.add_argument("--lean-overrides", default="lora.base_dtype=bfloat16 model.head_chunk=8192",
                    help="space-separated loom overrides of the lean LoRA run")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "lora_vs_peft.json"))
    ap.add_argument("--skip", default="", help="comma-separated implementations to leave out: " + ",".join(IMPLS))
    a = ap.parse_args()
    skip = {x for x in a.skip.split(",") if x}
    if skip - set(IMPLS):
        sys.exit(f"--skip: unknown {sorted(skip - set(IMPLS))}; use {','.join(IMPLS)}")
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", CUDA_VISIBLE_DEVICES="")
    runs = {i: [] for i in IMPLS if i not in skip}
    for rep in range(a.repeats):
        for impl in runs:
            load = open("/proc/loadavg").read().split()[:3]
            print(f"repeat {rep + 1}/{a.repeats}: {impl} (load {' '.join(load)})", file=sys.stderr, flush=True)
            f = run_loom if impl in LOOM_IMPLS else run_torch
            r = f(a.loom if f is run_loom else a.torch_python, a.shape, impl, a.steps, a.warmup, a.rank, a.threads, env,
                  (a.lean_overrides if impl == "lean" else a.lora_overrides).split())
            r["load_before"] = load
            runs[impl].append(r)
            print(f"  {r['tokens_per_s']:.1f} tokens/s, peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB", file=sys.stderr,
                  flush=True)

    med = {i: dict(tokens_per_s=statistics.median(r["tokens_per_s"] for r in rs),
                   peak_rss_bytes=statistics.median(r["peak_rss_bytes"] for r in rs)) for i, rs in runs.items()}
    names = {"full": "loom full fine-tuning", "lora": f"loom LoRA r{a.rank} {a.lora_overrides}".rstrip(),
             "lean": f"loom LoRA r{a.rank} {a.lean_overrides}", "eager": "PyTorch + PEFT eager",
             "compile": "PyTorch + PEFT torch.compile"}
    s = SHAPES[a.shape]
    print(f"\nshape {a.shape}: {s}, bf16, AdamW, {a.threads} threads each, medians of {a.repeats} interleaved repeats "
          f"of {a.steps} timed steps\n")
    print("| | tokens/s | peak RSS (GiB) |\n|---|---|---|")
    for i, m in med.items():
        print(f"| {names[i]} | {m['tokens_per_s']:.1f} | {m['peak_rss_bytes'] / 2**30:.2f} |")
    targets = {}
    peers = [i for i in ("eager", "compile") if i in med]
    best = max(peers, key=lambda i: med[i]["tokens_per_s"]) if peers else None
    if best:
        targets["faster_peer"] = best
    for lo in ("lora", "lean"):
        if lo in med and "full" in med:
            targets[f"{lo}_over_full_speed"] = med[lo]["tokens_per_s"] / med["full"]["tokens_per_s"]
        if lo in med and best:
            targets[f"{lo}_over_peer_speed"] = med[lo]["tokens_per_s"] / med[best]["tokens_per_s"]
            targets[f"{lo}_over_peer_memory"] = med[lo]["peak_rss_bytes"] / med[best]["peak_rss_bytes"]
    print()
    for lo in ("lora", "lean"):
        for k, want in (("over_full_speed", ">= 1.3"), ("over_peer_speed", ">= 1.5"), ("over_peer_memory", "<= 0.7")):
            if f"{lo}_{k}" in targets:
                print(f"{lo}_{k}: {targets[f'{lo}_{k}']:.2f} (target {want})")
    out = pathlib.Path(a.out)
    out.parent.mkdir(exist_ok=True)
    result = dict(shape=a.shape, dims=s, threads=a.threads, repeats=a.repeats, steps=a.steps, warmup=a.warmup,
                  rank=a.rank, lora_overrides=a.lora_overrides.split(), lean_overrides=a.lean_overrides.split(),
                  host=describe(),
                  medians=med, targets=targets, runs=runs)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(dict(medians=med, targets=targets)))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
