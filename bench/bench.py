#!/usr/bin/env python3
"""loom's CPU training-speed benchmark against today's PyTorch and the tutorial's JAX model.

Run it through bench/run.sh (which builds bench/build/ceiling and makes the PyTorch/JAX venv); it
needs only the Python standard library itself. In one run on one machine it measures:

  * the machine's ceilings: large square sgemm (OpenBLAS OpenMP build and oneDNN, 2 threads),
    oneDNN's bfloat16 matmul at 2048^3, STREAM triad bandwidth, and before each of shapes a-c its
    "own products" ceiling: every dense matrix product of that shape's training step timed alone in
    both dtypes (bench/build/ceiling --shapes);
  * full training steps (forward + backward + optimizer, median over the steps after warm-up,
    2 threads) of loom (`loom train ... --log-every 1 train.metrics_file=...`, step_time_s) and of
    its peers on identical shapes, in float32 and bfloat16: PyTorch 2.x eager and torch.compile
    (bench/peers/torch_gpt.py: nanoGPT's model, SDPA attention, fused AdamW, CPU autocast for
    bfloat16) at shapes a-c, and the tutorial's JAX/Flax model (bench/peers/jax_tutorial.py) at d;
  * shape b's per-step overhead: `loom profile`'s time outside ops (dispatch, bookkeeping, gaps).

Verdicts (printed first, and in the JSON's "targets"): loom against the faster of PyTorch eager and
compiled at a-c and against JAX at d; loom's step FLOP/s at a and c as a share of its dtype's 2048^3
ceiling and of its own products' ceiling; b's overhead.

Two ISA modes (--isa): "native" (the default) lets each implementation pick its kernels on this
machine (AVX-512 and AVX512-BF16 here); "avx2" holds every library to AVX2+FMA (loom from
bench/build/loom-avx2, built without -march=native). Each mode has its own ceilings and targets.

Each timing is preceded by a check of what other processes are using (CPU busy time on the
machine over 2 s while this script is idle, in cores); above --max-other-cores it waits and
retries. The 1-, 5- and 15-minute load averages and the other processes' CPU use *during* the
timing (machine busy time minus the timed process tree's own CPU time) are stored with every
measurement. Every (shape, implementation) is timed --repeats times, interleaved with its peers
(loom, eager, compiled, loom, ...); a timing during which other processes used more than
--max-other-cores-during cores is redone in up to --extra-rounds more rounds. The table shows the
best clean median (flagged "contended" when there was none); the JSON keeps every timing.

Writes bench/results/latest.json (and a dated copy) and prints the verdicts and a markdown table.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from host import describe, summary  # noqa: E402
ROOT = os.path.dirname(HERE)
CLK_TCK = os.sysconf("SC_CLK_TCK")

# ---------------------------------------------------------------------------------------------
# Shapes. Every model: attention-first GPT with tied embeddings and AdamW (a-c, nanoGPT's
# model) or the tutorial's Transformer (d); dropout 0; fp32 except d's bfloat16 rows.
# ---------------------------------------------------------------------------------------------
COMMON_SC = ["data.kind=random_tokens", "data.vocab_size=65", "data.dir=", "train.eval_interval=0",
             "train.sample_tokens=0", "model.dropout_rate=0"]

PYTORCH_SHAPES = [
    dict(id="a", title="GPT-2 124M, batch 4 x 64", config="configs/gpt2_124m.toml",
         overrides=["model.dropout_rate=0", "data.batch_size=4", "data.seq_len=64"],
         L=12, C=768, H=12, V=50257, T=64, B=4, max_seq=1024, bias=True, betas=(0.9, 0.95),
         warmup=2, steps=10, peer="pytorch"),
    dict(id="b", title="nanoGPT CPU recipe: 4L 4H 128, vocab 65, batch 12 x 64",
         config="configs/shakespeare_char.toml", overrides=COMMON_SC,
         L=4, C=128, H=4, V=65, T=64, B=12, max_seq=64, bias=False, betas=(0.9, 0.99),
         warmup=5, steps=40, repeats=3, peer="pytorch"),  # cheap and the noisiest: one more round
    dict(id="c", title="6L 6H 384, vocab 65, batch 8 x 256", config="configs/shakespeare_char.toml",
         overrides=COMMON_SC + ["model.hidden_size=384", "model.num_layers=6", "model.head_dim=64",
                                "model.max_seq_len=256", "data.seq_len=256", "data.batch_size=8"],
         L=6, C=384, H=6, V=65, T=256, B=8, max_seq=256, bias=False, betas=(0.9, 0.99),
         warmup=2, steps=10, peer="pytorch"),
]
# Every PyTorch shape in both dtypes: loom's model.dtype, PyTorch's CPU autocast (fp32 parameters).
SHAPES = [dict(s, variant=dtype, dtype=dtype, overrides=s["overrides"] + [f"model.dtype={dtype}"])
          for s in PYTORCH_SHAPES for dtype in ("float32", "bfloat16")]
D_BASE = ["model.num_layers=4", "model.hidden_size=256", "model.head_dim=64", "model.vocab_size=2048",
          "model.num_outputs=2048", "data.vocab_size=2048", "model.max_seq_len=128", "data.seq_len=128",
          "data.batch_size=8", "optimizer.num_minibatches=1", "model.dropout_rate=0"]
for dtype in ("float32", "bfloat16"):
    for remat in ("none", "MLP,Attn"):
        SHAPES.append(dict(
            id="d", variant=f"{dtype} remat={remat}", dtype=dtype, remat=remat,
            title="tutorial Transformer: 4L, hidden 256, head_dim 64, vocab 2048, batch 8 x 128",
            config="configs/tutorial_transformer.toml",
            overrides=D_BASE + [f"model.dtype={dtype}", f"model.remat={remat}"],
            L=4, C=256, H=4, V=2048, T=128, B=8, max_seq=128, warmup=3, steps=15, peer="jax"))

# loom's speed over the fastest PyTorch 2.x variant (eager or torch.compile) at a-c and over JAX at d.
TARGETS = {"a": 1.5, "b": 1.5, "c": 1.5, "d": 1.5}
# The whole training step's model FLOP/s as a share of the matmul ceiling of its dtype, at a and c.
CEILING_TARGETS = {"float32": 0.90, "bfloat16": 0.85}
# Shape b's per-step overhead (step time minus the time inside ops: `loom profile`'s "other").
OVERHEAD_TARGET = 0.10
# A peer's own matmul may exceed the mode's sgemm ceiling by this much (the ceiling is the highest of
# the run's measurements, which drift by 5-15 %) before its timings count as not held to the mode's ISA.
PEER_ISA_SLACK = 1.15


# ---------------------------------------------------------------------------------------------
# Load accounting.
# ---------------------------------------------------------------------------------------------
def cpu_busy_jiffies():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice; guest is inside user.
    idle = v[3] + v[4]
    return sum(v[:8]) - idle


def loadavg():
    with open("/proc/loadavg") as f:
        p = f.read().split()
    return [float(p[0]), float(p[1]), float(p[2])]


def other_cores(seconds=2.0):
    """CPU use of other processes (this script sleeps meanwhile), in cores."""
    b0, t0 = cpu_busy_jiffies(), time.monotonic()
    time.sleep(seconds)
    return (cpu_busy_jiffies() - b0) / CLK_TCK / (time.monotonic() - t0)


class Budget:
    def __init__(self, total_s):
        self.left = total_s


def wait_quiet(label, args, budget, log):
    """Waits (bounded) until other processes use less than args.max_other_cores."""
    waited = 0.0
    tries = 0
    while True:
        oc = other_cores()
        la = loadavg()
        if oc <= args.max_other_cores:
            break
        if budget.left <= 0 or tries >= args.max_tries:
            log(f"   ! {label}: other processes still use {oc:.2f} cores (load {la[0]:.2f}); measuring anyway")
            break
        wait = min(args.wait_s, max(budget.left, 1.0))
        log(f"   ~ {label}: other processes use {oc:.2f} cores (load {la[0]:.2f}); waiting {wait:.0f} s")
        time.sleep(wait)
        budget.left -= wait
        waited += wait
        tries += 1
    return dict(other_cores_before=round(oc, 3), loadavg_before=la, waited_s=waited)


def timed_run(cmd, env, cwd=ROOT, timeout=900):
    """Runs cmd; returns (CompletedProcess, other processes' mean CPU use in cores while it ran)."""
    ru0 = os.times()
    b0, t0 = cpu_busy_jiffies(), time.monotonic()
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    b1, t1 = cpu_busy_jiffies(), time.monotonic()
    ru1 = os.times()
    own = (ru1.children_user - ru0.children_user) + (ru1.children_system - ru0.children_system)
    wall = t1 - t0
    other = max(0.0, ((b1 - b0) / CLK_TCK - own) / wall)
    return p, round(other, 3), round(own / wall, 3), wall


# ---------------------------------------------------------------------------------------------
# Runners.
# ---------------------------------------------------------------------------------------------
# ISA modes. "avx2": the target machine (AVX2+FMA, no AVX-512): every library held to
# its AVX2 kernels and loom built without -march=native (bench/build_loom_avx2.sh). "native": what
# each implementation picks on this machine by itself (here AVX-512: oneDNN avx512_core_bf16,
# OpenBLAS Cooperlake), loom as built (build/loom, -march=native).
MODES = ("avx2", "native")
SCRUB = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
         "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "XLA_FLAGS", "BLIS_ARCH_TYPE",
         "GOMP_SPINCOUNT", "OMP_PROC_BIND", "OMP_PLACES", "MKL_NUM_THREADS")


