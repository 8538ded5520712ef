#!/usr/bin/env python3
"""Measured peak memory of training runs next to loom's plan (docs/memory-study-notes.md).

For each configuration below it runs, under /usr/bin/time -v (maximum resident set size):

  * `loom params CONFIG OVERRIDES`: the process's baseline (binary, libraries, config, the model
    graph; no device memory);
  * `loom train CONFIG OVERRIDES train.steps=2 ...` (no evaluation, checkpoints or sample): the run;

and reads `loom memory CONFIG OVERRIDES --json` for the plan. It prints a markdown table of plan
total, measured net peak (run minus baseline) and their ratio, checks the target (net peak within
3 % + 24 MB of the plan), and writes bench/results/memory_rss.json.

    python3 bench/memory_rss.py                 # after building loom (build/loom)
    python3 bench/memory_rss.py --loom /path/to/loom --only shakespeare

Standard library only. Each run takes a few seconds to a minute; the GPT-2 rows need about 2 GB.
"""
import argparse
import datetime
import json
import pathlib
import re
import subprocess
import sys

from host import describe

ROOT = pathlib.Path(__file__).resolve().parent.parent
MB = 1e6
TARGET_RATIO, TARGET_SLACK = 0.03, 24 * MB

# Random tokens instead of the prepared Shakespeare files, so nothing needs `loom prepare`.
SHAKESPEARE = ["data.kind=random_tokens", "data.vocab_size=65"]
TUTORIAL = ["model.num_layers=4", "data.batch_size=4", "optimizer.num_minibatches=2"]
GPT2_SMALL = ["model.num_layers=1", "data.batch_size=2", "optimizer.num_minibatches=2"]
# GPT-2's shape reduced to a 2-core host (docs/memory-study-notes.md, "What remains outside the plan").
GPT2_2L = ["model.num_layers=2", "data.batch_size=4", "data.seq_len=128", "optimizer.num_minibatches=1",
           "model.dtype=float32", "model.dropout_rate=0", "threads=2"]
# (name, config, overrides)
RUNS = [
    ("shakespeare_char f32", "configs/shakespeare_char.toml", SHAKESPEARE + ["model.dtype=float32"]),
    ("shakespeare_char bf16", "configs/shakespeare_char.toml", SHAKESPEARE + ["model.dtype=bfloat16"]),
    ("tutorial 4 layers, batch 4 in 2, f32, remat none", "configs/tutorial_transformer.toml",
     TUTORIAL + ["model.dtype=float32", "model.remat=none"]),
    ("tutorial 4 layers, batch 4 in 2, bf16, remat none", "configs/tutorial_transformer.toml",
     TUTORIAL + ["model.dtype=bfloat16", "model.remat=none"]),
    ("tutorial 4 layers, batch 4 in 2, bf16, remat MLP,Attn", "configs/tutorial_transformer.toml",
     TUTORIAL + ["model.dtype=bfloat16", "model.remat=MLP,Attn"]),
    ("gpt2_124m 1 layer, batch 2 in 2, f32", "configs/gpt2_124m.toml", GPT2_SMALL + ["model.dtype=float32"]),
    ("gpt2_124m 1 layer, batch 2 in 2, bf16", "configs/gpt2_124m.toml", GPT2_SMALL + ["model.dtype=bfloat16"]),
    ("gpt2_124m 2 layers, batch 4 x 128, f32, threads 2, remat none", "configs/gpt2_124m.toml",
     GPT2_2L + ["model.remat=none"]),
    ("gpt2_124m 2 layers, batch 4 x 128, f32, threads 2, remat MLP / dots_saveable", "configs/gpt2_124m.toml",
     GPT2_2L + ["model.remat=MLP", "model.remat_policy=dots_saveable"]),
    ("gpt2_124m 2 layers, batch 4 x 128, f32, threads 2, remat Block / nothing_saveable", "configs/gpt2_124m.toml",
     GPT2_2L + ["model.remat=Block", "model.remat_policy=nothing_saveable"]),
]
TRAIN = ["train.steps=2", "train.eval_interval=0", "train.sample_tokens=0", "train.log_every=1"]


def measured_run(cmd):
    """Runs cmd under /usr/bin/time -v; returns its maximum resident set size in bytes and its stdout."""
    p = subprocess.run(["/usr/bin/time", "-v", *cmd], cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    return int(m.group(1)) * 1024, p.stdout


def max_rss_bytes(cmd):
    """Runs cmd under /usr/bin/time -v; returns its maximum resident set size in bytes."""
    return measured_run(cmd)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loom", default=str(ROOT / "build" / "loom"))
    ap.add_argument("--only", default="", help="run only the rows whose name contains this")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "memory_rss.json"))
    a = ap.parse_args()
    rows = []
    print("| run | command | plan total | workspace (largest) | library | measured net peak | net − plan | net / plan "
          "| target |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, config, ov in RUNS:
        if a.only not in name:
            continue
        # The runs below do not evaluate (TRAIN), so neither does the plan.
        plan = json.loads(subprocess.run([a.loom, "memory", config, *ov, "train.eval_interval=0", "--json"],
                                         cwd=ROOT, check=True, capture_output=True, text=True).stdout)
        base = max_rss_bytes([a.loom, "params", config, *ov])
        run = max_rss_bytes([a.loom, "train", config, *ov, *TRAIN])
        net, total = run - base, plan["total_bytes"]
        ok = abs(net - total) <= TARGET_RATIO * total + TARGET_SLACK
        row = {"name": name, "config": config, "overrides": ov, "train_overrides": TRAIN,
               "plan_total_bytes": total, "plan_workspace_bytes": plan["workspace_bytes"],
               # absent from the plans of binaries older than the planned workspace (--loom to compare)
               "plan_max_workspace_bytes": plan.get("max_workspace_bytes", 0),
               "workspace_threads": plan.get("workspace_threads", 0),
               # sgemm's packing buffers; absent from the plans of binaries older than the library row
               "plan_library_bytes": plan.get("library_bytes", 0),
               "baseline_rss_bytes": base, "train_rss_bytes": run, "net_peak_bytes": net,
               "net_over_plan": net / total, "within_target": ok}
        rows.append(row)
        print(f"| {name} | `loom train {config} {' '.join(ov)}` | {total / MB:.1f} MB | "
              f"{row['plan_max_workspace_bytes'] / MB:.1f} MB | {row['plan_library_bytes'] / MB:.1f} MB | "
              f"{net / MB:.1f} MB | {(net - total) / MB:+.1f} MB | {net / total:.3f} | "
              f"{'yes' if ok else 'NO'} |", flush=True)
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": datetime.datetime.now().isoformat(timespec="seconds"), "host": describe(), "loom": a.loom,
                               "target": "net peak within 3 % + 24 MB of the plan total", "rows": rows},
                              indent=1) + "\n")
    print(f"\nwrote {out}")
    return 0 if all(r["within_target"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
