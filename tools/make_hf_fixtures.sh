#!/usr/bin/env bash
# Regenerates tests/golden/hf/ (tools/make_hf_fixtures.py says what is there) with transformers,
# torch, tokenizers and safetensors in their own venv:
#
#   bash tools/make_hf_fixtures.sh        # venv in .venv-hf/ (gitignored), CPU only
#   bash tools/make_hf_fixtures.sh --tokenizers-only
#                                         # only the SentencePiece-style tokenizers and the decode
#                                         # expectations (tools/hf_tokenizer_fixtures.py), with
#                                         # `tokenizers` alone in .venv-tok/
#
# The outputs are deterministic. The pins (hf_pins in tools/venv.sh) are the versions the committed
# fixtures were made with (Python 3.11). Needs network access to the Python package index (pip's
# configured index); the C++ tests that read the fixtures need neither.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-hf"
# shellcheck source=tools/venv.sh
source "$root/tools/venv.sh"

if [[ "${1:-}" == "--tokenizers-only" ]]; then
  make_venv "$root/.venv-tok" "$(printf '%s\n' "${hf_pins[@]}" | grep '^tokenizers==')"
  "$root/.venv-tok/bin/python" "$root/tools/hf_tokenizer_fixtures.py" --out "$root/tests/golden/hf" \
    --shakespeare "$root/data/tinyshakespeare.txt"
  chmod 0644 "$root"/tests/golden/hf/tokenizers/*
  exit 0
fi
make_venv "$venv" "${hf_pins[@]}"

export CUDA_VISIBLE_DEVICES=""
"$venv/bin/python" "$root/tools/make_hf_fixtures.py" --out "$root/tests/golden/hf" \
  --shakespeare "$root/data/tinyshakespeare.txt"
find "$root/tests/golden/hf" -type f -exec chmod 0644 {} +
du -cb $(find "$root/tests/golden/hf" -type f) | tail -n 1 |
  awk '{print "make_hf_fixtures: tests/golden/hf/ holds " $1 " bytes"}'
