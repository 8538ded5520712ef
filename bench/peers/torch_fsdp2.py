#!/usr/bin/env python3
"""PyTorch FSDP2 peer for loom's ZeRO-3 bench (bench/scaling.py --suite zero3).

torch_ddp.py's ranks, batch split, timing and JSON, with the model sharded by FSDP2
(torch.distributed.fsdp.fully_shard, gloo, CPU) instead of wrapped in DDP: each transformer block
is its own FSDP unit and the root module (embeddings, final norm, tied head) another, with
reshard_after_forward left at its default (True): each unit's parameters are all-gathered before
its forward, freed after it and gathered again for its backward; gradients are reduce-scattered.
That is what loom's optimizer.shard = params does (per parameter, not per block). AdamW (unfused,
as the DDP peer's) then updates each rank's shards; clip_grad_norm_ takes the whole gradient's norm.

  torch_fsdp2.py --ranks 2 --n-layer 4 --n-head 4 --n-embd 128 --vocab 65 --block 64
                 --batch 12 --seq 64 --steps 40 --warmup 5

Run it with OMP_WAIT_POLICY=PASSIVE, as torch_gpt.py.
"""
import os
import sys

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ddp import main  # noqa: E402


def shard(model):
    """FSDP2 units: every block, then the root (torchtitan's and the FSDP2 tutorial's wrapping)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


if __name__ == "__main__":
    main(shard, "pytorch-fsdp2", __doc__)
