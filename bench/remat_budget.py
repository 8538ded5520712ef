#!/usr/bin/env python3
"""loom's `model.remat = auto` against loom's best hand choice and the peers at equal memory
(issue 32 point 4; docs/memory-study.md, "Remat at equal memory").

For each shape (the tutorial Transformer, GPT-2 124M) at a reduced size (flags) and each budget
fraction f, the budget is the no-remat plan's state (parameters, gradients, Adam moments) plus f of
the rest of its total (activations, workspace, inputs): the state is the same in every
implementation and no remat can shrink it, so f of the whole plan would leave nothing to fit at a
reduced batch. Per budget, interleaved:

  * loom auto: `loom memory ... model.remat=auto model.head_chunk=auto --budget B --json` (its
    choice, planned total, recompute share), then `loom train` with train.memory_budget=B;
  * loom's hand sweep: every model.remat region x model.remat_policy whose plan fits B, each timed
    once (the best of them is timed again beside auto, alternating, --pairs times; the ratio is the median pair's);
  * PyTorch 2.x torch.compile (nanoGPT's model, bench/peers/torch_gpt.py) with
    torch._functorch.config.activation_memory_budget lowered along a ladder until its measured
    net peak RSS fits B (each knob measured once);
  * the tutorial's JAX model (bench/peers/jax_tutorial.py) with each of its remat policies, the
    fastest that fits B.

Every run is measured under /usr/bin/time -v (bench/memory_rss.py); the net peak is the run's
maximum RSS minus a baseline process's (`loom params`, or the peer's python with its framework
imported). Step time is the median of the timed steps. Prints a markdown table and writes
bench/results/remat_budget.json.

    bash bench/remat_budget.sh --only tutorial            # makes the peers' venv, then runs this
    python3 bench/remat_budget.py --torch-python P --jax-python P [--quick]

Standard library only in this process; the peers run in their venv through the `peer` subcommand.
"""
import argparse
import contextlib
import datetime
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

SELF = str(pathlib.Path(__file__).resolve())
ROOT = pathlib.Path(SELF).parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from host import describe, summary  # noqa: E402
from memory_rss import TARGET_RATIO, TARGET_SLACK, max_rss_bytes  # noqa: E402

MB = 1e6
REGIONS = ["MLP", "Attn", "MLP,Attn", "Block"]
POLICIES = ["nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable"]  # everything_saveable = none
JAX_REMATS = ["none", "MLP", "Attn", "MLP,Attn", "Block"]
TORCH_KNOBS = [1.0, 0.5, 0.2, 0.0]  # activation_memory_budget, tried from the top until one fits

# (name, loom config, torch_gpt.py model flags, jax_tutorial.py model flags)
SHAPES = [
    ("tutorial", "configs/tutorial_transformer.toml",
     ["--n-head", "8", "--n-embd", "1024", "--vocab", "2048"],
     ["--hidden", "1024", "--head-dim", "128", "--vocab", "2048"]),
    ("gpt2_124m", "configs/gpt2_124m.toml",
     ["--n-head", "12", "--n-embd", "768", "--vocab", "50257", "--bias"],
     ["--hidden", "768", "--head-dim", "64", "--vocab", "50257"]),
]


def peer(argv):
    """`peer torch|jax|torch-baseline|jax-baseline OUT [KNOB] -- ARGS`: runs a peer in this (venv) python
    with its JSON written to OUT; for torch, KNOB is activation_memory_budget."""
    kind, out = argv[0], argv[1]
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    sys.path.insert(0, str(ROOT / "bench" / "peers"))
    if kind == "torch-baseline":
        import torch  # noqa: F401
        return 0
    if kind == "jax-baseline":
        import jax
        jax.devices()
        return 0
    if kind == "torch":
        import torch._functorch.config as fc
        fc.activation_memory_budget = float(argv[2])
        import torch_gpt as mod
        sys.argv = ["torch_gpt.py", "bench", "--compile", *rest]
    else:
        import jax_tutorial as mod
        sys.argv = ["jax_tutorial.py", *rest]
    with open(out, "w") as f, contextlib.redirect_stdout(f):
        return mod.main()


def measure(cmd, env=None):
    """(max RSS in bytes, None) or (None, error text): memory_rss's measurement, a failed run recorded."""
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        return max_rss_bytes(cmd), None
    except SystemExit as e:
        return None, str(e)[-600:]
    finally:
        os.environ.clear()
        os.environ.update(old)


