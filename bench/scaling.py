#!/usr/bin/env python3
"""loom's data-parallel scaling on one machine next to PyTorch DDP: tokens/s at 1 and 2 ranks, 1 thread each.

For shapes (b) and (c) of docs/performance.md (bench/bench.py's SHAPES, same overrides and step
counts), each round (--repeats) runs, interleaved, in this order:
  loom 1 rank:   loom train CONFIG OVERRIDES threads=1 --steps N --log-every 1 train.metrics_file=... --out TMP
  loom 2 ranks:  mpirun --oversubscribe --allow-run-as-root -np 2 <the same>
  DDP 1 rank:    TORCH_PYTHON bench/peers/torch_ddp.py --ranks 1 --threads 1 <the shape>
  DDP 2 ranks:   the same with --ranks 2
(torch_ddp.py: torch_gpt.py's nanoGPT model and AdamW/clip step under DistributedDataParallel,
gloo, the global batch split over the ranks as loom splits it). Each run's time is the median step
time after warm-up (rank 0's, as loom's metrics file holds it); the best median over the rounds gives
tokens/s (global batch x seq_len / step time) and the 2-rank scaling efficiency (tok/s at 2 /
(2 x tok/s at 1)) of each. The verdicts are issue 14 point 8's: loom's 2-rank tok/s >= 1.5x DDP's
at (b) and >= 1.25x at (c), and loom's 2-rank efficiency >= 90 %. Also stored: the bytes each
loom rank sends per step (the gradient sum: an all-to-all of (N-1)/N of the gradients, then an
all-gather of the same amount), and with each run the load average before and after it and the
other processes' CPU use while it ran, in cores: on a busy machine the numbers mean little.

Every process runs in bench.py's --isa environment (native: no BLAS/ISA variables from the caller;
avx2: every library capped to AVX2, loom from bench/build/loom-avx2), PyTorch with
OMP_WAIT_POLICY=PASSIVE as in bench.py.

  python3 bench/scaling.py --torch-python PY [--loom build/loom] [--repeats 2] [--only b,c] [--isa native]
                          [--steps N]
  bash bench/scaling.sh [the same flags]      (finds or makes the PyTorch venv, then runs this)

Writes bench/results/scaling.json and prints a markdown table.

--suite zero3 (issue 29 point 7) runs, at 2 ranks only, for shapes (b), (c) and (g) (GPT-2 124M's
width and vocabulary at batch 4 x 64, as bench.py's shape a, with 6 of its 12 layers), interleaved
per round:
  loom params:       mpirun -np 2 loom train ... optimizer.shard=params   (ZeRO-3)
  loom state+grads:  the same with optimizer.shard=state+grads             (ZeRO-2)
  FSDP2:             TORCH_PYTHON bench/peers/torch_fsdp2.py --ranks 2 <the shape>
(torch_fsdp2.py: the DDP peer's model, batch split and timing, sharded with fully_shard per block
and at the root, gloo). The verdicts: loom params' tok/s >= 1.3x FSDP2's and >= 90 % of loom
state+grads'. Writes bench/results/scaling_zero3.json. --quick (either suite): one round of 2 timed
steps per run, written beside the full results as *_quick.json: a check that everything runs.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from host import describe  # noqa: E402
from bench import MODES, SHAPES, env_note, mode_env, peer_env, timed_run  # noqa: E402

# Issue 14 point 8: loom's 2-rank tokens/s over PyTorch DDP's, per shape, and loom's 2-rank efficiency.
DDP_TARGETS = {"b": 1.5, "c": 1.25}
EFFICIENCY_TARGET = 0.9
IMPLS = ("loom", "ddp")
RANKS = (1, 2)
# Issue 29 point 7: at 2 ranks, loom's optimizer.shard = params over FSDP2 and over loom's own state+grads.
ZERO3_SHAPES = ("b", "c", "g")
ZERO3_IMPLS = ("loom-params", "loom-state+grads", "fsdp2")
FSDP2_TARGET = 1.3
OWN_TARGET = 0.9


def loom_run(args, shape, ranks, td, extra=()):
    """The loom command of one run (with the overrides `extra`) and how to read its step times (from
    its metrics file)."""
    mfile = os.path.join(td, "metrics.jsonl")
    # A run directory of its own: a second run into the config's default one would be refused.
    cmd = [args.loom, "train", shape["config"], *shape["overrides"], *extra, "threads=1",
           "--steps", str(shape["warmup"] + shape["steps"]), "--log-every", "1", f"train.metrics_file={mfile}",
           "--out", os.path.join(td, "run")]
    if ranks > 1:
        cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(ranks), *cmd]

    def parse(stdout):
        rows = sorted((json.loads(l) for l in open(mfile) if l.strip()), key=lambda r: r["step"])
        return [r["step_time_s"] for r in rows], int(stdout.split(" parameters")[0].split()[-1])

    return cmd, mode_env(args.isa), parse


def peer_run(args, shape, ranks, td, script="torch_ddp.py"):
    """The command of one run of a PyTorch peer (bench.py's PyTorch flags for the shape) and its parser."""
    flags = {"--n-layer": shape["L"], "--n-head": shape["H"], "--n-embd": shape["C"], "--vocab": shape["V"],
             "--block": shape["max_seq"], "--batch": shape["B"], "--seq": shape["T"], "--steps": shape["steps"],
             "--warmup": shape["warmup"], "--beta1": shape["betas"][0], "--beta2": shape["betas"][1],
             "--weight-decay": 0.1, "--grad-clip": 1.0, "--threads": 1, "--ranks": ranks}
    cmd = [args.torch_python, os.path.join(HERE, "peers", script),
           *(s for k, v in flags.items() for s in (k, str(v)))] + (["--bias"] if shape["bias"] else [])

    def parse(stdout):
        d = json.loads(stdout.strip().splitlines()[-1])
        return d["step_time_s"], d["params"]

    return cmd, peer_env("pytorch", args.isa), parse


# How each implementation's run is made: (args, shape, ranks, temporary directory) -> (cmd, env, parse).
RUNS = {
    "loom": loom_run,
    "ddp": peer_run,
    "loom-params": lambda *a: loom_run(*a, extra=("optimizer.shard=params",)),
    "loom-state+grads": lambda *a: loom_run(*a, extra=("optimizer.shard=state+grads",)),
    "fsdp2": lambda *a: peer_run(*a, script="torch_fsdp2.py"),
}


def run(args, impl, shape, ranks):
    with tempfile.TemporaryDirectory(prefix="loom-scaling-") as td:
        cmd, env, parse = RUNS[impl](args, shape, ranks, td)
        load_before = os.getloadavg()[0]
        p, other, own, wall = timed_run(cmd, env, timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        times, params = parse(p.stdout)
    times = times[shape["warmup"]:]
    assert len(times) == shape["steps"], (impl, ranks, len(times), shape["steps"])
    return dict(impl=impl, ranks=ranks, cmd=(env_note(env) + " " + " ".join(cmd)).strip(), step_time_s=times,
                median_s=statistics.median(times), load_before=load_before, load_after=os.getloadavg()[0],
                other_cores_during=other, own_cores=own, wall_s=round(wall, 2), params=params)


def measure(args, shape):
    """Every run of a shape, interleaved (loom 1, loom 2, DDP 1, DDP 2 per round), and its summary row."""
    timings = {impl: {r: [] for r in RANKS} for impl in IMPLS}
    for rnd in range(args.repeats):
        for impl in IMPLS:
            for ranks in RANKS:
                t = run(args, impl, shape, ranks)
                timings[impl][ranks].append(t)
                print(f"   ({shape['id']}) round {rnd} {impl:4s} {ranks} rank{'s' if ranks > 1 else ' '}: "
                      f"{t['median_s'] * 1e3:8.1f} ms/step median of {len(t['step_time_s'])}; load "
                      f"{t['load_before']:.1f}-{t['load_after']:.1f}, others {t['other_cores_during']:.2f} cores",
                      flush=True)
    tokens = shape["B"] * shape["T"]
    impls = {}
    for impl in IMPLS:
        tok = {r: tokens / min(t["median_s"] for t in timings[impl][r]) for r in RANKS}
        impls[impl] = dict(tok_per_s={str(r): round(tok[r]) for r in RANKS}, efficiency=tok[2] / (2 * tok[1]),
                           params=timings[impl][1][0]["params"],
                           timings={str(r): timings[impl][r] for r in RANKS})
    loom, ddp = impls["loom"], impls["ddp"]
    ratio, target = loom["tok_per_s"]["2"] / ddp["tok_per_s"]["2"], DDP_TARGETS[shape["id"]]
    runs = [t for impl in IMPLS for r in RANKS for t in timings[impl][r]]
    return dict(shape=shape["id"], title=shape["title"], isa=args.isa, tokens_per_step=tokens, impls=impls,
                loom_vs_ddp_2_ranks=ratio, loom_vs_ddp_1_rank=loom["tok_per_s"]["1"] / ddp["tok_per_s"]["1"],
                target_vs_ddp=target, target_efficiency=EFFICIENCY_TARGET,
                meets_vs_ddp=ratio >= target, meets_efficiency=loom["efficiency"] >= EFFICIENCY_TARGET,
                bytes_sent_per_rank_per_step=4 * loom["params"],  # (N-1)/N twice, N = 2
                load_min=min(t["load_before"] for t in runs), load_max=max(t["load_after"] for t in runs),
                other_cores_max=max(t["other_cores_during"] for t in runs))


def table(rows):
    yes = {True: "yes", False: "**no**"}
    out = ["| shape | loom 1 rank | loom 2 ranks | loom eff. | DDP 1 rank | DDP 2 ranks | DDP eff. | "
           "loom/DDP 2 ranks (target) | loom eff. >= 90 % | load | others (cores) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        loom, ddp = r["impls"]["loom"], r["impls"]["ddp"]
        out.append(f"| ({r['shape']}) {r['title']} | {loom['tok_per_s']['1']:,} | {loom['tok_per_s']['2']:,} | "
                   f"{100 * loom['efficiency']:.0f} % | {ddp['tok_per_s']['1']:,} | {ddp['tok_per_s']['2']:,} | "
                   f"{100 * ddp['efficiency']:.0f} % | {r['loom_vs_ddp_2_ranks']:.2f}x (>= {r['target_vs_ddp']}): "
                   f"{yes[r['meets_vs_ddp']]} | {yes[r['meets_efficiency']]} | "
                   f"{r['load_min']:.1f}-{r['load_max']:.1f} | <= {r['other_cores_max']:.2f} |")
    return "\n".join(out)


def measure_zero3(args, shape):
    """A shape's 2-rank runs, interleaved (loom params, loom state+grads, FSDP2 per round), and its row."""
    timings = {impl: [] for impl in ZERO3_IMPLS}
    for rnd in range(args.repeats):
        for impl in ZERO3_IMPLS:
            t = run(args, impl, shape, 2)
            timings[impl].append(t)
            print(f"   ({shape['id']}) round {rnd} {impl:16s}: {t['median_s'] * 1e3:8.1f} ms/step median of "
                  f"{len(t['step_time_s'])}; load {t['load_before']:.1f}-{t['load_after']:.1f}, others "
                  f"{t['other_cores_during']:.2f} cores", flush=True)
    tokens = shape["B"] * shape["T"]
    tok = {impl: tokens / min(t["median_s"] for t in timings[impl]) for impl in ZERO3_IMPLS}
    vs_fsdp2, vs_own = tok["loom-params"] / tok["fsdp2"], tok["loom-params"] / tok["loom-state+grads"]
    # Per round too: how often each verdict holds when the runs are next to each other in time.
    rounds = [dict(vs_fsdp2=timings["fsdp2"][r]["median_s"] / timings["loom-params"][r]["median_s"],
                   vs_own=timings["loom-state+grads"][r]["median_s"] / timings["loom-params"][r]["median_s"])
              for r in range(args.repeats)]
    runs = [t for impl in ZERO3_IMPLS for t in timings[impl]]
    return dict(shape=shape["id"], title=shape["title"], isa=args.isa, ranks=2, tokens_per_step=tokens,
                tok_per_s={impl: round(tok[impl]) for impl in ZERO3_IMPLS}, timings=timings,
                params={impl: timings[impl][0]["params"] for impl in ZERO3_IMPLS},
                params_vs_fsdp2=vs_fsdp2, params_vs_state_grads=vs_own, rounds=rounds,
                target_vs_fsdp2=FSDP2_TARGET, target_vs_state_grads=OWN_TARGET,
                meets_vs_fsdp2=vs_fsdp2 >= FSDP2_TARGET, meets_vs_state_grads=vs_own >= OWN_TARGET,
                load_min=min(t["load_before"] for t in runs), load_max=max(t["load_after"] for t in runs),
                other_cores_max=max(t["other_cores_during"] for t in runs))


def table_zero3(rows):
    yes = {True: "yes", False: "**no**"}
    out = ["| shape | loom params | loom state+grads | FSDP2 | params/FSDP2 (>= 1.3x) | params/state+grads "
           "(>= 90 %) | per round | load | others (cores) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["tok_per_s"]
        per_round = "; ".join(f"{x['vs_fsdp2']:.2f}x, {100 * x['vs_own']:.0f} %" for x in r["rounds"])
        out.append(f"| ({r['shape']}) {r['title']} | {t['loom-params']:,} | {t['loom-state+grads']:,} | "
                   f"{t['fsdp2']:,} | {r['params_vs_fsdp2']:.2f}x: {yes[r['meets_vs_fsdp2']]} | "
                   f"{100 * r['params_vs_state_grads']:.0f} %: {yes[r['meets_vs_state_grads']]} | {per_round} | "
                   f"{r['load_min']:.1f}-{r['load_max']:.1f} | <= {r['other_cores_max']:.2f} |")
    return "\n".join(out)


def shapes_of(ids):
    """bench.py's float32 shapes with these ids (the PyTorch peers run float32), plus (g) for the ZeRO-3
    suite: shape a's GPT-2 124M (width 768, vocabulary 50257, batch 4 x 64) with 6 of its 12 layers, so
    that FSDP2's run of 12 steps takes under a minute here, without evaluation or samples."""
    by_id = {s["id"]: s for s in SHAPES if s.get("dtype") == "float32"}
    a = by_id["a"]
    by_id["g"] = dict(a, id="g", L=6, title="GPT-2 124M's width and vocabulary, 6 layers, batch 4 x 64",
                      overrides=a["overrides"] + ["model.num_layers=6", "train.eval_interval=0",
                                                  "train.sample_tokens=0"])
    return [by_id[i] for i in ids]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", help="loom binary (default: build/loom, bench/build/loom-avx2/loom with --isa avx2)")
    ap.add_argument("--torch-python", default=os.environ.get("TORCH_PYTHON") or
                    os.path.join(ROOT, ".venv-bench", "bin", "python"),
                    help="python with torch (gloo) and numpy (default: $TORCH_PYTHON, else .venv-bench/bin/python)")
    ap.add_argument("--isa", default="native", choices=MODES, help="bench.py's ISA mode of every process")
    ap.add_argument("--repeats", type=int, default=2, help="rounds of the four runs per shape")
    ap.add_argument("--only", default="", help="comma-separated shape ids: among b,c (ddp) or b,c,g (zero3); "
                    "default all")
    ap.add_argument("--steps", type=int, help="timed steps per run (default: the shape's; fewer to check the bench)")
    ap.add_argument("--suite", default="ddp", choices=("ddp", "zero3"),
                    help="ddp: loom and DDP at 1 and 2 ranks; zero3: loom params, state+grads and FSDP2 at 2")
    ap.add_argument("--quick", action="store_true", help="one round of 2 timed steps per run (a smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.steps = 1, 2
    args.loom = args.loom or (os.path.join(ROOT, "build", "loom") if args.isa == "native"
                              else os.path.join(HERE, "build", "loom-avx2", "loom"))
    known = ZERO3_SHAPES if args.suite == "zero3" else tuple(DDP_TARGETS)
    only = args.only.split(",") if args.only else list(known)
    if not set(only) <= set(known):
        sys.exit(f"scaling.py: --only {args.only}: the shapes of --suite {args.suite} are {','.join(known)}")
    if not os.access(args.loom, os.X_OK):
        sys.exit(f"scaling.py: {args.loom} missing: build it (scripts/build.sh, or bench/build_loom_avx2.sh for "
                 f"--isa avx2) or give --loom")
    if not os.access(args.torch_python, os.X_OK):
        sys.exit(f"scaling.py: --torch-python {args.torch_python} missing: give a python with torch and numpy "
                 f"(or $TORCH_PYTHON), or run bench/scaling.sh, which makes .venv-bench")
    measure_one, format_rows = (measure_zero3, table_zero3) if args.suite == "zero3" else (measure, table)
    rows = [measure_one(args, dict(shape, steps=args.steps or shape["steps"])) for shape in shapes_of(only)]
    print(format_rows(rows), flush=True)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    name = ("scaling_zero3" if args.suite == "zero3" else "scaling") + ("_quick" if args.quick else "")
    with open(os.path.join(HERE, "results", name + ".json"), "w") as f:
        json.dump(dict(host=describe(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
