#!/usr/bin/env python3
"""PyTorch DDP peer for loom's data-parallel scaling bench (bench/scaling.py).

torch_gpt.py's bench step (nanoGPT's model, forward + backward + clip + AdamW + zero_grad, on a
fixed random batch), with the model wrapped in torch.nn.parallel.DistributedDataParallel over
torch.distributed's gloo backend on CPU, --threads (default 1) threads per rank. The global batch
(--batch sequences, drawn as torch_gpt.py bench draws it) is split over the N ranks: rank r trains on
sequences [r B/N, (r+1) B/N), so a step covers the same tokens at every N, as loom's
`mpirun -np N loom train` does, and DDP's mean of the gradients equals the whole batch's gradient.
N = 1 is DDP too (a one-rank process group), so that the scaling efficiency compares like with like.

  torch_ddp.py --ranks 2 --n-layer 4 --n-head 4 --n-embd 128 --vocab 65 --block 64
               --batch 12 --seq 64 --steps 40 --warmup 5
      spawns 2 rank processes (MASTER_ADDR=127.0.0.1, a free port) and prints one JSON object
  torchrun --nproc-per-node 2 torch_ddp.py ...
      the same ranks launched by torchrun (its RANK/WORLD_SIZE/MASTER_* variables); rank 0 prints

Each step is timed on every rank from its start to loss.item() after the optimizer step; the ranks
meet at a barrier before the first timed step and then at every step's gradient sum, as loom's do.
step_time_s is rank 0's times (what loom's metrics file holds under mpirun), step_time_s_per_rank
every rank's, losses the global batch's mean loss (the mean over ranks of their shards' losses).

Run it with OMP_WAIT_POLICY=PASSIVE, as torch_gpt.py.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import add_model_args, build_model, env_info, random_batch, train_step  # noqa: E402


def rank_main(args, rank, world, wrap, framework):
    """One rank: its shard of the batch, the model as wrap(model) makes it, the timed steps."""
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = build_model(args)  # the same weights on every rank; DDP also broadcasts rank 0's
    params, params_no_pos = sum(p.numel() for p in model.parameters()), model.get_num_params(non_embedding=True)
    x, y = random_batch(args)
    per = args.batch // world
    x, y = x[rank * per:(rank + 1) * per].contiguous(), y[rank * per:(rank + 1) * per].contiguous()
    ddp = wrap(model)
    # After wrapping: a wrapper that shards (FSDP2) replaces the parameters with its own.
    opt = model.configure_optimizers(args.weight_decay, args.lr, (args.beta1, args.beta2), "cpu")

    times, losses = [], []
    for it in range(args.warmup + args.steps):
        if it == args.warmup:
            dist.barrier()  # the timed steps start together; warm-up skew does not leak into step 1
        t0 = time.perf_counter()
        losses.append(train_step(ddp, opt, x, y, args.grad_clip))
        times.append(time.perf_counter() - t0)

    # After the timed loop, so the gathers cost no step anything.
    all_times = [torch.zeros(len(times), dtype=torch.float64) for _ in range(world)]
    dist.all_gather(all_times, torch.tensor(times, dtype=torch.float64))
    mean_loss = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(mean_loss)
    if rank == 0:
        print(json.dumps(dict(
            framework=framework,
            mode="bench",
            ranks=world,
            backend=dist.get_backend(),
            batch_per_rank=per,
            params=params,
            params_no_pos=params_no_pos,
            step_time_s=times,
            step_time_s_per_rank=[t.tolist() for t in all_times],
            warmup=args.warmup,
            losses=(mean_loss / world).tolist(),
            env=env_info(args.threads),
        )), flush=True)
    # Leave together and skip gloo's teardown: destroy_process_group aborted a rank now and then
    # ("terminate called without an active exception", about one run in three here) after every
    # result was in.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(args):
    """Starts --ranks processes of this script as ranks 0..N-1 and prints rank 0's JSON. A rank that
    fails ends the others (they would wait for it at the next collective until gloo's timeout)."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(args.ranks),
               OMP_NUM_THREADS=str(args.threads))
    out = tempfile.TemporaryFile(mode="w+")  # not a pipe: nobody reads it while the ranks run
    procs = [subprocess.Popen([sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=out if r == 0 else subprocess.DEVNULL)
             for r in range(args.ranks)]
    while any(p.poll() is None for p in procs) and all(p.poll() in (None, 0) for p in procs):
        time.sleep(0.05)
    failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    if failed:
        sys.exit(f"{os.path.basename(sys.argv[0])}: rank {failed[0]} failed (exit {procs[failed[0]].returncode}); its stderr is above")
    out.seek(0)
    sys.stdout.write(out.read())


def main(wrap=DistributedDataParallel, framework="pytorch-ddp", doc=__doc__):
    """The peer's command line: spawns the ranks, or is one (under spawn or torchrun)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap, threads=1)
    ap.add_argument("--ranks", type=int, default=2, help="processes to spawn (ignored under torchrun)")
    args = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", args.ranks))
    if args.batch % world:
        sys.exit(f"{os.path.basename(sys.argv[0])}: --batch {args.batch} does not split over {world} ranks; give a multiple of {world}")
    if "RANK" in os.environ:
        rank_main(args, int(os.environ["RANK"]), world, wrap, framework)
    else:
        spawn(args)


if __name__ == "__main__":
    main()