def mode_env(mode):
    """The environment of every process of a mode: the caller's, minus every BLAS/OpenMP/ISA
    variable (this machine's environment sets OPENBLAS_CORETYPE=Haswell), plus the mode's caps."""
    env = {k: v for k, v in os.environ.items() if k not in SCRUB}
    if mode == "avx2":
        env.update(OPENBLAS_CORETYPE="Haswell", ONEDNN_MAX_CPU_ISA="AVX2", ATEN_CPU_CAPABILITY="avx2",
                   XLA_FLAGS="--xla_cpu_max_isa=AVX2")
    return env


def env_note(env):
    return " ".join(f"{k}={env[k]}" for k in ("OPENBLAS_CORETYPE", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY",
                                              "XLA_FLAGS", "OMP_WAIT_POLICY") if k in env)


def run_loom(shape, args, mode):
    loom = args.loom_avx2 if mode == "avx2" else args.loom
    with tempfile.TemporaryDirectory(prefix="loom-bench-") as td:
        mfile = os.path.join(td, "metrics.jsonl")
        n = shape["warmup"] + shape["steps"]
        cmd = [loom, "train", shape["config"], *shape["overrides"], f"threads={args.threads}",
               "--steps", str(n), "--log-every", "1", f"train.metrics_file={mfile}"]
        env = mode_env(mode)
        p, other, own, wall = timed_run(cmd, env)
        if p.returncode != 0:
            raise RuntimeError(f"loom failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        rows = [json.loads(l) for l in open(mfile) if l.strip()]
    rows.sort(key=lambda r: r["step"])
    times = [r["step_time_s"] for r in rows]
    assert len(times) == n, (len(times), n)
    m = re.search(r"program: .*?(\d+) parameters", p.stdout)
    params = int(m.group(1)) if m else None
    return dict(impl="loom", cmd=(env_note(env) + " " + " ".join(cmd)).strip(), step_time_s=times,
                warmup=shape["warmup"], params=params,
                params_no_pos=params - shape["max_seq"] * shape["C"] if params else None,
                first_loss=rows[0].get("loss"), last_loss=rows[-1].get("loss"),
                other_cores_during=other, own_cores=own, wall_s=round(wall, 2), stdout_head=p.stdout[:400])


def run_overhead(shape, args, mode):
    """`loom profile` at a shape: its mean step, and its "other" phase (step minus time in ops and the
    optimizer: dispatch, bookkeeping, gaps between ops)."""
    loom = args.loom_avx2 if mode == "avx2" else args.loom
    with tempfile.TemporaryDirectory(prefix="loom-bench-") as td:
        cmd = [loom, "profile", shape["config"], *shape["overrides"], f"threads={args.threads}", "--steps", "40",
               "--warmup", "5", "--no-ceiling", "--out", td]
        p, other, own, wall = timed_run(cmd, mode_env(mode))
        if p.returncode != 0:
            raise RuntimeError(f"loom profile failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
        d = json.load(open(os.path.join(td, "summary.json")))
    ph = d["phase_ms_per_step"]
    return dict(dtype=shape["dtype"], cmd=" ".join(cmd), mean_step_ms=d["mean_step_ms"], median_step_ms=d["median_step_ms"],
                phase_ms_per_step=ph, other_ms=ph["other"], share=ph["other"] / d["mean_step_ms"],
                other_cores_during=other)


def peer_env(peer, mode):
    """The environment of a peer's processes in a mode (its training steps and its matmul probe)."""
    env = mode_env(mode)
    if peer == "pytorch":
        env["OMP_WAIT_POLICY"] = "PASSIVE"  # without it PyTorch's and OpenBLAS's pools spin against each other
    else:
        env["JAX_PLATFORMS"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def probe_peer_matmul(peer, args, mode):
    """The peer's own 2048^3 fp32 matmul rate under the mode's caps (bench/peers/matmul_probe.py):
    above the mode's sgemm ceiling, the caps did not hold the peer to the mode's ISA."""
    python, fw = (args.torch_python, "torch") if peer == "pytorch" else (args.jax_python, "jax")
    cmd = [python, os.path.join(HERE, "peers", "matmul_probe.py"), "--framework", fw, "--threads", str(args.threads)]
    # A failed probe costs its verdicts (no "not comparable" check), not the run.
    try:
        p = subprocess.run(cmd, env=peer_env(peer, mode), capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            return dict(error=f"exit {p.returncode}: {p.stderr[-500:]}")
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, IndexError, json.JSONDecodeError) as e:
        return dict(error=repr(e))


def run_torch(shape, args, mode, impl, python, compiled):
    cmd = [python, os.path.join(HERE, "peers", "torch_gpt.py"), "bench", "--dtype", shape["dtype"],
           "--threads", str(args.threads), "--n-layer", str(shape["L"]), "--n-head", str(shape["H"]),
           "--n-embd", str(shape["C"]), "--vocab", str(shape["V"]), "--block", str(shape["max_seq"]),
           "--batch", str(shape["B"]), "--seq", str(shape["T"]), "--steps", str(shape["steps"]),
           "--warmup", str(shape["warmup"]), "--beta1", str(shape["betas"][0]), "--beta2", str(shape["betas"][1]),
           "--weight-decay", "0.1", "--grad-clip", "1.0"] + (["--bias"] if shape["bias"] else []) \
        + (["--compile"] if compiled else [])
    env = peer_env("pytorch", mode)
    p, other, own, wall = timed_run(cmd, env)
    if p.returncode != 0:
        raise RuntimeError(f"torch peer failed: {' '.join(cmd)}\n{p.stderr[-3000:]}")
    d = json.loads(p.stdout.strip().splitlines()[-1])
    return dict(impl=impl, cmd=env_note(env) + " " + " ".join(cmd), step_time_s=d["step_time_s"],
                warmup=d["warmup"], params=d["params"], params_no_pos=d["params_no_pos"],
                first_step_s=d.get("first_step_s"), fused_adamw=d.get("fused_adamw"), sdpa=d.get("sdpa"),
                first_loss=d["losses"][0], last_loss=d["losses"][-1], env=d["env"],
                other_cores_during=other, own_cores=own, wall_s=round(wall, 2))


def run_jax(shape, args, mode):
    cmd = [args.jax_python, os.path.join(HERE, "peers", "jax_tutorial.py"), "--layers", str(shape["L"]),
           "--hidden", str(shape["C"]), "--head-dim", str(shape["C"] // shape["H"]), "--vocab", str(shape["V"]),
           "--seq", str(shape["T"]), "--batch", str(shape["B"]), "--dtype", shape["dtype"],
           "--remat", shape["remat"], "--steps", str(shape["steps"]), "--warmup", str(shape["warmup"]),
           "--threads", str(args.threads)]
    env = peer_env("jax", mode)
    p, other, own, wall = timed_run(cmd, env)
    if p.returncode != 0:
        raise RuntimeError(f"jax peer failed: {' '.join(cmd)}\n{p.stderr[-3000:]}")
    d = json.loads(p.stdout.strip().splitlines()[-1])
    return dict(impl="jax", cmd=env_note(env) + " " + " ".join(cmd), step_time_s=d["step_time_s"],
                warmup=d["warmup"], params=d["params"], params_no_pos=d["params_no_pos"],
                first_call_s=d["first_call_s"], mean_loss=d["mean_loss"], env=d["env"],
                other_cores_during=other, own_cores=own, wall_s=round(wall, 2))


def step_gemms(shape):
    """The dense matrix products of one training step at a PyTorch shape (nanoGPT's blocks and the tied
    head), as (M, N, K, ta, tb, count): per Linear x[M,K]·W[K,N], dx = dy·Wᵀ and dW = xᵀ·dy. Attention's
    batched products (12·L·T·C FLOPs per token in the formula) are not among them."""
    M, C, L, V = shape["B"] * shape["T"], shape["C"], shape["L"], shape["V"]
    out = []
    for K, N, count in ((C, 3 * C, L), (C, C, L), (C, 4 * C, L), (4 * C, C, L)):
        out += [(M, N, K, 0, 0, count), (M, K, N, 0, 1, count), (K, N, M, 1, 0, count)]
    # The tied head: W stored [V, C] (the embedding table), logits = x·Wᵀ.
    return out + [(M, V, C, 0, 1, 1), (M, C, V, 0, 0, 1), (V, C, M, 1, 0, 1)]


def step_ceiling(c, gemms):
    """GFLOP/s per dtype of a step's dense products, each at its own measured rate (ceiling --shapes).
    Without a bf16 matmul (ceiling times it as -1: below AVX-512) loom's bf16 products run on sgemm,
    so the float32 rate is their ceiling."""
    timed = c.get("step_shapes", [])
    assert len(timed) == len(gemms), (len(timed), len(gemms))
    flops = sum(2.0 * M * N * K * n for (M, N, K, _, _, n) in gemms)
    f32 = flops / sum(t["float32_s"] * g[5] for t, g in zip(timed, gemms)) * 1e-9
    bf16 = (f32 if any(t["bfloat16_s"] < 0 for t in timed)
            else flops / sum(t["bfloat16_s"] * g[5] for t, g in zip(timed, gemms)) * 1e-9)
    return {"float32": f32, "bfloat16": bf16}


def summarize(m, shape, ceiling):
    t = m["step_time_s"][m["warmup"]:]
    med = statistics.median(t)
    tokens = shape["B"] * shape["T"]
    n = m["params_no_pos"]
    flops_tok = 6 * n + 12 * shape["L"] * shape["T"] * shape["C"]
    gf = flops_tok * tokens / med * 1e-9
    m.update(median_s=med, min_s=min(t), max_s=max(t), n_timed=len(t), tokens_per_step=tokens,
             tokens_per_s=tokens / med, flops_per_token=flops_tok, gflops=gf,
             fraction_of_ceiling=gf / ceiling if ceiling else None)
    return m


def round_speedups(row):
    """loom's speedup over today's fastest peer in each round that both timed cleanly: per round, the
    fastest of today's variants that round against loom's that round. The verdict compares each
    one's best round; these show whether it holds round by round on a noisy host."""
    def clean_by_round(name):
        return {m["round"]: m["median_s"] for m in row["impls"][name]["runs"] if m["clean"]}

    peers = [clean_by_round(k) for k in row["impls"] if k not in ("loom", "pytorch-1.13")]
    out = []
    for rnd, loom_s in sorted(clean_by_round("loom").items()):
        times = [p[rnd] for p in peers if rnd in p]
        if times:
            out.append(round(min(times) / loom_s, 3))
    return out


def binary_info(path):
    info = dict(path=path)
    if not os.path.exists(path):
        info["missing"] = True
        return info
    info["mtime"] = datetime.datetime.fromtimestamp(os.path.getmtime(path)).isoformat(timespec="seconds")
    try:
        objdump = subprocess.run(["objdump", "-d", path], capture_output=True, text=True).stdout
        info["zmm_instructions"] = objdump.count("zmm")  # AVX-512 code compiled into the binary
    except OSError:
        pass
    return info


# ---------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", default=os.path.join(ROOT, "build", "loom"), help="loom for the native mode")
    ap.add_argument("--loom-avx2", default=os.path.join(HERE, "build", "loom-avx2", "loom"),
                    help="loom for the avx2 mode (bench/build_loom_avx2.sh)")
    ap.add_argument("--isa", default="native", help="modes to run: native, avx2 or both (avx2,native)")
    ap.add_argument("--ceiling-bin", default=os.path.join(HERE, "build", "ceiling"))
    ap.add_argument("--torch-python", default=os.path.join(ROOT, ".venv-bench", "bin", "python"),
                    help="a python with PyTorch 2.x (eager and torch.compile rows)")
    ap.add_argument("--debian-torch", default="", help="also time this python's PyTorch (e.g. /usr/bin/python3 "
                    "with Debian's 1.13) eagerly, as an extra column outside the verdicts")
    ap.add_argument("--jax-python", default=os.path.join(ROOT, ".venv-bench", "bin", "python"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated shape ids (a,b,c,d)")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--max-other-cores", type=float, default=0.5,
                    help="wait while other processes use more than this many cores")
    ap.add_argument("--max-other-cores-during", type=float, default=0.25,
                    help="a timing during which others used more than this is redone (see --extra-rounds)")
    ap.add_argument("--extra-rounds", type=int, default=2)
    ap.add_argument("--deadline-s", type=float, default=840, help="no redo rounds after this many seconds")
    ap.add_argument("--wait-s", type=float, default=20)
    ap.add_argument("--max-tries", type=int, default=4, help="waits per timing before measuring anyway")
    ap.add_argument("--max-wait-total", type=float, default=240, help="seconds of waiting in the whole run")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "latest.json"))
    args = ap.parse_args()
    modes = [m for m in args.isa.split(",") if m]
    assert all(m in MODES for m in modes), f"--isa takes {MODES}"
    if "avx2" in modes and not os.path.exists(args.loom_avx2):
        sys.exit(f"bench: {args.loom_avx2} missing (bash bench/build_loom_avx2.sh), or run with --isa native")

    t_start = time.monotonic()
    budget = Budget(args.max_wait_total)

    def log(s):
        print(s, flush=True)

    machine = dict(
        **describe(),
        caller_env={k: os.environ[k] for k in SCRUB if k in os.environ},
        loom_git=subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                                text=True).stdout.strip(),
        loom_native=binary_info(args.loom),
        loom_avx2=binary_info(args.loom_avx2),
    )
    log(f"== machine: {summary(machine)}; "
        f"loom {machine['loom_git']}: native {args.loom} (built {machine['loom_native'].get('mtime')}), "
        f"avx2 {args.loom_avx2} (built {machine['loom_avx2'].get('mtime')})")

    # Ceilings, per mode: a full measurement (sgemm 2048 and 3072 with OpenBLAS and oneDNN, triad)
    # at the start and at the end of the run, and a quick sgemm spot check before each shape. This
    # VM's speed drifts by 5-15% over minutes, so the GEMM ceiling used for "% of ceiling" is the
    # highest of all of them in the mode (the conservative choice); the JSON keeps every one.
    ceilings, checks = {}, {m: [] for m in modes}

    def measure_ceiling(mode, when, quick=False, gemms=()):
        info = wait_quiet(f"ceiling {mode} {when}", args, budget, log)
        cmd = [args.ceiling_bin, "--threads", str(args.threads)] + (["--quick"] if quick else []) \
            + (["--shapes", ";".join(",".join(str(x) for x in g[:5]) for g in gemms)] if gemms else [])
        p, other, own, wall = timed_run(cmd, mode_env(mode))
        if p.returncode != 0:
            sys.exit(f"ceiling failed: {p.stderr}")
        c = json.loads(p.stdout)
        c.update(info, when=when, other_cores_during=other, loadavg_after=loadavg(), env=env_note(mode_env(mode)))
        checks[mode].append(c)
        sg = c["sgemm_gflops"]
        log(f"== ceiling [{mode}] {when}: sgemm OpenBLAS {c['openblas_corename']} {sg['openblas']}, oneDNN "
            f"{c['onednn_isa']} {sg['onednn']}, oneDNN bf16 {c['bf16_gemm_gflops']} GFLOP/s"
            + (f"; the step's own products {', '.join(f'{k} {v:.1f}' for k, v in step_ceiling(c, gemms).items())}"
               if gemms else "")
            + ("" if quick else f", triad {c['triad_gbs']:.1f} GB/s")
            + f"; other processes {other:.2f} cores")
        return c

    for mode in modes:
        ceilings[mode] = measure_ceiling(mode, "start")

    only = set(args.only.split(",")) if args.only else None
    # Each peer's own matmul rate under each mode's caps: whether the caps hold it to the mode's ISA.
    # The matmul probe runs each peer framework's python ("pytorch": the PyTorch 2.x venv).
    peers = [] if args.no_peers else sorted({s["peer"] for s in SHAPES if not only or s["id"] in only})
    peer_matmul = {m: {} for m in modes}
    for mode in modes:
        for peer in peers:
            wait_quiet(f"matmul probe {mode} {peer}", args, budget, log)
            pm = peer_matmul[mode][peer] = probe_peer_matmul(peer, args, mode)
            log(f"== {peer}'s own fp32 matmul [{mode}]: " + (f"probe failed: {pm['error']}" if "error" in pm else
                f"{pm['gflops']:.1f} GFLOP/s (2048^3, best of {len(pm['gflops_each'])}, {pm.get('cpus')} CPUs)"))
    results = []
    step_ceilings = {}  # (shape id, mode) -> {dtype: GFLOP/s of the step's own products}
    for shape in SHAPES:
        if only and shape["id"] not in only:
            continue
        for mode in modes:
            # The step's own products are timed once per shape (both dtypes), before its first variant.
            gemms = step_gemms(shape) if shape["peer"] == "pytorch" else ()
            first = (shape["id"], mode) not in step_ceilings
            c = measure_ceiling(mode, f"before ({shape['id']}) {shape.get('variant', 'float32')}", quick=True,
                                gemms=gemms if first else ())
            if gemms and first:
                step_ceilings[(shape["id"], mode)] = step_ceiling(c, gemms)
            C = ceilings[mode]["gemm_ceiling_gflops"]  # provisional; final fractions are set below
            label = f"[{mode}] ({shape['id']}) {shape.get('variant', 'float32')}"
            runners = [("loom", run_loom)]
            if not args.no_peers and shape["peer"] == "pytorch":
                def torch_runner(name, python, compiled):
                    return name, lambda sh, a, md: run_torch(sh, a, md, name, python, compiled)
                runners += [torch_runner("pytorch-eager", args.torch_python, False),
                            torch_runner("pytorch-compile", args.torch_python, True)]
                if args.debian_torch:
                    runners.append(torch_runner("pytorch-1.13", args.debian_torch, False))
            elif not args.no_peers:
                runners.append(("jax", run_jax))
            per_impl = {name: [] for name, _ in runners}
            # Interleaved (loom, peer, loom, peer, ...). A timing during which other processes used
            # more than --max-other-cores-during cores is kept but not counted as clean; it is
            # redone (up to --extra-rounds more rounds, while the run is within --deadline-s).
            reps = max(args.repeats, shape.get("repeats", 0))
            for rnd in range(reps + args.extra_rounds):
                need = [(n, f) for n, f in runners if sum(m["clean"] for m in per_impl[n]) < reps]
                if not need or (rnd >= reps and time.monotonic() - t_start > args.deadline_s):
                    break
                for name, fn in need:
                    info = wait_quiet(f"{label} {name}", args, budget, log)
                    m = fn(shape, args, mode)
                    m.update(info, loadavg_after=loadavg(), round=rnd)
                    m["clean"] = m["other_cores_during"] <= args.max_other_cores_during
                    summarize(m, shape, C)
                    per_impl[name].append(m)
                    log(f"   {label:36s} {name:8s} round {rnd}: {m['median_s'] * 1e3:9.1f} ms/step "
                        f"(min {m['min_s'] * 1e3:.1f}, max {m['max_s'] * 1e3:.1f}, n={m['n_timed']}), "
                        f"{m['gflops']:.1f} GFLOP/s; load {m['loadavg_before'][0]:.2f}, "
                        f"others {m['other_cores_before']:.2f}/{m['other_cores_during']:.2f} cores before/during"
                        f"{'' if m['clean'] else '  [contended]'}")
            row = dict(shape=shape["id"], variant=shape.get("variant", "float32"), dtype=shape["dtype"], mode=mode,
                       title=shape["title"], step_ceiling_gflops=step_ceilings.get((shape["id"], mode)),
                       B=shape["B"], T=shape["T"], L=shape["L"], C=shape["C"], V=shape["V"],
                       config=shape["config"], overrides=shape["overrides"], impls={})
            for name, ms in per_impl.items():
                clean = [m for m in ms if m["clean"]]
                # The best clean median; without a clean timing, the least contended one (flagged).
                best = (min(clean, key=lambda m: m["median_s"]) if clean
                        else min(ms, key=lambda m: m["other_cores_during"]))
                row["impls"][name] = dict(best=best, runs=ms, clean_runs=len(clean))
            if "loom" in row["impls"] and len(row["impls"]) > 1:
                loom_s = row["impls"]["loom"]["best"]["median_s"]
                row["speedup_vs"] = {k: d["best"]["median_s"] / loom_s for k, d in row["impls"].items() if k != "loom"}
                # The verdict's peer: the fastest of today's variants (PyTorch 2.x eager or compiled; JAX).
                today = [k for k in row["speedup_vs"] if k != "pytorch-1.13"]
                row["peer"] = min(today, key=lambda k: row["impls"][k]["best"]["median_s"])
                row["speedup_vs_peer"] = row["speedup_vs"][row["peer"]]
            results.append(row)

    # Shape b's per-step overhead from `loom profile` (its "other" phase: step time minus the time
    # inside ops and the optimizer), in both dtypes.
    overheads = {}
    if not only or "b" in only:
        for mode in modes:
            for shape in SHAPES:
                if shape["id"] == "b":
                    wait_quiet(f"[{mode}] (b) {shape['dtype']} overhead", args, budget, log)
                    o = run_overhead(shape, args, mode)
                    overheads.setdefault(mode, []).append(o)
                    log(f"   [{mode}] (b) {shape['dtype']:8s} overhead: {o['other_ms']:.3f} ms of a "
                        f"{o['mean_step_ms']:.2f} ms step ({100 * o['share']:.2f} %) outside ops; "
                        f"others {o['other_cores_during']:.2f} cores")

    for mode in modes:
        measure_ceiling(mode, "end")
    ceiling_final = {}
    for mode in modes:
        vals = [c["gemm_ceiling_gflops"] for c in checks[mode]]
        # 0 where this oneDNN has no bf16 matmul: loom's bf16 products then run on sgemm.
        bf16 = [c["bf16_gemm_gflops"]["2048"] or c["gemm_ceiling_gflops"] for c in checks[mode]]
        ceiling_final[mode] = dict(gemm_ceiling_gflops=max(vals), min_gflops=min(vals), n=len(vals),
                                   bf16_ceiling_gflops=max(bf16), bf16_min_gflops=min(bf16),
                                   start=ceilings[mode], end=checks[mode][-1],
                                   triad_gbs=[c["triad_gbs"] for c in checks[mode] if c["triad_gbs"] > 0])
        for r in results:
            if r["mode"] == mode:
                ceil = max(bf16) if r["dtype"] == "bfloat16" else max(vals)
                for d in r["impls"].values():
                    for m in d["runs"]:
                        m["fraction_of_ceiling"] = m["gflops"] / ceil
                        if r["step_ceiling_gflops"]:
                            m["fraction_of_step_ceiling"] = m["gflops"] / r["step_ceiling_gflops"][r["dtype"]]

    # Targets, per mode.
    targets = []

    def best(shape, variant, mode, impl):
        for r in results:
            if r["shape"] == shape and r["variant"] == variant and r["mode"] == mode and impl in r["impls"]:
                return r["impls"][impl]["best"]
        return None

    for mode in modes:
        for r in results:
            if r["mode"] == mode and "speedup_vs_peer" in r:
                need = TARGETS[r["shape"]]
                t = dict(mode=mode, kind="speed", shape=r["shape"], dtype=r["dtype"], variant=r["variant"],
                         peer=r["peer"], target=f"({r['shape']}) {r['variant']}: loom >= {need}x {r['peer']}",
                         value=round(r["speedup_vs_peer"], 3), need=need, met=r["speedup_vs_peer"] >= need,
                         rounds=round_speedups(r))
                # In a capped mode, a peer whose own matmul (same threads) beats the mode's sgemm
                # ceiling by more than the ceiling's drift ran wider vectors than the mode allows:
                # no verdict at this ISA. (Native mode has no caps to escape.)
                rate = peer_matmul[mode].get(r["peer"], {}).get("gflops")
                if mode != "native" and rate and rate > PEER_ISA_SLACK * ceiling_final[mode]["gemm_ceiling_gflops"]:
                    t.update(met=None, not_comparable=f"{r['peer']}'s own matmul ran at {rate:.0f} GFLOP/s, above "
                             f"this mode's sgemm ceiling of {ceiling_final[mode]['gemm_ceiling_gflops']:.0f}: "
                             f"the caps do not hold it to this ISA")
                targets.append(t)
        for s in ("a", "c"):
            for dtype, need in CEILING_TARGETS.items():
                m = best(s, dtype, mode, "loom")
                if not m:
                    continue
                for key, what in (("fraction_of_ceiling", "2048^3 matmul"),
                                  ("fraction_of_step_ceiling", "its own products' matmul")):
                    if key in m:
                        targets.append(dict(mode=mode, kind="ceiling", shape=s, dtype=dtype, ceiling=what,
                                            target=f"({s}) {dtype}: loom step FLOP/s >= {need:.0%} of the "
                                                   f"{dtype} {what} ceiling",
                                            value=round(m[key], 4), need=need, met=m[key] >= need))
        for o in overheads.get(mode, []):
            targets.append(dict(mode=mode, kind="overhead", shape="b", dtype=o["dtype"],
                                target=f"(b) {o['dtype']}: per-step overhead (step - time in ops) < "
                                       f"{OVERHEAD_TARGET:.0%} of the step",
                                value=round(o["share"], 4), need=OVERHEAD_TARGET, met=o["share"] < OVERHEAD_TARGET))
        for remat in ("none", "MLP,Attn"):
            f32 = best("d", f"float32 remat={remat}", mode, "loom")
            bf = best("d", f"bfloat16 remat={remat}", mode, "loom")
            if f32 and bf:
                ratio = bf["median_s"] / f32["median_s"]
                targets.append(dict(mode=mode, kind="bf16 cost", shape="d",
                                    target=f"(d) remat={remat}: loom bf16 step <= 1.15x fp32 step",
                                    value=round(ratio, 3), need=1.15, met=ratio <= 1.15))

    out = dict(
        date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        command="bash bench/run.sh " + " ".join(sys.argv[1:]),
        machine=machine, modes=modes, mode_env={m: env_note(mode_env(m)) or "(no caps)" for m in modes},
        ceilings=ceiling_final, ceiling_checks=checks, peer_matmul=peer_matmul, threads=args.threads,
        repeats=args.repeats,
        flops_formula="per token 6*N + 12*L*T*C, N = parameters without position embeddings, T = seq_len "
                      "(remat recompute not counted)",
        load_gate=dict(max_other_cores=args.max_other_cores, max_other_cores_during=args.max_other_cores_during,
                       extra_rounds=args.extra_rounds, deadline_s=args.deadline_s, wait_s=args.wait_s,
                       max_tries=args.max_tries, max_wait_total=args.max_wait_total,
                       waited_total_s=args.max_wait_total - budget.left),
        results=results, overheads=overheads, targets=targets, wall_s=round(time.monotonic() - t_start, 1),
    )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    shutil.copyfile(args.out, os.path.join(os.path.dirname(args.out), f"run-{stamp}.json"))
    print()
    print(render_markdown(out))
    log(f"\nwrote {args.out} ({out['wall_s']:.0f} s)")


def render_verdicts(out):
    """The run's verdicts: one row per shape and dtype (loom against the fastest of today's peers, and
    its share of the dtype's matmul ceilings), then every target."""
    lines = []
    for mode in out["modes"]:
        lines += [f"### Verdicts, ISA mode `{mode}`", "",
                  "| shape | dtype | loom ms/step | fastest peer | its ms/step | loom speedup | target | "
                  "share of the 2048³ ceiling | share of its own products' ceiling |",
                  "|---|---|---:|---|---:|---:|---:|---:|---:|"]
        for r in out["results"]:
            if r["mode"] != mode or "loom" not in r["impls"]:
                continue
            m = r["impls"]["loom"]["best"]
            peer = r.get("peer")
            pm = r["impls"][peer]["best"] if peer else None
            own = m.get("fraction_of_step_ceiling")
            lines.append(
                f"| ({r['shape']}) | {r['variant']} | {m['median_s'] * 1e3:.1f} | {peer or '-'} | "
                + (f"{pm['median_s'] * 1e3:.1f} | **{r['speedup_vs_peer']:.2f}x** | {TARGETS[r['shape']]}x" if pm
                   else "- | - | -")
                + f" | {100 * m['fraction_of_ceiling']:.0f} % | " + (f"{100 * own:.0f} %" if own else "-") + " |")
        lines += ["", "| target | measured | met | per round (speed: each round's own ratio) |", "|---|---:|---|---|"]
        for t in out["targets"]:
            if t["mode"] == mode:
                verdict = ("not comparable: " + t["not_comparable"] if t.get("not_comparable")
                           else "yes" if t["met"] else "**NO**")
                rounds = t.get("rounds")
                per_round = (", ".join(f"{x:.3f}" for x in rounds)
                             + f" (met in {sum(x >= t['need'] for x in rounds)} of {len(rounds)})" if rounds else "-")
                lines.append(f"| {t['target']} | {t['value']} | {verdict} | {per_round} |")
        lines.append("")
    return "\n".join(lines)


def render_markdown(out):
    lines = [render_verdicts(out)]
    for mode in out["modes"]:
        c = out["ceilings"][mode]
        C = c["gemm_ceiling_gflops"]
        st, en = c["start"], c["end"]
        lines += [
            f"### ISA mode `{mode}` ({out['mode_env'][mode]})",
            "",
            f"GEMM ceiling {C:.1f} GFLOP/s: the highest of {c['n']} sgemm measurements over the run "
            f"(lowest {c['min_gflops']:.1f}); at the start OpenBLAS {st['openblas_corename']} "
            f"{st['sgemm_gflops']['openblas']['2048']:.1f}/{st['sgemm_gflops']['openblas']['3072']:.1f}, "
            f"oneDNN {st['onednn_isa']} {st['sgemm_gflops']['onednn']['2048']:.1f}/"
            f"{st['sgemm_gflops']['onednn']['3072']:.1f} (2048/3072, {st['threads']} threads); at the end "
            f"OpenBLAS {en['sgemm_gflops']['openblas']['2048']:.1f}/{en['sgemm_gflops']['openblas']['3072']:.1f}, "
            f"oneDNN {en['sgemm_gflops']['onednn']['2048']:.1f}/{en['sgemm_gflops']['onednn']['3072']:.1f}. "
            f"bfloat16 ceiling {c['bf16_ceiling_gflops']:.1f} GFLOP/s: oneDNN's bf16 matmul at 2048³, the highest "
            f"of {c['n']} (lowest {c['bf16_min_gflops']:.1f}). "
            f"Triad {' / '.join(f'{t:.1f}' for t in c['triad_gbs'])} GB/s (start / end).",
            "",
        ]
        probes = out.get("peer_matmul", {}).get(mode, {})
        if probes:
            lines += ["The peers' own fp32 matmul (2048^3, best of 10 calls, same threads) under this mode's caps: "
                      + ", ".join(f"{k} probe failed" if "error" in v else f"{k} {v['gflops']:.1f} GFLOP/s"
                                  for k, v in probes.items()) + ".", ""]
        lines += [
            "| shape | variant | impl | ms/step | tokens/s | GFLOP/s | % of its dtype's ceiling | loom speedup | load 1m "
            "| others (cores) |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in out["results"]:
            if r["mode"] != mode:
                continue
            for name, d in r["impls"].items():
                m = d["best"]
                sp = (", ".join(f"{v:.2f}x {k}" for k, v in r["speedup_vs"].items())
                      if name == "loom" and "speedup_vs" in r else "")
                flag = "" if m["clean"] else " (contended)"
                lines.append(
                    f"| ({r['shape']}) B{r['B']}xT{r['T']} L{r['L']} C{r['C']} V{r['V']} | {r['variant']} | {name} | "
                    f"{m['median_s'] * 1e3:.1f} | {m['tokens_per_s']:.0f} | {m['gflops']:.1f} | "
                    f"{100 * m['fraction_of_ceiling']:.1f}% | {sp} | {m['loadavg_before'][0]:.2f} | "
                    f"{m['other_cores_before']:.2f} / {m['other_cores_during']:.2f}{flag} |")
        for o in out["overheads"].get(mode, []):
            lines.append(f"\n(b) {o['dtype']} under `loom profile`: mean step {o['mean_step_ms']:.2f} ms, of which "
                         f"{o['other_ms']:.3f} ms ({100 * o['share']:.2f} %) outside ops; phases "
                         + ", ".join(f"{k} {v:.2f}" for k, v in o["phase_ms_per_step"].items()) + " ms.")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
