#!/usr/bin/env python3
"""Two loom binaries' attention against each other (docs/performance.md "Attention's block products").

For a change to the attention kernels: each shape (sequence T, head size D, query and key/value
heads, an optional sliding window) runs as a one-layer Llama-style model with a small vocabulary
and MLP under `loom profile` of each binary, in pairs whose order alternates (ABBA), and the figure
is the median over the pairs of attention + attention_grad milliseconds per step (the profile's op
totals), B over A. Binaries built without AVX-512 (bench/build_loom_avx2.sh) compare AVX2 kernels.

    python3 bench/attention_ab.py --a OLD/loom --b build/loom                  # ~4 min, idle 2-core host
    python3 bench/attention_ab.py --a OLD/loom --b build/loom --dtype bfloat16 --repeats 3
    python3 bench/attention_ab.py --a A --b B --shapes 1024:64:12:12,2048:64:32:8:256

Standard library only. Prints a markdown table and writes bench/results/attention_ab.json.
"""
import argparse
import datetime
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from families import LLAMA_STYLE, NO_EXTRAS, dims, profile  # noqa: E402
from host import describe, summary  # noqa: E402

# T:D:heads:kv_heads[:window], spanning the product domain's bounds in attention.cpp (T·D from 8192
# to 262144, with and without a window).
SHAPES = "128:64:32:8,256:64:32:8,512:64:32:8,1024:64:12:12,2048:64:32:8,4096:64:8:8,256:128:16:8," \
         "1024:128:16:8,2048:128:8:4,1024:256:4:1,2048:64:32:8:128,2048:64:32:8:256,2048:64:32:8:1024"


def overrides(T, D, H, KV, W, dtype):
    return (LLAMA_STYLE + NO_EXTRAS + dims(H * D, D, H, KV, 512, 512, 10000)
            + [f"data.seq_len={T}", f"model.max_seq_len={T}", "model.num_layers=1", "data.batch_size=1",
               "optimizer.num_minibatches=1", f"model.dtype={dtype}"] + ([f"model.sliding_window={W}"] if W else []))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="the baseline loom binary")
    ap.add_argument("--b", required=True, help="the changed loom binary")
    ap.add_argument("--shapes", default=SHAPES, help="comma-separated T:D:heads:kv_heads[:window]")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=3, help="pairs per shape")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "attention_ab.json"))
    a = ap.parse_args()
    host = describe()
    print(f"host: {summary(host)}; A {a.a}; B {a.b}; {a.dtype}\n")
    print("| T | D | heads (kv) | window | A ms | B ms | B / A (median of pairs, range) |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for spec in a.shapes.split(","):
        f = [int(x) for x in spec.split(":")]
        T, D, H, KV, W = (f + [0])[:5]
        ov = overrides(T, D, H, KV, W, a.dtype)
        ms = {"a": [], "b": []}
        for i in range(a.repeats):
            for side in (("a", "b") if i % 2 == 0 else ("b", "a")):
                ms[side].append(profile(getattr(a, side), ov, a.steps, 1)[2])
        pairs = [b / x for x, b in zip(ms["a"], ms["b"])]
        ratio = statistics.median(pairs)
        rows.append({"T": T, "D": D, "heads": H, "kv_heads": KV, "window": W, "a_ms": ms["a"], "b_ms": ms["b"],
                     "pair_ratios": pairs, "ratio": ratio})
        print(f"| {T} | {D} | {H} ({KV}) | {W or '-'} | {statistics.median(ms['a']):.1f} | "
              f"{statistics.median(ms['b']):.1f} | {ratio:.2f} ({min(pairs):.2f}–{max(pairs):.2f}) |", flush=True)
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                               "host": host, "a": a.a, "b": a.b, "dtype": a.dtype, "rows": rows}, indent=1) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
