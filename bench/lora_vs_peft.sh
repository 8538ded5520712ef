#!/usr/bin/env bash
# LoRA against full fine-tuning and PyTorch + PEFT (issue 30, point 6): bench/lora_vs_peft.py,
# with the PyTorch, transformers and PEFT of the venv .venv-bench-lora (made here when missing).
#
#   bash bench/lora_vs_peft.sh [--shape 1b|1b-4layers|small] [--repeats 2] [--steps 4] [--skip compile]
#   LORA_BENCH_PYTHON=path/to/python bash bench/lora_vs_peft.sh ...   # a python that has them already
#
# Needs build/loom (built by scripts/build.sh when missing). The 1b shape's full fine-tuning needs
# about 24 GB (float32 masters and two moments): the default, 1b-4layers, keeps Llama-3.2-1B's
# widths and vocabulary with 4 of its 16 layers.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$root"
[[ -x build/loom ]] || bash scripts/build.sh
# shellcheck source=tools/venv.sh
source "$root/tools/venv.sh"
py=$(venv_python LORA_BENCH_PYTHON "torch, transformers, peft" "$root/.venv-bench-lora" \
  torch==2.15.0 transformers==5.23.0 peft==0.21.2)
exec python3 "$here/lora_vs_peft.py" --torch-python "$py" "$@"
