#!/usr/bin/env bash
# loom's model.remat = auto against its hand sweep, torch.compile and the JAX tutorial at equal memory
# (issue 32 point 4): makes the peers' venv .venv-bench as bench/run.sh does (PyTorch 2.15 and the JAX/Flax
# pins of tools/make_goldens.sh; BENCH_PYTHON=path/to/python uses another python that has them), then
# runs bench/remat_budget.py with the given flags. Prints a markdown table; writes bench/results/remat_budget.json.
#
#   bash bench/remat_budget.sh --only tutorial            # the tutorial Transformer, reduced batch
#   bash bench/remat_budget.sh --quick                    # smoke run
#   LOOM=path/to/loom bash bench/remat_budget.sh          # another loom binary (default build/loom)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$root"

loom="${LOOM:-$root/build/loom}"
[[ -x "$loom" ]] || { echo "remat_budget: $loom missing; build loom first (or set LOOM)" >&2; exit 2; }

jax_pins=$(sed -n '/^pins=(/,/^)/p' "$root/tools/make_goldens.sh" | grep -v -e '^pins=(' -e '^)' | tr -d ' ')
# shellcheck source=tools/venv.sh
source "$root/tools/venv.sh"
# shellcheck disable=SC2086
py=$(venv_python BENCH_PYTHON "torch, numpy, jax, flax, optax, ml_collections" "$root/.venv-bench" \
                 torch==2.15.0 $jax_pins)

uptime
exec python3 "$here/remat_budget.py" --loom "$loom" --torch-python "$py" --jax-python "$py" "$@"
