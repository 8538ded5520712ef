#!/usr/bin/env python3
"""loom's data-parallel scaling on one machine: tokens/s at 1 and 2 ranks, 1 thread each.

For shapes (b) and (c) of docs/performance.md (bench/bench.py's SHAPES, same overrides), runs
  1 rank:  loom train CONFIG OVERRIDES threads=1 --steps N --log-every 1 train.metrics_file=... --out TMP
  2 ranks: mpirun --oversubscribe --allow-run-as-root -np 2 <the same>
alternately (--repeats rounds), and reports the best median step time after warm-up as tokens/s
(global batch x seq_len / step time), the 2-rank scaling efficiency (tok/s at 2 / (2 x tok/s at
1)) and the bytes each rank sends per step (the gradient sum: an all-to-all of (N-1)/N of the
gradients, then an all-gather of the same amount). The load average is stored with each timing:
on a busy machine the numbers mean little.

  python3 bench/scaling.py [--loom build/loom] [--repeats 2] [--only b,c]

Writes bench/results/scaling.json. Not in it: PyTorch DDP (docs/scaling.md says why).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench import SHAPES  # noqa: E402  (the shapes of docs/performance.md)


def run(loom, shape, ranks):
    with tempfile.TemporaryDirectory(prefix="loom-scaling-") as td:
        mfile = os.path.join(td, "metrics.jsonl")
        n = shape["warmup"] + shape["steps"]
        # A run directory of its own: a second run into the config's default one would be refused.
        cmd = [loom, "train", shape["config"], *shape["overrides"], "threads=1", "--steps", str(n),
               "--log-every", "1", f"train.metrics_file={mfile}", "--out", os.path.join(td, "run")]
        if ranks > 1:
            cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(ranks), *cmd]
        load_before = os.getloadavg()[0]
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        rows = sorted((json.loads(l) for l in open(mfile) if l.strip()), key=lambda r: r["step"])
    times = [r["step_time_s"] for r in rows][shape["warmup"]:]
    params = int(p.stdout.split(" parameters")[0].split()[-1])
    return dict(ranks=ranks, cmd=" ".join(cmd), step_time_s=times, median_s=statistics.median(times),
                load_before=load_before, load_after=os.getloadavg()[0], params=params)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", default=os.path.join(ROOT, "build", "loom"))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--only", default="b,c")
    args = ap.parse_args()
    out = []
    for shape in SHAPES:
        if shape["id"] not in args.only.split(","):
            continue
        tokens = shape["B"] * shape["T"]
        timings = {1: [], 2: []}
        for _ in range(args.repeats):
            for ranks in (1, 2):
                timings[ranks].append(run(args.loom, shape, ranks))
        best = {r: min(t["median_s"] for t in timings[r]) for r in timings}
        tok = {r: tokens / best[r] for r in best}
        grad_bytes = 4 * timings[1][0]["params"]
        row = dict(shape=shape["id"], title=shape["title"], tokens_per_step=tokens, params=timings[1][0]["params"],
                   tok_per_s_1=round(tok[1]), tok_per_s_2=round(tok[2]), efficiency=tok[2] / (2 * tok[1]),
                   bytes_sent_per_rank_per_step=grad_bytes,  # (N-1)/N twice, N = 2
                   timings=timings)
        out.append(row)
        print(f"({shape['id']}) {shape['title']}: 1 rank {tok[1]:,.0f} tok/s, 2 ranks {tok[2]:,.0f} tok/s, "
              f"efficiency {100 * row['efficiency']:.1f} %, {grad_bytes / 2**20:.1f} MiB sent per rank and step; "
              f"load {min(t['load_before'] for r in timings for t in timings[r]):.1f}-"
              f"{max(t['load_after'] for r in timings for t in timings[r]):.1f}", flush=True)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "scaling.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
