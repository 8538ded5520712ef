#!/usr/bin/env python3
"""JAX/Flax peer for loom's CPU benchmark, shape (d): the Part 1.2 tutorial's Transformer.

The model, loss, gradient accumulation and train step below (TrainState ... the tutorial's
train_step_transformer) are copied verbatim from tools/jax_golden.py, which copies them from the
tutorial "Part 1.2: Profiling and Scaling Single-GPU Transformer Models" (and Part 1.1's
accumulate_gradients); the only changes are the ones marked "CHANGED:" there (jax.tree_map ->
jax.tree_util.tree_map; the global `config` is a closure). The config is the tutorial's with the
sizes of configs/tutorial_transformer.toml scaled to this CPU by the command line, and the batch
is the tutorial's random-token batch. Optimizer: the tutorial's optax.adam with
warmup_exponential_decay_schedule (peak 4e-4, warmup 10, transition 1, decay 0.99), as
configs/tutorial_transformer.toml.

  jax_tutorial.py --layers 4 --hidden 256 --head-dim 64 --vocab 2048 --seq 128 --batch 8 \
      --dtype bfloat16 --remat MLP,Attn --steps 10 --warmup 3

Prints one JSON object: every step's time (jax.block_until_ready on the new state and metrics
after each call, the tutorial's loop passing metrics from step to step), compile time, params.
bench/run.sh runs it with JAX_PLATFORMS=cpu, and in its avx2 mode with
XLA_FLAGS=--xla_cpu_max_isa=AVX2 (the issue's target ISA; the bench machine has AVX-512, which XLA
uses otherwise).
"""
import argparse
import functools
import json
import os
import sys
import time
from typing import Any, Callable, Dict, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.struct import dataclass
from flax.training import train_state
from ml_collections import ConfigDict

# Type aliases
PyTree = Any
Metrics = Dict[str, Tuple[jax.Array, ...]]


# ---------------------------------------------------------------------------------------------
# Part 1.1 (single_gpu.py): TrainState with rng, Batch, accumulate_gradients, print_metrics.
# ---------------------------------------------------------------------------------------------
# The tutorial's model and train-step code: one copy in the project, in tools/jax_golden.py.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from jax_golden import (  # noqa: E402
    Batch,
    TrainState,
    Transformer,
    make_train_step_transformer,
)
from matmul_probe import pin_to_cpus  # noqa: E402  (bench/peers/, this file's folder)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--minibatches", type=int, default=1)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--remat", default="none", help="none, or comma-separated MLP,Attn,Block")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=0,
                    help="run on this many CPUs (0: all); XLA's CPU client sizes its pools from the affinity mask")
    args = ap.parse_args()
    pin_to_cpus(args.threads)  # before the first JAX call creates the CPU client

    remat = () if args.remat in ("", "none") else tuple(args.remat.split(","))
    dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    # The tutorial's config dicts (Part 1.2), sizes from the command line, dropout 0.
    data_config = ConfigDict(dict(batch_size=args.batch, seq_len=args.seq, vocab_size=args.vocab))
    model_config = ConfigDict(dict(
        hidden_size=args.hidden, dropout_rate=0.0, mlp_expansion=4, num_layers=args.layers,
        head_dim=args.head_dim, causal_mask=True, max_seq_len=data_config.seq_len,
        vocab_size=data_config.vocab_size, num_outputs=data_config.vocab_size, dtype=dtype,
        softmax_dtype=jnp.float32, scan_layers=True, remat=remat,
    ))
    model_config.num_heads = model_config.hidden_size // model_config.head_dim
    optimizer_config = ConfigDict(dict(learning_rate=4e-4, num_minibatches=args.minibatches))
    config = ConfigDict(dict(model=model_config, optimizer=optimizer_config, data=data_config, seed=args.seed))

    # The tutorial's setup: random-token batch, model.init on one minibatch, Adam with the schedule.
    model = Transformer(config=config.model)
    optimizer = optax.adam(
        learning_rate=optax.warmup_exponential_decay_schedule(
            init_value=0.0, peak_value=config.optimizer.learning_rate, warmup_steps=10,
            transition_steps=1, decay_rate=0.99,
        )
    )
    tokens = jax.random.randint(jax.random.PRNGKey(0), (config.data.batch_size, config.data.seq_len), 1,
                                config.data.vocab_size)
    batch_transformer = Batch(
        inputs=jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)), constant_values=0),
        labels=tokens,
    )
    model_rng, state_rng = jax.random.split(jax.random.PRNGKey(config.seed))
    params = model.init(
        model_rng,
        batch_transformer.inputs[: config.data.batch_size // config.optimizer.num_minibatches],
        train=False,
    )["params"]
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optimizer, rng=state_rng)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
    n_pos = int(np.prod(params["pos_emb"].shape))

    train_step_transformer = make_train_step_transformer(config)
    metrics = None
    times, losses = [], []
    t0 = time.perf_counter()
    state, metrics = train_step_transformer(state, metrics, batch_transformer)
    jax.block_until_ready((state, metrics))
    first_s = time.perf_counter() - t0  # compile + one step
    total_steps = args.warmup + args.steps
    for _ in range(total_steps - 1):
        t0 = time.perf_counter()
        state, metrics = train_step_transformer(state, metrics, batch_transformer)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - t0)
    # times[0] is the second call (the first with metrics passed in, so it compiles again).
    m = jax.device_get(metrics)
    print(json.dumps(dict(
        framework="jax",
        mode="bench",
        params=n_params,
        params_no_pos=n_params - n_pos,
        step_time_s=[first_s] + times,
        warmup=args.warmup,
        first_call_s=first_s,
        mean_loss=float(m["loss"][0] / m["loss"][1]),
        env=dict(jax=jax.__version__, flax=__import__("flax").__version__, optax=optax.__version__,
                 devices=[str(d) for d in jax.devices()],
                 xla_flags=os.environ.get("XLA_FLAGS", ""), jax_platforms=os.environ.get("JAX_PLATFORMS", ""),
                 cpus=len(os.sched_getaffinity(0))),
    )))


if __name__ == "__main__":
    sys.exit(main())
