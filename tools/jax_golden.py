#!/usr/bin/env python3
"""Golden files for loom, computed by the UvA tutorial's own JAX/Flax/Optax code.

Run through tools/make_goldens.sh (which builds the pinned venv); writes into tests/golden/:

  transformer_init.safetensors            initial params (float32) + the batch, config metadata
  transformer_{float32,bfloat16}_mb{1,2}.safetensors
                                          first-step averaged gradients ("grad/<param>"),
                                          loss/accuracy of step 1, the losses of 5 train steps
  optax.json                              schedule values, optimizer updates, clipping

The model code below (MLPBlock ... train_step_transformer) is copied from the tutorial
"Part 1.2: Profiling and Scaling Single-GPU Transformer Models" and from Part 1.1
(accumulate_gradients, TrainState with rng). Changes needed for the installed JAX are marked
with "CHANGED:"; the only one is jax.tree_map -> jax.tree_util.tree_map (jax.tree_map was
removed from JAX). The tutorial's global `config` used inside train_step_transformer is
passed via a closure instead (the tutorial reads a module-level global).
"""
import argparse
import functools
import json
import os
import sys
from typing import Any, Callable, Dict, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.struct import dataclass
from flax.training import train_state
from ml_collections import ConfigDict
from safetensors import safe_open

# Type aliases
PyTree = Any
Metrics = Dict[str, Tuple[jax.Array, ...]]


# ---------------------------------------------------------------------------------------------
# Part 1.1 (single_gpu.py): TrainState with rng, Batch, accumulate_gradients, print_metrics.
# ---------------------------------------------------------------------------------------------
class TrainState(train_state.TrainState):
    rng: jax.Array


@dataclass
class Batch:
    inputs: jax.Array
    labels: jax.Array


def accumulate_gradients_loop(
    state: TrainState,
    batch: Batch,
    rng: jax.random.PRNGKey,
    num_minibatches: int,
    loss_fn: Callable,
) -> Tuple[PyTree, Metrics]:
    batch_size = batch.inputs.shape[0]
    minibatch_size = batch_size // num_minibatches
    rngs = jax.random.split(rng, num_minibatches)
    # Define gradient function for single minibatch.
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    # Prepare loop variables.
    grads = None
    metrics = None
    for minibatch_idx in range(num_minibatches):
        with jax.named_scope(f"minibatch_{minibatch_idx}"):
            # Split the batch into minibatches.
            start = minibatch_idx * minibatch_size
            end = start + minibatch_size
            minibatch = jax.tree_util.tree_map(lambda x: x[start:end], batch)  # CHANGED: tree_map
            # Calculate gradients and metrics for the minibatch.
            (_, step_metrics), step_grads = grad_fn(
                state.params, state.apply_fn, minibatch, rngs[minibatch_idx]
            )
            # Accumulate gradients and metrics across minibatches.
            if grads is None:
                grads = step_grads
                metrics = step_metrics
            else:
                grads = jax.tree_util.tree_map(jnp.add, grads, step_grads)  # CHANGED: tree_map
                metrics = jax.tree_util.tree_map(jnp.add, metrics, step_metrics)  # CHANGED
    # Average gradients over minibatches.
    grads = jax.tree_util.tree_map(lambda g: g / num_minibatches, grads)  # CHANGED: tree_map
    return grads, metrics


