#!/usr/bin/env bash
# loom's CPU training-speed benchmark (docs/performance.md): loom against today's PyTorch 2.x (eager
# and torch.compile, float32 and bfloat16 autocast, SDPA, fused AdamW; nanoGPT's model) at shapes
# a-c and the tutorial's JAX/Flax model at d, with the machine's float32 and bfloat16 matmul
# ceilings, in one run, interleaved. Prints the verdicts and a table; writes bench/results/latest.json.
#
#   bash bench/run.sh                    # every shape, both dtypes (~25 min on a quiet 2-core machine)
#   bash bench/run.sh --only b,d         # some shapes
#   bash bench/run.sh --repeats 1        # each (shape, implementation) timed once instead of twice
#   bash bench/run.sh --isa avx2,native  # also the AVX2-only mode (bench/bench.py --help)
#   bash bench/run.sh --debian-torch /usr/bin/python3   # Debian's PyTorch 1.13 as an extra column
#   LOOM=path/to/loom bash bench/run.sh  # another loom binary for the native mode (default build/loom)
#
# Needs: build/loom (built by scripts/build.sh when missing), g++, oneDNN and OpenBLAS (OpenMP build;
# installed with apt-get when missing and running as root), and the venv .venv-bench with the pins
# below: PyTorch 2.15 and the JAX/Flax/Optax of tools/make_goldens.sh. It is made here when missing
# (pip's configured package index; torch's default Linux build brings CUDA libraries too, which this
# CPU benchmark does not use). BENCH_PYTHON=path/to/python uses another python that has them all.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$root"

torch_pins=(torch==2.15.0)

loom="${LOOM:-$root/build/loom}"
if [[ ! -x "$loom" ]]; then
  echo "== build/loom missing: building (scripts/build.sh)"
  bash scripts/build.sh
fi

# The machine's ceilings: sgemm (OpenBLAS and oneDNN), oneDNN's bf16 matmul, STREAM triad.
mkdir -p "$here/build"
ARCH_LIB=/usr/lib/x86_64-linux-gnu/openblas-openmp
ARCH_INC=/usr/include/x86_64-linux-gnu/openblas-openmp
if [[ ! -e "$ARCH_LIB/libopenblas.so" ]]; then
  if [[ $(id -u) -eq 0 ]]; then
    echo "== installing libopenblas-openmp-dev (apt-get)"
    apt-get install -y -qq libopenblas-openmp-dev >/dev/null
  else
    echo "bench: OpenBLAS (OpenMP) missing; run: sudo apt-get install -y libopenblas-openmp-dev" >&2
    exit 2
  fi
fi
if [[ ! -x "$here/build/ceiling" || "$here/ceiling.cpp" -nt "$here/build/ceiling" ]]; then
  echo "== building bench/build/ceiling"
  g++ -O3 -mavx2 -mfma -fopenmp -std=c++20 -Wall -Wextra "$here/ceiling.cpp" -I"$ARCH_INC" \
      -I"$root/.deps/onednn/include" -L"$ARCH_LIB" -L"$root/.deps/onednn/lib" \
      -Wl,-rpath,"$ARCH_LIB" -Wl,-rpath,"$root/.deps/onednn/lib" -lopenblas -ldnnl -o "$here/build/ceiling"
fi

# The peers' python: PyTorch 2.x and JAX in one venv.
jax_pins=$(sed -n '/^pins=(/,/^)/p' "$root/tools/make_goldens.sh" | grep -v -e '^pins=(' -e '^)' | tr -d ' ')
# shellcheck source=tools/venv.sh
source "$root/tools/venv.sh"
# shellcheck disable=SC2086
py=$(venv_python BENCH_PYTHON "torch, numpy, jax, flax, optax, ml_collections" "$root/.venv-bench" \
                 "${torch_pins[@]}" $jax_pins)

# torch.compile (inductor) compiles C++ against the venv python's headers.
if ! "$py" -c "import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))" 2>/dev/null; then
  if [[ $(id -u) -eq 0 ]]; then
    echo "== installing python3-dev (apt-get): torch.compile needs Python.h"
    apt-get install -y -qq python3-dev >/dev/null
  else
    echo "bench: Python.h missing for $py (torch.compile needs it); run: sudo apt-get install -y python3-dev" >&2
    exit 2
  fi
fi

# The AVX2-only loom, only when that mode is asked for (incremental; a no-op when up to date).
if [[ " $* " == *avx2* ]]; then
  echo "== bench/build/loom-avx2 (AVX2-only build of the working tree)"
  bash "$here/build_loom_avx2.sh" 2>&1 | tail -n 2
fi

export CUDA_VISIBLE_DEVICES=""
uptime
exec python3 "$here/bench.py" --loom "$loom" --torch-python "$py" --jax-python "$py" "$@"