class Bench:
    def __init__(self, a, shape):
        self.a = a
        self.name, self.config, self.torch_flags, self.jax_flags = shape
        self.common = [f"model.num_layers={a.layers}", f"data.batch_size={a.batch}", f"data.seq_len={a.seq}",
                       f"model.max_seq_len={a.seq}", "optimizer.num_minibatches=1", f"model.dtype={a.dtype}",
                       "model.dropout_rate=0.0", "threads=2"]
        self.tmp = tempfile.mkdtemp(prefix="remat_budget_")
        self.cache = {}
        self.env = {"OMP_WAIT_POLICY": "PASSIVE", "CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu",
                    "TORCHINDUCTOR_COMPILE_THREADS": "1"}
        self.loom_base, _ = measure([a.loom, "params", self.config, *self.common])
        self.torch_base, _ = measure([a.torch_python, SELF, "peer", "torch-baseline", "-"], self.env)
        self.jax_base, _ = measure([a.jax_python, SELF, "peer", "jax-baseline", "-"], self.env)

    def plan(self, ov, flags=()):
        p = subprocess.run([self.a.loom, "memory", self.config, *self.common, *ov, "train.eval_interval=0",
                            *flags, "--json"], cwd=ROOT, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"loom memory {' '.join(ov)} failed:\n{p.stderr[-2000:]}")
        return json.loads(p.stdout)

    def loom(self, ov):
        """Trains with overrides ov: {net_bytes, step_s} or {error}."""
        d = pathlib.Path(tempfile.mkdtemp(dir=self.tmp))
        steps = self.a.warmup + self.a.steps
        rss, err = measure([self.a.loom, "train", self.config, *self.common, *ov, f"train.steps={steps}",
                            "train.eval_interval=0", "train.sample_tokens=0", "train.log_every=1",
                            "--out", str(d / "run")])
        metrics = (d / "run" / "metrics.jsonl").read_text() if not err else ""
        shutil.rmtree(d)  # the run's checkpoint is the size of the state
        if err:
            return {"error": err}
        times = [json.loads(l)["step_time_s"] for l in metrics.splitlines()]
        return {"net_bytes": rss - self.loom_base, "step_s": statistics.median(times[self.a.warmup:])}

    def peer(self, kind, args, knob=""):
        key = (kind, knob, tuple(args))
        if key not in self.cache:
            out = os.path.join(self.tmp, f"{kind}_{len(self.cache)}.json")
            py = self.a.torch_python if kind == "torch" else self.a.jax_python
            cmd = [py, SELF, "peer", kind, out, *([str(knob)] if kind == "torch" else []), "--", *args]
            rss, err = measure(cmd, self.env)
            if err:
                self.cache[key] = {"error": err}
            else:
                r = json.loads(pathlib.Path(out).read_text())
                base = self.torch_base if kind == "torch" else self.jax_base
                self.cache[key] = {"net_bytes": rss - base, "step_s": statistics.median(r["step_time_s"][r["warmup"]:])}
            print(f"    {kind} {knob} {' '.join(args[-2:])}: {self.cache[key]}", file=sys.stderr, flush=True)
        return self.cache[key]

    def torch(self, budget):
        """The largest knob of the ladder whose net peak fits the budget, with its measurement."""
        a = self.a
        args = [*self.torch_flags, "--n-layer", str(a.layers), "--block", str(a.seq), "--batch", str(a.batch),
                "--seq", str(a.seq), "--dtype", a.dtype, "--steps", str(a.steps), "--warmup", str(a.torch_warmup),
                "--threads", "2"]
        tried = []
        for k in a.torch_knobs:
            r = self.peer("torch", args, k)
            tried.append({"knob": k, **r})
            if "net_bytes" in r and r["net_bytes"] <= budget:
                return {"knob": k, **r, "tried": tried}
        return {"knob": None, "tried": tried}

    def jax(self, budget):
        a = self.a
        rows = []
        for rm in a.jax_remats:
            args = [*self.jax_flags, "--layers", str(a.layers), "--seq", str(a.seq), "--batch", str(a.batch),
                    "--dtype", a.dtype, "--steps", str(a.steps), "--warmup", str(a.jax_warmup), "--threads", "2",
                    "--remat", rm]
            rows.append({"remat": rm, **self.peer("jax", args)})
        fits = [r for r in rows if "net_bytes" in r and r["net_bytes"] <= budget]
        best = min(fits, key=lambda r: r["step_s"]) if fits else None
        return {"best": best, "all": rows}

    def hand_combos(self):
        combos = [("none", "nothing_saveable")] + [(r, p) for r in REGIONS for p in POLICIES]
        return combos[: self.a.hand_limit] if self.a.hand_limit else combos

    def run(self):
        a = self.a
        none = self.plan(["model.remat=none"])
        state = none["params_bytes"] + none["grads_bytes"] + none["optimizer_bytes"]
        rest = none["total_bytes"] - state
        hand = {}
        for rg, pol in self.hand_combos():
            ov = [f"model.remat={rg}", f"model.remat_policy={pol}"]
            hand[(rg, pol)] = {"region": rg, "policy": pol, "overrides": ov, "plan_bytes": self.plan(ov)["total_bytes"]}
        rows = []
        for f in a.fractions:
            budget = int(state + f * rest)
            print(f"  {self.name}: budget {f:.2f} = {budget / MB:.1f} MB", file=sys.stderr, flush=True)
            row = {"shape": self.name, "fraction": f, "budget_bytes": budget,
                   "fraction_of_total": budget / none["total_bytes"]}
            auto_ov = ["model.remat=auto", "model.head_chunk=auto"]
            p = subprocess.run([a.loom, "memory", self.config, *self.common, *auto_ov, "train.eval_interval=0",
                                "--budget", str(budget), "--json"], cwd=ROOT, capture_output=True, text=True)
            if p.returncode == 0:
                ra = json.loads(p.stdout)["remat_auto"]
                row["auto"] = {"choice": ra, "plan_bytes": ra["total_bytes"],
                               "recompute_share": ra["recompute_flops"] / ra["step_flops"]}
            else:
                row["auto"] = {"error": p.stderr.strip()[-600:]}
            # The hand sweep: each fitting combination timed once (the same run serves every budget).
            for h in hand.values():
                if h["plan_bytes"] <= budget and "step_s" not in h and "error" not in h:
                    h.update(self.loom(h["overrides"]))
                    print(f"    loom {h['region']}/{h['policy']}: {h.get('step_s', h.get('error'))}",
                          file=sys.stderr, flush=True)
            fit = [h for h in hand.values() if h["plan_bytes"] <= budget and "step_s" in h]
            best = min(fit, key=lambda h: h["step_s"]) if fit else None
            row["hand_fitting"] = [{k: h[k] for k in ("region", "policy", "plan_bytes", "step_s", "net_bytes")}
                                   for h in fit]
            # Auto and the best hand choice back to back, a.pairs times, so each ratio sees the same load;
            # the order alternates (ABBA) so neither side always runs first, on a cache or a load swing
            # the other missed. The row keeps the median ratio and each side's median step.
            auto_runs, hand_runs = [], []
            for i in range(a.pairs):
                runs = []
                if "choice" in row["auto"]:
                    runs.append((auto_runs, [*auto_ov, f"train.memory_budget={budget}"]))
                if best:
                    runs.append((hand_runs, best["overrides"]))
                for into, overrides in (runs if i % 2 == 0 else runs[::-1]):
                    into.append(self.loom(overrides))
            if auto_runs:
                row["auto"].update(median_run(auto_runs))
            if best:
                row["hand_best"] = {k: best[k] for k in ("region", "policy", "plan_bytes")} | median_run(hand_runs)
            ratios = [x["step_s"] / y["step_s"] for x, y in zip(auto_runs, hand_runs) if "step_s" in x and "step_s" in y]
            if ratios:
                row["auto_over_hand"] = statistics.median(ratios)
                row["auto_over_hand_pairs"] = ratios
            if not a.no_torch:
                row["torch"] = self.torch(budget)
            if not a.no_jax:
                row["jax"] = self.jax(budget)
            for r in [row["auto"], row.get("hand_best", {})]:
                if "net_bytes" in r:
                    r["rss_within_tolerance"] = abs(r["net_bytes"] - r["plan_bytes"]) <= (
                        TARGET_RATIO * r["plan_bytes"] + TARGET_SLACK)
            rows.append(row)
        shutil.rmtree(self.tmp)
        return {"shape": self.name, "config": self.config, "overrides": self.common, "noremat_plan_bytes":
                none["total_bytes"], "state_bytes": state, "baselines": {"loom": self.loom_base, "torch":
                self.torch_base, "jax": self.jax_base}, "hand_plans": list(hand.values()), "rows": rows}