def accumulate_gradients_scan(
    state: TrainState,
    batch: Batch,
    rng: jax.random.PRNGKey,
    num_minibatches: int,
    loss_fn: Callable,
) -> Tuple[PyTree, Metrics]:
    batch_size = batch.inputs.shape[0]
    minibatch_size = batch_size // num_minibatches
    rngs = jax.random.split(rng, num_minibatches)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def _minibatch_step(minibatch_idx: jax.Array | int) -> Tuple[PyTree, Metrics]:
        """Determine gradients and metrics for a single minibatch."""
        minibatch = jax.tree_util.tree_map(  # CHANGED: jax.tree_map -> jax.tree_util.tree_map
            lambda x: jax.lax.dynamic_slice_in_dim(  # Slicing with variable index (jax.Array).
                x, start_index=minibatch_idx * minibatch_size, slice_size=minibatch_size, axis=0
            ),
            batch,
        )
        (_, step_metrics), step_grads = grad_fn(
            state.params, state.apply_fn, minibatch, rngs[minibatch_idx]
        )
        return step_grads, step_metrics

    def _scan_step(
        carry: Tuple[PyTree, Metrics], minibatch_idx: jax.Array | int
    ) -> Tuple[Tuple[PyTree, Metrics], None]:
        """Scan step function for looping over minibatches."""
        step_grads, step_metrics = _minibatch_step(minibatch_idx)
        carry = jax.tree_util.tree_map(jnp.add, carry, (step_grads, step_metrics))  # CHANGED
        return carry, None

    # Determine initial shapes for gradients and metrics.
    grads_shapes, metrics_shape = jax.eval_shape(_minibatch_step, 0)
    grads = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), grads_shapes)  # CHANGED
    metrics = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), metrics_shape)  # CHANGED
    # Loop over minibatches to determine gradients and metrics.
    (grads, metrics), _ = jax.lax.scan(
        _scan_step, init=(grads, metrics), xs=jnp.arange(num_minibatches), length=num_minibatches
    )
    # Average gradients over minibatches.
    grads = jax.tree_util.tree_map(lambda g: g / num_minibatches, grads)  # CHANGED: tree_map
    return grads, metrics


def accumulate_gradients(*args, use_scan: bool = False, **kwargs) -> Tuple[PyTree, Metrics]:
    if use_scan:
        return accumulate_gradients_scan(*args, **kwargs)
    else:
        return accumulate_gradients_loop(*args, **kwargs)


def print_metrics(metrics: Metrics, title: str | None = None) -> None:
    """Prints metrics with an optional title."""
    metrics = jax.device_get(metrics)
    lines = [f"{k}: {v[0] / v[1]:.6f}" for k, v in metrics.items()]
    if title:
        title = f" {title} "
        max_len = max(len(title), max(map(len, lines)))
        lines = [title.center(max_len, "=")] + lines
    print("\n".join(lines))


# ---------------------------------------------------------------------------------------------
# Part 1.2: the Transformer.
# ---------------------------------------------------------------------------------------------
class MLPBlock(nn.Module):
    config: ConfigDict
    train: bool

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        input_features = x.shape[-1]
        x = nn.LayerNorm(dtype=self.config.dtype, name="pre_norm")(x)
        x = nn.Dense(
            features=self.config.mlp_expansion * input_features,
            dtype=self.config.dtype,
            name="input_layer",
        )(x)
        x = nn.gelu(x)
        x = nn.Dense(
            features=input_features,
            dtype=self.config.dtype,
            name="output_layer",
        )(x)
        x = nn.Dropout(rate=self.config.dropout_rate, deterministic=not self.train)(x)
        return x


def dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array | None,
    softmax_dtype: jnp.dtype = jnp.float32,
):
    num_features = query.shape[-1]
    dtype = query.dtype
    scale = num_features**-0.5
    query = query * scale
    # Switch dtype right before the dot-product for numerical stability.
    query = query.astype(softmax_dtype)
    key = key.astype(softmax_dtype)
    weights = jnp.einsum("...qhd,...khd->...hqk", query, key)
    if mask is not None:
        weights = jnp.where(mask, weights, jnp.finfo(softmax_dtype).min)
    weights = nn.softmax(weights, axis=-1)
    # After softmax, switch back to the original dtype
    weights = weights.astype(dtype)
    new_vals = jnp.einsum("...hqk,...khd->...qhd", weights, value)
    new_vals = new_vals.astype(dtype)
    return new_vals


