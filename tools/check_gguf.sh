#!/usr/bin/env bash
# Checks `loom export gguf` with llama.cpp itself, outside the tests (they need neither Python nor
# llama.cpp): for each fixture of tests/golden/hf/ (GPT-2, Llama tied and untied, Llama 3.1's rope
# scaling, Qwen2 tied and untied, Qwen3; not Mistral's, whose window llama.cpp lacks), fine-tunes it a
# few steps on tiny Shakespeare, exports the run as f16, bf16 and q8_0 GGUF files and runs
# tools/check_gguf.py on each: every tensor byte for byte as llama.cpp's converter would write it
# from the run's `loom export hf` directory (gguf-py's names and quantizers), and llama.cpp's greedy
# continuation of "ROMEO:" the same as `loom sample --temperature 0` (all 30 tokens for f16, the
# first 16 for bf16 and q8_0, whose rounded weights may turn a near tie late in the text).
#
#   bash tools/check_gguf.sh            # loom from build/ (scripts/build.sh); venv in .venv-gguf/
#
# The venv (gitignored) gets llama-cpp-python, which pip builds from source (llama.cpp with CMake:
# several minutes), gguf, numpy and safetensors. Needs the Python package index; exits 1 when a
# check fails.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=tools/venv.sh
source "$root/tools/venv.sh"
venv="$root/.venv-gguf"
if ! "$venv/bin/python" -c "import llama_cpp, gguf, safetensors" 2>/dev/null; then
  CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF}" \
    make_venv "$venv" llama-cpp-python gguf numpy safetensors
fi
loom="$root/build/loom"
[[ -x "$loom" ]] || { echo "check_gguf: no $loom; run scripts/build.sh first" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
head -c 200000 "$root/data/tinyshakespeare.txt" > "$work/text.txt"
status=0
for fixture in gpt2 llama_tied llama_untied llama3 qwen2_tied qwen2_untied qwen3; do
  model="$root/tests/golden/hf/$fixture"
  w="$work/$fixture"
  mkdir -p "$w"
  "$loom" prepare hf "$model/tokenizer.json" "$work/text.txt" "$w/data" > /dev/null
  cat > "$w/ft.toml" <<EOF
[optimizer]
name = "adamw"
learning_rate = 3e-3
[data]
kind = "tokens"
dir = "$w/data"
batch_size = 8
seq_len = 32
[train]
steps = 300
eval_interval = 300
EOF
  "$loom" train "$w/ft.toml" --init-from "$model" --out "$w/run" > /dev/null
  "$loom" sample "$w/run" --prompt ROMEO: --temperature 0 --tokens 30 > "$w/loom.txt"
  "$loom" export hf "$w/run" "$w/hf" > /dev/null
  for type in f16 bf16 q8_0; do
    "$loom" export gguf "$w/run" "$w/$type.gguf" --type "$type" > /dev/null
    first=()
    # bf16 and q8_0 round the weights loom samples with in float32: a near tie may turn late.
    [[ "$type" != f16 ]] && first=(--first 16)
    echo "== $fixture, $type"
    "$venv/bin/python" "$root/tools/check_gguf.py" "$w/$type.gguf" --hf "$w/hf" --loom-text "$w/loom.txt" \
      --prompt ROMEO: --tokens 30 "${first[@]}" || status=1
  done
done
exit "$status"
