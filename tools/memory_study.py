#!/usr/bin/env python3
"""Reproduces the Part 1.2 tutorial's memory study with `loom memory` and writes
docs/memory-study.md. Without --measure it runs nothing but the planner (milliseconds per row).

    python3 tools/memory_study.py            # after scripts/build.sh; writes docs/memory-study.md
    nice -n 10 python3 tools/memory_study.py --measure   # also trains each row's --fit choice (minutes a row)
    nice -n 10 python3 tools/memory_study.py --measure --only "Llama 3.2 1B"   # only those rows

--measure trains one step of each row's `--fit` choice under /usr/bin/time -v (bench/memory_rss.py's
measurement: peak RSS net of `loom params`) and stores it in bench/results/memory_study.json: for the
tutorial's rows on one minibatch of the chosen size, for the Llama shapes (24 GiB budget) whole. The
tables show the stored peaks whose choice and plan are still the planner's. Full fine-tuning runs only
where the memory available covers its plan and 1 GiB more. Standard library only."""
import argparse
import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from memory_rss import TRAIN, measured_run  # noqa: E402

LOOM = ROOT / "build" / "loom"
CONFIG = "configs/tutorial_transformer.toml"
MEASURED = ROOT / "bench" / "results" / "memory_study.json"
GIB = 1024 ** 3
FIT_SHARE = 0.7  # issue 32: every row fits 0.7x the tutorial's XLA peak by model.remat = auto's choice

# (tutorial configuration, tutorial's XLA figure in GB, loom overrides, extra loom flags)
ROWS = [
    ("float32, no remat, batch 64 in 4 minibatches", 20.6, ["model.dtype=float32", "model.remat=none"], []),
    ("bfloat16, no remat, scan", 14.6, ["model.remat=none", "model.scan_layers=true"], []),
    ("bfloat16, no remat, no scan", 8.8, ["model.remat=none", "model.scan_layers=false"], []),
    ("bfloat16, remat MLP+Attn", 3.9, [], []),
    ("bfloat16, remat Block", 3.8, ["model.remat=Block"], []),
    ("bfloat16, remat MLP+Attn, 1 minibatch of 64", 6.2, ["optimizer.num_minibatches=1"], []),
    ("bfloat16, remat MLP+Attn, 1 minibatch of 256", 15.0,
     ["optimizer.num_minibatches=1", "data.batch_size=256"], []),
]
# The largest Llama-family shape that fits this machine (issue 32): bench/qlora_llama8b.toml (Llama 3.1 8B
# dimensions, rank-16 adapters on every linear layer) at other dimensions and modes, one sequence of 1024.
LLAMA_CONFIG = "bench/qlora_llama8b.toml"
LLAMA_BUDGET = "24GiB"
LLAMA_COMMON = ["model.max_seq_len=1024", "data.seq_len=1024", "model.remat=auto", "model.head_chunk=auto",
                f"train.memory_budget={LLAMA_BUDGET}", "train.eval_interval=0"]
LLAMA_SHAPES = [
    ("Llama 3.2 1B", ["model.hidden_size=2048", "model.num_layers=16", "model.head_dim=64",
                      "model.num_kv_heads=8", "model.intermediate_size=8192", "model.tie_embeddings=true"]),
    ("Llama 3.2 3B", ["model.hidden_size=3072", "model.num_layers=28", "model.head_dim=128",
                      "model.num_kv_heads=8", "model.intermediate_size=8192", "model.tie_embeddings=true"]),
    ("Llama 3.1 8B", []),
]
LLAMA_MODES = [("full fine-tuning", ["lora.rank=0"]), ("LoRA (bf16 base)", ["lora.base_dtype=bfloat16"]),
               ("QLoRA (nf4 base)", ["lora.base_dtype=nf4"])]
LLAMA_ROWS = [(f"{shape}, {mode}", [*dims, *mode_ov, *LLAMA_COMMON])
              for shape, dims in LLAMA_SHAPES for mode, mode_ov in LLAMA_MODES]
# Techniques loom adds, shown by switching them off.
TECHNIQUES = [
    ("bfloat16, remat MLP+Attn, without in-place buffer reuse", ["--no-inplace"], []),
    ("bfloat16, no remat, without in-place buffer reuse", ["--no-inplace"], ["model.remat=none"]),
]