def median_run(runs):
    """One run's record from repeats: the median step, the largest net peak, or the first error."""
    ok = [r for r in runs if "step_s" in r]
    if not ok:
        return runs[0]
    return {"net_bytes": max(r["net_bytes"] for r in ok), "step_s": statistics.median(r["step_s"] for r in ok),
            "steps_s": [r["step_s"] for r in ok]}


def cell_ms(r):
    return f"{1e3 * r['step_s']:.0f} ms" if r and "step_s" in r else "-"


def cell_mb(r):
    return f"{r['net_bytes'] / MB:.0f}" if r and "net_bytes" in r else "-"


def table(results):
    lines = ["| shape | budget (f of activations; of total) | loom auto: choice | plan / measured MB | recompute | "
             "step | loom best hand | plan / measured MB | step | auto / hand | torch.compile (knob) | "
             "measured MB | step | JAX tutorial (remat) | measured MB | step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        for r in res["rows"]:
            au, hb = r["auto"], r.get("hand_best")
            if "choice" in au:
                c = au["choice"]
                choice = f"{c['layers']} in {c['num_minibatches']}, head {c['head_chunk'] or 'plain'}"
                auto = [choice, f"{au['plan_bytes'] / MB:.0f} / {cell_mb(au)}", f"+{100 * au['recompute_share']:.1f}%",
                        cell_ms(au)]
            else:
                auto = ["does not fit", "-", "-", "-"]
            hand = ([f"{hb['region']}/{hb['policy']}", f"{hb['plan_bytes'] / MB:.0f} / {cell_mb(hb)}", cell_ms(hb)]
                    if hb else ["none fits", "-", "-"])
            ratio = f"{r['auto_over_hand']:.3f}" if "auto_over_hand" in r else "-"
            t = r.get("torch")
            tc = ([f"{t['knob']}", cell_mb(t), cell_ms(t)] if t and t["knob"] is not None else
                  ["none fits (" + ", ".join(f"{x['knob']}: {cell_mb(x)} MB, {cell_ms(x)}" for x in t["tried"]) + ")", "-", "-"]
                  if t else ["not run", "-", "-"])
            j = r.get("jax")
            jc = ([j["best"]["remat"], cell_mb(j["best"]), cell_ms(j["best"])] if j and j["best"] else
                  ["none fits (" + ", ".join(f"{x['remat']}: {cell_mb(x)} MB, {cell_ms(x)}" for x in j["all"]) + ")", "-", "-"]
                  if j else ["not run", "-", "-"])
            lines.append(f"| {res['shape']} | {r['fraction']:.2f}; {r['fraction_of_total']:.2f} "
                         f"({r['budget_bytes'] / MB:.0f} MB) | " + " | ".join(auto + hand + [ratio] + tc + jc) + " |")
    return "\n".join(lines)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "peer":
        return peer(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loom", default=str(ROOT / "build" / "loom"))
    ap.add_argument("--torch-python", default=sys.executable)
    ap.add_argument("--jax-python", default=sys.executable)
    ap.add_argument("--only", default="", help="only the shapes whose name contains this (tutorial, gpt2_124m)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--fractions", default="1.0,0.7,0.5,0.35")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=1, help="loom's untimed steps")
    ap.add_argument("--pairs", type=int, default=3, help="auto and best-hand runs, alternated, per budget")
    ap.add_argument("--torch-warmup", type=int, default=2, help="torch.compile's untimed steps (compilation)")
    ap.add_argument("--jax-warmup", type=int, default=2, help="JAX's untimed steps (two compilations)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-jax", action="store_true")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 layer, batch 1 x 64, budgets 1.0 and 0.35, 4 hand choices, knobs 1 and 0, "
                         "JAX none and Block")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "remat_budget.json"))
    a = ap.parse_args()
    a.fractions = [float(x) for x in a.fractions.split(",")]
    a.torch_knobs, a.jax_remats, a.hand_limit = TORCH_KNOBS, JAX_REMATS, 0
    if a.quick:
        a.layers, a.batch, a.seq, a.steps, a.fractions, a.pairs = 1, 1, 64, 1, [1.0, 0.35], 1
        a.torch_knobs, a.jax_remats, a.hand_limit = [1.0, 0.0], ["none", "Block"], 4
    host = describe()
    print(f"host: {summary(host)}; loom {a.loom}; reduced shape: "
          f"{a.layers} layers, batch {a.batch} x {a.seq}, {a.dtype}, {a.steps} timed steps", flush=True)
    results = [Bench(a, s).run() for s in SHAPES if a.only in s[0]]
    host["load_end"] = os.getloadavg()
    text = table(results)
    print(text)
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": datetime.datetime.now().isoformat(timespec="seconds"), "argv": sys.argv,
                               "host": host, "loom": a.loom, "layers": a.layers, "batch": a.batch, "seq": a.seq,
                               "dtype": a.dtype, "steps": a.steps, "results": results, "table": text}, indent=1) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