class AttentionBlock(nn.Module):
    config: ConfigDict
    mask: jax.Array | None
    train: bool

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        input_features = x.shape[-1]
        x = nn.LayerNorm(dtype=self.config.dtype, name="pre_norm")(x)
        qkv = nn.DenseGeneral(
            features=(self.config.num_heads, self.config.head_dim * 3),
            dtype=self.config.dtype,
            name="qkv",
        )(x)
        q, k, v = jnp.split(qkv, 3, axis=-1)
        x = dot_product_attention(q, k, v, mask=self.mask, softmax_dtype=self.config.softmax_dtype)
        x = nn.DenseGeneral(
            features=input_features,
            axis=(-2, -1),
            dtype=self.config.dtype,
            name="output_layer",
        )(x)
        x = nn.Dropout(rate=self.config.dropout_rate, deterministic=not self.train)(x)
        return x


class TransformerBlock(nn.Module):
    config: ConfigDict
    mask: jax.Array | None
    train: bool

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        # MLP block
        mlp = MLPBlock
        if "MLP" in self.config.remat:
            mlp = nn.remat(mlp, prevent_cse=False)
        x = x + mlp(config=self.config, train=self.train, name="mlp")(x)
        # Attention block
        attn = AttentionBlock
        if "Attn" in self.config.remat:
            attn = nn.remat(attn, prevent_cse=False)
        x = x + attn(config=self.config, mask=self.mask, train=self.train, name="attn")(x)
        return x


class Transformer(nn.Module):
    config: ConfigDict

    @nn.compact
    def __call__(
        self, x: jax.Array, mask: jax.Array | None = None, train: bool = True
    ) -> jax.Array:
        if mask is None and self.config.causal_mask:
            mask = nn.make_causal_mask(x, dtype=jnp.bool_)
        # Input layer.
        x = nn.Embed(
            num_embeddings=self.config.vocab_size,
            features=self.config.hidden_size,
            dtype=self.config.dtype,
            name="embed",
        )(x)
        pos_emb = self.param(
            "pos_emb",
            nn.initializers.normal(stddev=0.02),
            (self.config.max_seq_len, self.config.hidden_size),
        )
        pos_emb = pos_emb.astype(self.config.dtype)
        x = x + pos_emb[None, : x.shape[1]]
        # Transformer blocks.
        block_fn = functools.partial(TransformerBlock, config=self.config, mask=mask, train=train)
        if "Block" in self.config.remat:
            block_fn = nn.remat(block_fn, prevent_cse=False)
        if self.config.scan_layers:
            block = block_fn(name="block")
            x, _ = nn.scan(
                lambda module, carry, _: (module(carry), None),
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                length=self.config.num_layers,
            )(block, x, ())
        else:
            for l_idx in range(self.config.num_layers):
                x = block_fn(name=f"block_{l_idx}")(x)
        # Output layer.
        x = nn.LayerNorm(dtype=self.config.dtype, name="post_norm")(x)
        x = nn.Dense(
            features=self.config.num_outputs,
            dtype=self.config.dtype,
            name="output_layer",
        )(x)
        x = x.astype(jnp.float32)
        return x


def next_token_pred_loss(
    params: PyTree, apply_fn: Any, batch: Batch, rng: jax.Array
) -> Tuple[PyTree, Metrics]:
    """Next token prediction loss function."""
    logits = apply_fn({"params": params}, batch.inputs, train=True, rngs={"dropout": rng})
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)
    correct_pred = jnp.equal(jnp.argmax(logits, axis=-1), batch.labels)
    batch_size = np.prod(batch.labels.shape)
    step_metrics = {"loss": (loss.sum(), batch_size), "accuracy": (correct_pred.sum(), batch_size)}
    loss = loss.mean()
    return loss, step_metrics