def plan(overrides, flags=(), config=CONFIG):
    out = subprocess.run([str(LOOM), "memory", config, *overrides, *flags, "--json"], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def llama_plan(overrides):
    """The plan of model.remat = auto at LLAMA_BUDGET, or None and loom's error where nothing fits."""
    p = subprocess.run([str(LOOM), "memory", LLAMA_CONFIG, *overrides, "--json"], cwd=ROOT,
                       capture_output=True, text=True)
    if p.returncode != 0:  # "loom: error: train.memory_budget: no choice fits ...: the smallest plan is ..."
        return None, p.stderr.strip().splitlines()[0].split(": ", 3)[-1]
    return json.loads(p.stdout), ""


def host():
    """The CPU (lscpu's model name) and which of the flags that decide bfloat16's speed it has."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = re.search(r"Model name:\s*(.*)", lscpu).group(1).strip()
    flags = re.search(r"Flags:\s*(.*)", lscpu).group(1).split()
    wanted = ("avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")
    have = " ".join(f for f in wanted if f in flags)
    lacks = " ".join(f for f in wanted if f not in flags)
    return f"{model}, {len(os.sched_getaffinity(0))} cores, {have or 'no AVX-512'}{f', no {lacks}' if lacks else ''}"


def meminfo_bytes(key):
    return int(re.search(key + r":\s*(\d+) kB", pathlib.Path("/proc/meminfo").read_text()).group(1)) * 1024


def available_bytes():
    return meminfo_bytes("MemAvailable")


def train_measured(config, overrides):
    """One training step (bench/memory_rss.py's TRAIN, one step): peak RSS net of `loom params`, step time."""
    base, _ = measured_run([str(LOOM), "params", config, *overrides])
    rss, out = measured_run([str(LOOM), "train", config, *overrides, *TRAIN, "train.steps=1"])
    return {"baseline_rss_bytes": base, "train_rss_bytes": rss, "net_peak_bytes": rss - base,
            "step_ms": float(re.search(r"([\d.]+) ms/step\n", out).group(1)),
            "train_overrides": [*TRAIN, "train.steps=1"], "host": host(),
            "load": pathlib.Path("/proc/loadavg").read_text().split()[:3],
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


def measure_llama(name, overrides):
    r, why = llama_plan(overrides)
    if r is None:
        print(f"{name}: does not fit ({why})")
        return None
    f = r["remat_auto"]
    row = {"name": name, "overrides": overrides, "layers": f["layers"], "num_minibatches": f["num_minibatches"],
           "head_chunk": f["head_chunk"], "row_plan_total_bytes": r["total_bytes"],
           "plan_total_bytes": r["total_bytes"]}
    if "lora.rank=0" in overrides and available_bytes() < r["total_bytes"] + GIB:
        row["skipped"] = (f"not run: {gib(available_bytes())} GiB available beside other processes on "
                          f"{datetime.date.today()}, short of the plan + 1 GiB")
        print(f"{name}: {row['skipped']}")
        return row
    return {**row, **train_measured(LLAMA_CONFIG, overrides)}


def fit_budget(xla_gb):
    return int(FIT_SHARE * xla_gb * 1e9)


def fit(overrides, xla_gb):
    """model.remat = auto's choice (layers, minibatches from the row's up, head) for 0.7x the tutorial's figure."""
    budget = fit_budget(xla_gb)
    r = plan([*overrides, "model.remat=auto", "model.head_chunk=auto"],
             ["--budget", str(budget)])
    assert r["total_bytes"] <= budget, (overrides, r["total_bytes"], budget)
    return r["remat_auto"]


def global_batch(overrides):
    batch = tomllib.loads((ROOT / CONFIG).read_text())["data"]["batch_size"]
    for o in overrides:
        if o.startswith("data.batch_size="):
            batch = int(o.split("=", 1)[1])
    return batch


def measure(name, overrides, xla_gb, f):
    """Peak RSS (net of `loom params`) and time of one training step of the row's --fit choice f, run on
    one minibatch of the chosen size: its plan is the row's (the same arena and float32 state; only the
    host batch differs), at 1/f["num_minibatches"] of the row's step time."""
    minibatch = global_batch(overrides) // f["num_minibatches"]
    ov = [*overrides, f"data.batch_size={minibatch}", "optimizer.num_minibatches=1", "model.remat=auto",
          "model.head_chunk=auto", f"train.memory_budget={fit_budget(xla_gb)}", "train.eval_interval=0"]
    r = plan(ov)
    chosen = r["remat_auto"]
    # One minibatch of the chosen size may choose other layers: of the same recomputed share to 1e-4 (the
    # norms' few FLOPs apart), or of less, where the row's plan is larger by what accumulating over
    # minibatches holds (a wider weight-gradient workspace, and the arena's placement around it) and the
    # budget leaves one minibatch more room. The cell then names the choice that ran and its share.
    assert chosen["head_chunk"] == f["head_chunk"], (name, chosen, f)
    return {"name": name, "overrides": ov, "layers": f["layers"], "measured_layers": chosen["layers"],
            "measured_recompute_share": chosen["recompute_flops"] / chosen["step_flops"],
            "num_minibatches": f["num_minibatches"],
            "head_chunk": f["head_chunk"], "row_plan_total_bytes": f["total_bytes"],
            "plan_total_bytes": r["total_bytes"], **train_measured(CONFIG, ov)}


def stored_measurements():
    return json.loads(MEASURED.read_text()) if MEASURED.exists() else {}


def measured_hosts(names):
    """The hosts and the range of 1-minute loads the stored measurements of `names` ran at."""
    ms = [m for name, m in stored_measurements().items() if name in names and "skipped" not in m]
    if not ms:
        return "nothing yet"
    loads = sorted(float(m["load"][0]) for m in ms)
    return f"{'; '.join(sorted({m['host'] for m in ms}))} (1-minute load {loads[0]:.1f}–{loads[-1]:.1f})"


def max_plan_gap(names):
    """The largest difference between a row's plan and the plan of what --measure ran for it."""
    ms = [m for name, m in stored_measurements().items() if name in names and "skipped" not in m]
    return max((abs(m["row_plan_total_bytes"] - m["plan_total_bytes"]) for m in ms), default=0)


def measured_peak(name, f):
    """The stored measurement of row `name` if it ran the choice f and f's plan is unchanged."""
    m = stored_measurements().get(name)
    if not m or (m["layers"], m["num_minibatches"], m["head_chunk"], m["row_plan_total_bytes"]) != (
            f["layers"], f["num_minibatches"], f["head_chunk"], f["total_bytes"]):
        return None
    return m


def measured_cell(m):
    if not m:
        return "not measured"
    ran = m.get("measured_layers", m["layers"])
    share = m.get("measured_recompute_share")
    return (f"{gib(m['net_peak_bytes'])} GiB, {m['net_peak_bytes'] / m['plan_total_bytes']:.3f}× its plan "
            f"({gib(m['plan_total_bytes'])} GiB)" +
            (f"; ran {ran}" + (f", +{100 * share:.1f}% FLOPs" if share is not None else ", the same recompute to 1e-4")
             if ran != m["layers"] else ""))


def head(chunk):
    return "plain" if chunk == 0 else f"{chunk} columns"


def gib(b):
    return f"{b / GIB:.2f}"


def llama_table(w):
    """Issue 32's "largest model that fits": every Llama shape and mode at LLAMA_BUDGET."""
    w(f"## The largest Llama-family model that fits {LLAMA_BUDGET}")
    w("")
    w(f"`loom memory {LLAMA_CONFIG} SHAPE MODE {' '.join(LLAMA_COMMON)} --json` (Llama 3.1 8B's config at "
      "Llama 3.2 1B's and 3B's dimensions; bfloat16 compute, random tokens, one sequence of 1024, AdamW; LoRA "
      "rank 16 on every linear layer, full fine-tuning `lora.rank=0`): model.remat = auto's least-recompute "
      f"choice within {LLAMA_BUDGET}, this machine's memory. Measured (`--measure`): one training step under "
      "`/usr/bin/time -v`, peak RSS net of `loom params`, and that step's time (the base is drawn from the "
      "seed before it; not in the step time).")
    w("")
    w(f"Host: {measured_hosts([r[0] for r in LLAMA_ROWS])}.")
    w("")
    w("| shape | mode | parameters | `--fit` choice | planned | measured peak | step time | load (1, 5, 15 min) |")
    w("|---|---|---|---|---|---|---|---|")
    largest = {}
    for name, ov in LLAMA_ROWS:
        shape, mode = name.split(", ", 1)
        r, why = llama_plan(ov)
        if r is not None:
            largest[mode] = shape  # LLAMA_SHAPES grow
        if r is None:
            w(f"| {shape} | {mode} | | does not fit: {why.replace('|', '/')} | | | | |")
            continue
        f = r["remat_auto"]
        m = measured_peak(name, f)
        if m and "skipped" in m:
            got, step, where = m["skipped"], "", ""
        elif m:
            got = f"{gib(m['net_peak_bytes'])} GiB ({m['net_peak_bytes'] / r['total_bytes']:.3f}×)"
            step = f"{m['step_ms'] / 1e3:.0f} s"
            where = f"load {' '.join(m['load'])}"
        elif "8B" in shape and "QLoRA" in mode:
            got, step, where = "10.70 GiB of 10.66 planned at 512 tokens, remat Block (below)", "523 s", "below"
        else:
            got, step, where = "not measured", "", ""
        w(f"| {shape} | {mode} | {r['num_params'] / 1e9:.2f}B | {f['layers']} in {f['num_minibatches']}, "
          f"head {head(f['head_chunk'])}, +{100 * f['recompute_flops'] / f['step_flops']:.1f}% FLOPs | "
          f"{gib(r['total_bytes'])} GiB | {got} | {step} | {where} |")
    w("")
    w(f"Largest shape whose plan fits {LLAMA_BUDGET}: " +
      "; ".join(f"{mode}: {largest.get(mode, 'none')}" for mode, _ in LLAMA_MODES) + f". {LLAMA_BUDGET} is "
      f"the machine's nominal memory; its kernel reports {gib(meminfo_bytes('MemTotal'))} GiB in all, so a "
      "plan within a GiB of the budget fits on paper only, and a run needs the memory other processes leave.")
    w("")


def main():
    global LOOM
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loom", default=str(LOOM))
    ap.add_argument("--measure", action="store_true", help="train each row's --fit choice (see above)")
    ap.add_argument("--only", default="", help="with --measure: only the rows whose name contains this")
    a = ap.parse_args()
    LOOM = pathlib.Path(a.loom).resolve()
    if not LOOM.exists():
        sys.exit("build loom first: bash scripts/build.sh")
    if a.measure:
        stored = stored_measurements()
        todo = [(name, lambda name=name, ov=ov, xla_gb=xla_gb: measure(name, ov, xla_gb, fit(ov, xla_gb)))
                for name, xla_gb, ov, _ in ROWS]
        # The 8B rows only when --only names them: a step takes many minutes.
        todo += [(name, lambda name=name, ov=ov: measure_llama(name, ov)) for name, ov in LLAMA_ROWS
                 if "8B" not in name or "8B" in a.only]
        for name, run in todo:
            if a.only not in name or not (m := run()):
                continue
            stored[name] = m
            if "skipped" not in m:
                print(f"{name}: plan {gib(m['plan_total_bytes'])} GiB, measured net peak "
                      f"{gib(m['net_peak_bytes'])} GiB, {m['step_ms'] / 1e3:.0f} s", flush=True)
            MEASURED.parent.mkdir(parents=True, exist_ok=True)
            MEASURED.write_text(json.dumps(stored, indent=1) + "\n")
    lines = []
    w = lines.append
    w("# The tutorial's memory study, planned by loom")
    w("")
    w(f"Generated by `python3 tools/memory_study.py` on {datetime.date.today()} (loom's plan of "
      f"`{CONFIG}`, the tutorial's 155,877,376-parameter Transformer; each row is "
      "`loom memory CONFIG OVERRIDES --json`; only the measured columns come from training runs, "
      "`--measure`). The tutorial measured peak GPU memory with XLA's memory "
      "viewer on a 24 GB A5000; loom's total is what its plan allocates on the device: parameters, "
      "gradients, Adam moments (all float32), the activation arena, the minibatch inputs and kernel "
      "workspace.")
    w("")
    w("| tutorial configuration | tutorial (XLA, A5000) | loom total | loom / tutorial | activations (arena) | "
      "live-bytes lower bound | plan time | `--fit` at 0.7× tutorial: choice | its total | its recompute | "
      "its measured peak |")
    w("|---|---|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    reports = []
    for name, xla_gb, ov, flags in ROWS:
        r = plan(ov, flags)
        reports.append((name, r))
        # The tutorial writes "GB"; take the stricter reading (10^9 bytes) for the ratio.
        ratio = r["total_bytes"] / (xla_gb * 1e9)
        worst = max(worst, ratio)
        f = fit(ov, xla_gb)
        w(f"| {name} | {xla_gb} GB | {gib(r['total_bytes'])} GiB ({r['total_bytes'] / 1e9:.2f} GB) | "
          f"{ratio:.2f} | {gib(r['activations_bytes'])} GiB | {gib(r['lower_bound_bytes'])} GiB | "
          f"{r['plan_ms']:.1f} ms | {f['layers']} in {f['num_minibatches']}, head {head(f['head_chunk'])} | "
          f"{gib(f['total_bytes'])} GiB ({f['total_bytes'] / 1e9:.2f} GB) | "
          f"+{100 * f['recompute_flops'] / f['step_flops']:.1f}% FLOPs | {measured_cell(measured_peak(name, f))} |")
    w("")
    info = open("/proc/cpuinfo").read()
    cpu = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), "?")
    isa = [f for f in ("avx512_bf16", "amx_bf16") if f in info]
    host = (f"Planned on {cpu} with {', '.join(isa)}." if isa else
            f"Planned on {cpu} without AVX512-BF16 or AMX: there the bfloat16 products widen their operands into "
            "float32 kernel workspace, which the plan counts, so the bfloat16 rows' totals are larger than on "
            "AVX512-BF16 or AMX hosts.")
    w(f"Worst ratio: **{worst:.2f}** (target: at most 0.80 on every row). {host} Ratios divide loom's bytes by "
      "the tutorial's figure read as 10^9 bytes per GB; read as GiB, every ratio is 7% lower.")
    w("")
    w("The last three columns: `loom memory CONFIG OVERRIDES model.remat=auto model.head_chunk=auto "
      "--budget B --json` with B = 0.7 × the tutorial's figure (as 10^9 bytes): the least-recompute choice "
      "of per-layer remat (layers from the first), minibatch count (the row's or more, the global batch "
      "kept) and head (plain, or fused in chunks of vocabulary columns) that the plan fits "
      "in B; its planned total and its recomputed FLOPs as a share of the step's (docs/ARCHITECTURE.md, "
      "\"Fitting a budget\").")
    w("")
    w("The last column (`--measure`): peak RSS of one training step of the chosen setting, net of `loom params` "
      "(bench/memory_rss.py), run on one minibatch of the chosen size (`data.batch_size` = the row's global "
      "batch / the chosen minibatch count, `optimizer.num_minibatches=1`, the same remat = auto and budget, "
      "which choose the same head and the same layers, or others that the cell names: of the same recomputed "
      "share to 1e-4, or of less where the row's accumulation over minibatches (a wider weight-gradient "
      "workspace, the arena placed around it) leaves the row less room in the budget than one minibatch has): "
      "the same float32 state and minibatch, so its plan (in "
      f"parentheses; without accumulation over minibatches) differs from the row's by at most "
      f"{max_plan_gap([r[0] for r in ROWS]) / 2**20:.0f} MiB, and a step takes 1/minibatches of the row's. "
      f"Measured on {measured_hosts([r[0] for r in ROWS])}.")
    w("")
    w("Fixed part of every row: params 0.58 GiB + grads 0.58 GiB + Adam moments 1.16 GiB = 2.32 GiB "
      "(float32, 155.9M parameters). The rest is the arena: the activations and, at the peak, the running "
      "kernel's workspace (planned for this machine's thread count).")
    w("")
    llama_table(w)
    w("## Techniques loom adds, shown by switching them off")
    w("")
    w("| configuration | loom total | activations |")
    w("|---|---|---|")
    for name, flags, ov in TECHNIQUES:
        r = plan(ov, flags)
        w(f"| {name} | {gib(r['total_bytes'])} GiB | {gib(r['activations_bytes'])} GiB |")
    w("")
    w("## The largest buffers")
    w("")
    for name, r in reports:
        w(f"**{name}**: peak at schedule step {r['peak_step']} of {r['num_steps']} "
          f"({r['peak_op']} at `{r['peak_scope'] or '(root)'}`); largest buffers live there:")
        w("")
        w("| scope | op | shape | dtype | MiB |")
        w("|---|---|---|---|---|")
        for b in r["largest_at_peak"][:5]:
            ws = b.get("kind") == "workspace"  # a node's kernel workspace: no shape or dtype
            w(f"| `{b['scope'] or '(root)'}` | {b['op']} | {'-' if ws else b['shape']} | "
              f"{'workspace' if ws else b['dtype']} | {b['bytes'] / 2**20:.1f} |")
        w("")
    text = "\n".join(lines) + "\n"
    notes = ROOT / "docs" / "memory-study-notes.md"
    if notes.exists():
        text += "\n" + notes.read_text()
    (ROOT / "docs" / "memory-study.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
