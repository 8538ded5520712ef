#!/usr/bin/env bash
# Quick start 1: install what is missing, build, and run the default main job: nanoGPT's CPU
# recipe (4-layer, 128-wide char-level GPT, 2000 steps) on tiny Shakespeare into runs/shakespeare_char,
# logging the validation loss at each evaluation and printing a sample at the end.
# Extra arguments go to `loom train` (e.g. --steps 200).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
if [ ! -f data/shakespeare_char/meta.json ]; then
  ./build/loom prepare char data/tinyshakespeare.txt data/shakespeare_char
fi
exec ./build/loom train configs/shakespeare_char.toml --out runs/shakespeare_char --overwrite "$@"