def make_train_step_transformer(config: ConfigDict):
    """The tutorial's train_step_transformer; it reads `config` as a global, here a closure."""

    @functools.partial(
        jax.jit,
        donate_argnames=(
            "state",
            "metrics",
        ),
    )
    def train_step_transformer(
        state: TrainState,
        metrics: Metrics | None,
        batch: Batch,
    ) -> Tuple[TrainState, Metrics]:
        # Split the random number generator for the current step.
        rng, step_rng = jax.random.split(state.rng)
        # Determine gradients and metrics for the full batch.
        grads, step_metrics = accumulate_gradients(
            state,
            batch,
            step_rng,
            config.optimizer.num_minibatches,
            loss_fn=next_token_pred_loss,
            use_scan=True,
        )
        # Optimizer step.
        new_state = state.apply_gradients(grads=grads, rng=rng)
        # Accumulate metrics across training steps.
        if metrics is None:
            metrics = step_metrics
        else:
            metrics = jax.tree_util.tree_map(jnp.add, metrics, step_metrics)  # CHANGED: tree_map
        return new_state, metrics

    return train_step_transformer


# ---------------------------------------------------------------------------------------------
# Golden-file generation.
# ---------------------------------------------------------------------------------------------
NUM_TRAIN_STEPS = 5
SCHEDULE = dict(init_value=0.0, peak_value=1e-2, warmup_steps=2, transition_steps=1, decay_rate=0.99)
ADAM = dict(b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0)


def make_config(dtype, num_minibatches: int) -> ConfigDict:
    data_config = ConfigDict(dict(batch_size=8, seq_len=32, vocab_size=97))
    model_config = ConfigDict(
        dict(
            hidden_size=64,
            dropout_rate=0.0,
            mlp_expansion=4,
            num_layers=2,
            head_dim=16,
            causal_mask=True,
            max_seq_len=data_config.seq_len,
            vocab_size=data_config.vocab_size,
            num_outputs=data_config.vocab_size,
            dtype=dtype,
            softmax_dtype=jnp.float32,
            scan_layers=True,
            remat=(),
        )
    )
    model_config.num_heads = model_config.hidden_size // model_config.head_dim
    optimizer_config = ConfigDict(dict(learning_rate=SCHEDULE["peak_value"], num_minibatches=num_minibatches))
    return ConfigDict(dict(model=model_config, optimizer=optimizer_config, data=data_config, seed=42))


def config_json(config: ConfigDict, with_dtype: bool) -> dict:
    m = config.model
    model = dict(
        hidden_size=m.hidden_size, dropout_rate=m.dropout_rate, mlp_expansion=m.mlp_expansion,
        num_layers=m.num_layers, head_dim=m.head_dim, num_heads=m.num_heads,
        causal_mask=m.causal_mask, max_seq_len=m.max_seq_len, vocab_size=m.vocab_size,
        num_outputs=m.num_outputs, softmax_dtype="float32", scan_layers=m.scan_layers,
        remat=list(m.remat), param_dtype="float32",
    )
    if with_dtype:
        model["dtype"] = jnp.dtype(m.dtype).name
    out = dict(
        model=model,
        data=dict(config.data.to_dict(), minval=1, maxval=config.data.vocab_size,
                  tokens="jax.random.randint(PRNGKey(0), (batch_size, seq_len), 1, vocab_size)",
                  inputs="pad(tokens[:, :-1], ((0,0),(1,0)), constant_values=0)", labels="tokens"),
        seed=config.seed,
        init="model_rng, state_rng = split(PRNGKey(seed)); "
             "model.init(model_rng, inputs[:batch_size // num_minibatches], train=False)",
    )
    if with_dtype:
        out["optimizer"] = dict(num_minibatches=config.optimizer.num_minibatches)
    return out


def flatten(tree: PyTree, prefix: str = "") -> Dict[str, np.ndarray]:
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = "/".join(p.key for p in path)
        out[prefix + name] = np.ascontiguousarray(np.asarray(leaf))
    return out


def save_file(tensors: Dict[str, np.ndarray], path: str, metadata: Dict[str, str]) -> None:
    """Writes a safetensors file deterministically, then checks it with the safetensors library.

    safetensors.numpy.save_file orders "__metadata__" through a Rust HashMap, so its bytes vary
    between runs; this writer sorts everything (tensors by name, metadata keys) so regenerating
    the goldens gives identical files. Layout as the spec: u64 LE header size, JSON header
    padded with spaces to a multiple of 8, then the little-endian row-major tensor data.
    """
    dtypes = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}
    header: Dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    offset, blobs = 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtypes[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)
    with safe_open(path, framework="numpy") as f:
        assert f.metadata() == metadata
        assert sorted(f.keys()) == sorted(tensors)
        for name in tensors:
            got = f.get_tensor(name)
            assert got.dtype == tensors[name].dtype and np.array_equal(got, tensors[name]), name


