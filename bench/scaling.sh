#!/usr/bin/env bash
# loom's data-parallel scaling next to PyTorch DDP (bench/scaling.py says what it runs and writes):
#
#   bash bench/scaling.sh                          # shapes b and c, 2 rounds
#   bash bench/scaling.sh --repeats 1 --only b --steps 5   # a quick check that everything runs
#   bash bench/scaling.sh --suite zero3            # optimizer.shard=params against FSDP2 at 2 ranks
#   bash bench/scaling.sh --suite zero3 --quick    # one round of 2 steps: a smoke run
#   TORCH_PYTHON=path/to/python bash bench/scaling.sh      # a python that has torch (gloo) and numpy
#
# Needs build/loom (built by scripts/build.sh when missing), mpirun (Open MPI) and PyTorch: the
# python in $TORCH_PYTHON, else .venv-bench/bin/python, made here with tools/venv.sh's make_venv and
# the pins below when it lacks torch (needs pip's configured package index; torch's default Linux
# build brings CUDA libraries too, which this CPU bench does not use).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

pins=(torch==2.15.0 numpy==2.4.6)

if [[ ! -x build/loom ]]; then
  echo "== build/loom missing: building (scripts/build.sh)"
  bash scripts/build.sh
fi
if ! command -v mpirun >/dev/null 2>&1; then
  echo "bench/scaling.sh: mpirun missing; install Open MPI (scripts/install-deps.sh)" >&2
  exit 2
fi
# shellcheck source=tools/venv.sh
source "$root/tools/venv.sh"
torch_py=$(venv_python TORCH_PYTHON "torch, numpy" "$root/.venv-bench" "${pins[@]}")
export CUDA_VISIBLE_DEVICES=""
exec python3 bench/scaling.py --torch-python "$torch_py" "$@"
