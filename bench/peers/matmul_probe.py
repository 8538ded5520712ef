#!/usr/bin/env python3
"""A peer's own float32 matmul rate, under the environment it is benchmarked in.

bench/bench.py runs this for each peer in each ISA mode, with exactly the environment that the
peer's training steps get (the mode's caps: OPENBLAS_CORETYPE, ONEDNN_MAX_CPU_ISA,
ATEN_CPU_CAPABILITY, XLA_FLAGS=--xla_cpu_max_isa=...). A rate above the mode's sgemm ceiling
means the caps did not hold the peer to the mode's ISA: its matmuls use wider vectors than the
mode allows (XLA's CPU dot kernels pick AVX-512 at run time whatever --xla_cpu_max_isa says), so
its timings in that mode are not a comparison at that ISA.

  matmul_probe.py --framework torch --threads 2
  matmul_probe.py --framework jax

Prints one JSON object: framework, n, best GFLOP/s over --reps calls, and every call's.
"""
import argparse
import json
import os
import time


def probe_torch(n, reps, threads):
    import torch
    torch.set_num_threads(threads)
    a = torch.rand(n, n)
    b = torch.rand(n, n)
    a @ b  # warm-up: thread pool, packing buffers
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return times, torch.__version__


def pin_to_cpus(threads):
    """Restricts this process to its first `threads` CPUs, the only thread control XLA's CPU client
    has (it sizes its pools from the affinity mask); the JAX peer pins itself the same way."""
    cpus = sorted(os.sched_getaffinity(0))
    if 0 < threads < len(cpus):
        os.sched_setaffinity(0, cpus[:threads])
    return len(os.sched_getaffinity(0))


def probe_jax(n, reps, threads):
    pin_to_cpus(threads)  # before the first JAX call creates the CPU client
    import jax
    import jax.numpy as jnp
    a = jax.random.uniform(jax.random.PRNGKey(0), (n, n), jnp.float32)
    b = jax.random.uniform(jax.random.PRNGKey(1), (n, n), jnp.float32)
    mm = jax.jit(lambda x, y: x @ y)
    mm(a, b).block_until_ready()  # compile
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        mm(a, b).block_until_ready()
        times.append(time.perf_counter() - t)
    return times, jax.__version__


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--framework", choices=["torch", "jax"], required=True)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    fn = probe_torch if args.framework == "torch" else probe_jax
    times, version = fn(args.n, args.reps, args.threads)
    rates = [2 * args.n ** 3 / t * 1e-9 for t in times]
    print(json.dumps(dict(framework=args.framework, version=version, n=args.n, threads=args.threads,
                          cpus=len(os.sched_getaffinity(0)),
                          gflops=round(max(rates), 1), gflops_each=[round(r, 1) for r in rates])))


if __name__ == "__main__":
    main()