def f9(x) -> str:
    return f"{float(x):.9g}"


def make_batch(config: ConfigDict) -> Batch:
    tokens = jax.random.randint(
        jax.random.PRNGKey(0),
        (config.data.batch_size, config.data.seq_len),
        1,
        config.data.vocab_size,
    )
    return Batch(
        inputs=jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)), constant_values=0),
        labels=tokens,
    )


def make_optimizer():
    return optax.adam(
        learning_rate=optax.warmup_exponential_decay_schedule(**SCHEDULE), **ADAM
    )


def schedule_description() -> str:
    sched = optax.warmup_exponential_decay_schedule(**SCHEDULE)
    lrs = [float(sched(i)) for i in range(NUM_TRAIN_STEPS)]
    return json.dumps(dict(
        optimizer="optax.adam",
        **ADAM,
        learning_rate=dict(name="optax.warmup_exponential_decay_schedule", **SCHEDULE,
                           transition_begin=0, staircase=False, end_value=None),
        lr_per_step=lrs,
        note="step i (0-based) of the 5 train steps uses lr_per_step[i]; adam bias correction "
             "uses count i+1",
    ))


def init_params(dtype, num_minibatches):
    config = make_config(dtype, num_minibatches)
    model = Transformer(config=config.model)
    batch = make_batch(config)
    model_rng, state_rng = jax.random.split(jax.random.PRNGKey(config.seed))
    params = model.init(
        model_rng,
        batch.inputs[: config.data.batch_size // config.optimizer.num_minibatches],
        train=False,
    )["params"]
    return config, model, batch, params, state_rng


def run_variant(dtype, num_minibatches, params, out_dir):
    config = make_config(dtype, num_minibatches)
    model = Transformer(config=config.model)
    batch = make_batch(config)
    _, state_rng = jax.random.split(jax.random.PRNGKey(config.seed))

    def fresh_state():
        # Copies, because train_step_transformer donates its state.
        return TrainState.create(
            apply_fn=model.apply,
            params=jax.tree_util.tree_map(jnp.copy, params),
            tx=make_optimizer(),
            rng=jnp.copy(state_rng),
        )

    # The first line of train_step_transformer, on the initial state: the averaged grads that
    # state.apply_gradients receives in step 1.
    @jax.jit
    def first_grads(state):
        rng, step_rng = jax.random.split(state.rng)
        return accumulate_gradients(
            state, batch, step_rng, config.optimizer.num_minibatches,
            loss_fn=next_token_pred_loss, use_scan=True,
        )

    grads, metrics0 = first_grads(fresh_state())
    grads = jax.device_get(grads)
    metrics0 = jax.device_get(metrics0)

    train_step_transformer = make_train_step_transformer(config)
    state = fresh_state()
    losses, accuracies = [], []
    for _ in range(NUM_TRAIN_STEPS):
        state, metrics = train_step_transformer(state, None, batch)
        metrics = jax.device_get(metrics)
        losses.append(float(metrics["loss"][0] / metrics["loss"][1]))
        accuracies.append(float(metrics["accuracy"][0] / metrics["accuracy"][1]))
        if len(losses) == 1:
            print_metrics(metrics, f"{jnp.dtype(dtype).name} mb{num_minibatches} step 1")

    loss_first = metrics0["loss"][0] / metrics0["loss"][1]
    acc_first = metrics0["accuracy"][0] / metrics0["accuracy"][1]
    # The train step's own step-1 metrics must match the separately computed ones.
    assert f9(loss_first) == f9(losses[0]), (loss_first, losses[0])

    name = f"transformer_{jnp.dtype(dtype).name}_mb{num_minibatches}.safetensors"
    tensors = flatten(grads, prefix="grad/")
    for k, v in tensors.items():
        assert v.dtype == np.float32, (k, v.dtype)
    metadata = {
        "config": json.dumps(config_json(config, with_dtype=True)),
        "loss_first": f9(loss_first),
        "loss_sum_first": f9(metrics0["loss"][0]),
        "count_first": str(int(metrics0["loss"][1])),
        "accuracy_first": f9(acc_first),
        "losses": json.dumps([float(f9(x)) for x in losses]),
        "accuracies": json.dumps([float(f9(x)) for x in accuracies]),
        "schedule": schedule_description(),
        "grads": "mean over minibatches of d(mean token loss of the minibatch)/d(params), "
                 "as returned by accumulate_gradients (before the optimizer)",
    }
    save_file(tensors, os.path.join(out_dir, name), metadata=metadata)
    return name, float(loss_first), losses


# ---------------------------------------------------------------------------------------------
# optax.json
# ---------------------------------------------------------------------------------------------
def to_list(x):
    """float32 arrays as nested lists of Python floats (exact float32 values, repr precision)."""
    a = np.asarray(x)
    if a.dtype == np.float32 or a.dtype == np.float64:
        return np.asarray(a, dtype=np.float32).astype(np.float64).tolist()
    return a.tolist()


def tree_to_lists(tree):
    return {k: to_list(v) for k, v in tree.items()}


def optax_goldens() -> dict:
    steps = [0, 1, 5, 9, 10, 11, 15, 50, 99, 100, 150]
    sched_specs = {
        "warmup_cosine_decay": ("warmup_cosine_decay_schedule", dict(
            init_value=0.0, peak_value=1e-3, warmup_steps=10, decay_steps=100, end_value=1e-4,
            exponent=1.0)),
        "warmup_exponential_decay": ("warmup_exponential_decay_schedule", dict(
            init_value=0.0, peak_value=4e-4, warmup_steps=10, transition_steps=1, decay_rate=0.99)),
        "warmup_exponential_decay_staircase": ("warmup_exponential_decay_schedule", dict(
            init_value=1e-4, peak_value=1e-3, warmup_steps=5, transition_steps=3, decay_rate=0.5,
            transition_begin=4, staircase=True, end_value=2e-4)),
    }
    schedules = {}
    for key, (fn_name, kwargs) in sched_specs.items():
        fn = getattr(optax, fn_name)(**kwargs)
        values = [to_list(fn(jnp.asarray(s, dtype=jnp.int32))) for s in steps]
        schedules[key] = dict(fn=f"optax.{fn_name}", kwargs=kwargs, values=values)

    k = jax.random.split(jax.random.PRNGKey(1234), 5)
    params = {
        "kernel": jax.random.normal(k[0], (3, 4), jnp.float32),
        "bias": jax.random.normal(k[1], (4,), jnp.float32) * 0.1,
        "embedding": jax.random.normal(k[2], (5, 3), jnp.float32),
    }
    grads_seq = [
        {n: jax.random.normal(jax.random.fold_in(k[3 + i], j), v.shape, jnp.float32) * 0.5
         for j, (n, v) in enumerate(sorted(params.items()))}
        for i in range(2)
    ]
    mask = {"kernel": True, "bias": False, "embedding": False}
    optimizers = {
        "sgd": ("optax.sgd(0.1)", optax.sgd(0.1)),
        "sgd_momentum": ("optax.sgd(0.1, momentum=0.9)", optax.sgd(0.1, momentum=0.9)),
        "adam": ("optax.adam(1e-2)", optax.adam(1e-2)),
        "adamw": ("optax.adamw(1e-2, weight_decay=0.1)", optax.adamw(1e-2, weight_decay=0.1)),
        "adamw_masked": (
            "optax.adamw(1e-2, weight_decay=0.1, mask={'kernel': True, 'bias': False, "
            "'embedding': False})",
            optax.adamw(1e-2, weight_decay=0.1, mask=mask)),
    }

    def run_two(tx, grads_list):
        p = params
        st = tx.init(p)
        out = []
        for g in grads_list:
            upd, st = tx.update(g, st, p)
            p = optax.apply_updates(p, upd)
            out.append(dict(updates=tree_to_lists(upd), params=tree_to_lists(p)))
        return out

    opt_out = {}
    for key, (desc, tx) in optimizers.items():
        opt_out[key] = dict(optimizer=desc, steps=run_two(tx, grads_seq))

    # chain(clip_by_global_norm(1.0), adam(1e-2)): norm > 1 (grads as above have norm ~3)
    # and norm < 1 (the same grads scaled by 0.05).
    clip_out = {}
    for key, scale in (("norm_above_1", 1.0), ("norm_below_1", 0.05)):
        gl = [{n: v * scale for n, v in g.items()} for g in grads_seq]
        norms = [float(optax.global_norm(g)) for g in gl]
        assert (norms[0] > 1) == (scale == 1.0) and (norms[1] > 1) == (scale == 1.0), norms
        tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
        clip_out[key] = dict(
            optimizer="optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))",
            grad_scale=scale,
            grads=[tree_to_lists(g) for g in gl],
            global_norms=norms,
            steps=run_two(tx, gl),
        )

    return {
        "about": "Optax reference values (see tests/golden/README.md). Floats are float32 "
                 "values written as the shortest repr of the equivalent double, so they are "
                 "exact. Schedules are evaluated at int32 steps; every optimizer case starts "
                 "from `params` and applies `grads[0]` then `grads[1]`; steps[i].updates is "
                 "what tx.update returned, steps[i].params = optax.apply_updates(previous, "
                 "updates).",
        "versions": dict(jax=jax.__version__, optax=optax.__version__),
        "schedule_steps": steps,
        "schedules": schedules,
        "params": tree_to_lists(params),
        "grads": [tree_to_lists(g) for g in grads_seq],
        "adamw_mask": mask,
        "optimizers": opt_out,
        "clip_by_global_norm": clip_out,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "golden"))
    args = ap.parse_args()
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)

    # Params: initialised once. Check that neither the dtype nor the minibatch shape used by
    # init changes them (params are float32 in every variant, as in the tutorial).
    config, _, batch, params, _ = init_params(jnp.float32, 2)
    for dt, mb in ((jnp.float32, 1), (jnp.bfloat16, 1), (jnp.bfloat16, 2)):
        other = init_params(dt, mb)[3]
        same = jax.tree_util.tree_map(lambda a, b: bool(jnp.array_equal(a, b)), params, other)
        assert all(jax.tree_util.tree_leaves(same)), f"init differs for {dt} mb{mb}"
    tensors = flatten(params)
    for k, v in tensors.items():
        assert v.dtype == np.float32, (k, v.dtype)
    tensors["batch/inputs"] = np.asarray(batch.inputs, dtype=np.int32)
    tensors["batch/labels"] = np.asarray(batch.labels, dtype=np.int32)
    save_file(tensors, os.path.join(out_dir, "transformer_init.safetensors"),
              metadata={"config": json.dumps(config_json(config, with_dtype=False)),
                        "versions": json.dumps(dict(jax=jax.__version__, flax=__import__("flax").__version__,
                                                    optax=optax.__version__))})
    n_params = sum(int(np.prod(v.shape)) for k, v in tensors.items() if not k.startswith("batch/"))
    print(f"transformer_init.safetensors: {n_params:_} params")

    summary = []
    for dtype in (jnp.float32, jnp.bfloat16):
        for mb in (1, 2):
            name, loss_first, losses = run_variant(dtype, mb, params, out_dir)
            summary.append((name, loss_first, losses))
    for name, loss_first, losses in summary:
        print(f"{name}: loss_first={loss_first:.9g} losses={[f'{x:.6f}' for x in losses]}")

    with open(os.path.join(out_dir, "optax.json"), "w") as f:
        json.dump(optax_goldens(), f, indent=1)
        f.write("\n")
    print("optax.json written")


if __name__ == "__main__":
    sys.exit(main())
