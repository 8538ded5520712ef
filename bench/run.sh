#!/usr/bin/env bash
# loom's CPU training-speed benchmark (docs/performance.md): loom vs PyTorch (nanoGPT's model)
# and vs the tutorial's JAX/Flax model on identical shapes, plus the sgemm ceiling and the triad
# bandwidth, in one run on this machine. Prints a markdown table; writes bench/results/latest.json.
#
#   bash bench/run.sh                    # everything, both ISA modes (~12-14 min on a quiet 2-core machine)
#   bash bench/run.sh --isa avx2         # only the AVX2 mode (the issue's target ISA; ~6-7 min)
#   bash bench/run.sh --only b,d         # some shapes
#   bash bench/run.sh --repeats 1        # each (shape, implementation) timed once instead of twice
#   LOOM=path/to/loom bash bench/run.sh  # another loom binary for the native mode (default build/loom)
#
# ISA modes (this machine has AVX-512; the issue's target has AVX2+FMA only):
#   avx2    every library held to AVX2 (OPENBLAS_CORETYPE=Haswell, ONEDNN_MAX_CPU_ISA=AVX2,
#           ATEN_CPU_CAPABILITY=avx2, XLA_FLAGS=--xla_cpu_max_isa=AVX2) and loom built without
#           -march=native (bench/build_loom_avx2.sh -> bench/build/loom-avx2/loom, rebuilt here
#           incrementally from the working tree);
#   native  no caps: what each implementation picks on this machine, loom as built (build/loom).
#
# Needs: build/loom (built by scripts/build.sh when missing), g++ and OpenBLAS (OpenMP build),
# Debian's python3-torch + python3-numpy for /usr/bin/python3 (installed with apt-get when missing
# and running as root), and the JAX venv .venv-golden (created by tools/make_goldens.sh's pins
# when missing; needs the Python package index).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$root"

loom="${LOOM:-$root/build/loom}"
if [[ ! -x "$loom" ]]; then
  echo "== build/loom missing: building (scripts/build.sh)"
  bash scripts/build.sh
fi

# The machine's ceilings: sgemm through the same OpenBLAS as loom and PyTorch, STREAM triad.
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
      -L"$ARCH_LIB" -Wl,-rpath,"$ARCH_LIB" -lopenblas -ldnnl -o "$here/build/ceiling"
fi

# PyTorch peer: Debian's python3-torch (1.13) for the system Python.
torch_py=/usr/bin/python3
if ! "$torch_py" -c "import torch, numpy" 2>/dev/null; then
  if [[ $(id -u) -eq 0 ]]; then
    echo "== installing python3-torch python3-numpy (apt-get)"
    apt-get install -y -qq python3-torch python3-numpy >/dev/null
  else
    echo "bench: PyTorch missing for $torch_py; run: sudo apt-get install -y python3-torch python3-numpy" >&2
    exit 2
  fi
fi

# JAX peer: the venv of tools/make_goldens.sh (same pins), created when missing.
venv="$root/.venv-golden"
if ! "$venv/bin/python" -c "import jax, flax, optax, ml_collections" 2>/dev/null; then
  echo "== creating the JAX venv $venv (tools/make_goldens.sh's pins)"
  python="${PYTHON:-}"
  if [[ -z "$python" ]]; then
    if command -v python3.11 >/dev/null 2>&1; then python=python3.11; else python=python3; fi
  fi
  [[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
  pins=$(sed -n '/^pins=(/,/^)/p' "$root/tools/make_goldens.sh" | grep -v -e '^pins=(' -e '^)' | tr -d ' ')
  # shellcheck disable=SC2086
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $pins
fi

# The AVX2-only loom for the avx2 mode (incremental; a no-op when up to date).
if [[ " $* " != *" --isa native "* && " $* " != *" --isa=native "* ]]; then
  echo "== bench/build/loom-avx2 (AVX2-only build of the working tree)"
  bash "$here/build_loom_avx2.sh" 2>&1 | tail -n 2
fi

uptime
exec "$torch_py" "$here/bench.py" --loom "$loom" --torch-python "$torch_py" --jax-python "$venv/bin/python" "$@"
