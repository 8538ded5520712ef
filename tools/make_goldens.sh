#!/usr/bin/env bash
# Regenerates tests/golden/ from the tutorial's own JAX/Flax/Optax code (tools/jax_golden.py).
#
#   bash tools/make_goldens.sh            # venv in .venv-golden/ (gitignored), CPU-only JAX
#
# The outputs are deterministic: running it twice gives byte-identical files. The pins below
# are the versions the committed goldens were made with; they install and work together on
# Python 3.11. Needs network access to the Python package index (pip's configured index).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-golden"
# shellcheck source=tools/venv.sh
source "$root/tools/venv.sh"

pins=(
  jax==0.10.2
  jaxlib==0.10.2
  flax==0.12.8
  optax==0.2.8
  ml_collections==1.1.0
  ml_dtypes==0.6.0
  safetensors==0.8.0
  numpy==2.4.6
)

make_venv "$venv" "${pins[@]}"

# CPU only, so the goldens do not depend on whatever accelerator this machine has.
export JAX_PLATFORMS=cpu
export CUDA_VISIBLE_DEVICES=""
"$venv/bin/python" "$root/tools/jax_golden.py" --out "$root/tests/golden"
chmod 0644 "$root"/tests/golden/*.safetensors "$root"/tests/golden/optax.json
du -cb "$root"/tests/golden/* | tail -n 1 | awk '{print "make_goldens: tests/golden/ holds " $1 " bytes"}'
