#!/usr/bin/env bash
# Runs the README's worked example for each model family ("Chat models of each family"): with the
# random-weight fixture of tests/golden/hf/ standing in for a downloaded chat model, `loom prepare
# chat` on the chat worked example's conversations, `loom train configs/llama_finetune.toml`,
# `loom sample --chat`, `loom export hf`; then tools/check_hf_export.py loads each export with
# transformers: the chat template renders and tokenizes as on the fixture (--chat-like), the
# chat reply and a 30-token greedy continuation are loom's, and an export of the fixture itself
# (one step at learning rate 0) gives the fixture's logits. Prints a table; exits 1 when a check
# fails.
#
#   bash tools/check_family_examples.sh [FAMILY...]   # default: qwen2_tied qwen3 mistral gemma3
#
# loom from build/ (scripts/build.sh); transformers in .venv-hf/ (the venv of
# tools/make_hf_fixtures.sh, made here when missing: needs the Python package index).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=tools/venv.sh
source "$root/tools/venv.sh"
venv="$root/.venv-hf"
"$venv/bin/python" -c "import transformers, torch" 2>/dev/null || make_venv "$venv" "${hf_pins[@]}"
export CUDA_VISIBLE_DEVICES=""
loom="$root/build/loom"
[[ -x "$loom" ]] || { echo "check_family_examples: no $loom; run scripts/build.sh first" >&2; exit 2; }
families=("$@")
((${#families[@]})) || families=(qwen2_tied qwen3 mistral gemma3)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$root"
question="What is 7 + 4?"
prompt="What is 7 + 4?"
LOOM="$loom" examples/chat_arithmetic/make_data.sh "$work/data/arithmetic" --questions 1 > /dev/null
status=0
rows=()
for family in "${families[@]}"; do
  model="tests/golden/hf/$family"
  data="$work/data/chat_$family" run="$work/runs/chat_$family"
  log="$work/$family.log"
  echo "== $family" > "$log"
  # The README's table: rows as long as the fixture's positions allow; Mistral's template moves the
  # system prompt into the last question, so its conversations train on every token.
  seq=128 loss=()
  [[ "$family" == qwen3 ]] && seq=64
  [[ "$family" == mistral ]] && loss=(--loss-on all)
  "$loom" prepare chat "$model" "$work/data/arithmetic/chats.jsonl" "$data" --block-size "$seq" "${loss[@]}" >> "$log"
  start=$(date +%s.%N)
  "$loom" train configs/llama_finetune.toml threads=1 model.init_from="$model" data.dir="$data" data.seq_len="$seq" \
    data.packing=true train.sample_tokens=0 --out "$run" >> "$log"
  seconds=$(echo "$(date +%s.%N) - $start" | bc)
  "$loom" sample "$run" --chat "$question" --temperature 0 > "$work/$family.reply"
  "$loom" sample "$run" --prompt "$prompt" --temperature 0 --tokens 30 > "$work/$family.text"
  "$loom" export hf "$run" "$run"_hf >> "$log"
  # The fixture itself through loom and back: one step at learning rate 0 leaves every weight.
  "$loom" train configs/llama_finetune.toml threads=1 model.init_from="$model" data.dir="$data" data.seq_len="$seq" \
    data.packing=true train.sample_tokens=0 train.steps=1 optimizer.learning_rate=0 train.eval_interval=0 \
    --out "$run"_0 > /dev/null
  "$loom" export hf "$run"_0 "$run"_0_hf > /dev/null
  ok=yes
  "$venv/bin/python" tools/check_hf_export.py "$run"_hf --chat-like "$model" --loom-chat "$work/$family.reply" \
    --chat "$question" --loom-text "$work/$family.text" --prompt "$prompt" --tokens 30 >> "$log" 2>&1 || ok=no
  "$venv/bin/python" tools/check_hf_export.py "$run"_0_hf --expected "$model/expected.safetensors" >> "$log" 2>&1 ||
    ok=no
  cat "$log"
  [[ "$ok" == yes ]] || status=1
  arch=$(sed -n 's/.* as \([A-Za-z0-9]*\) to .*/\1/p' "$log" | head -n 1)
  first=$(sed -n 's/^step \([0-9]*\): val loss \([0-9.]*\).*/\1: \2/p' "$log" | head -n 1)
  last=$(sed -n 's/^step \([0-9]*\): val loss \([0-9.]*\).*/\1: \2/p' "$log" | tail -n 1)
  dlogit=$(sed -n 's/.*max abs difference \([^ ]*\) (range \([^)]*\)).*/\1 (range \2)/p' "$log")
  agree=$(sed -n 's/.*(\([0-9]* of [0-9]*\) tokens agree).*/\1/p' "$log")
  renders=$(grep -c "^apply_chat_template.*: the same" "$log" || true)
  rendered=$(grep -c "^apply_chat_template" "$log" || true)
  chat=$(grep -q "^chat reply.*: the same as" "$log" && grep -q "stopped at the end of turn" "$log" && echo yes || echo no)
  rows+=("| $family | $arch | $(printf '%.1f' "$seconds") s | $first → $last | $(tr -d '\n' < "$work/$family.reply") | $chat | $agree | $renders of $rendered | $dlogit | $ok |")
done
echo
echo "| fixture | architecture | train (300 steps) | val loss (step: loss) | loom sample --chat \"$question\" | transformers' reply the same, stops at end of turn | greedy tokens agree | apply_chat_template identical | max abs Δlogit, export of the fixture | all checks |"
echo "|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
exit "$status"
