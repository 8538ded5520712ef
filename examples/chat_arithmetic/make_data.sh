#!/usr/bin/env bash
# The chat worked example's data (README, "Chat data"): additions of two numbers from 0 to 9 as
# conversations, and held-out multiple-choice questions for `loom eval --choices`.
#
#   examples/chat_arithmetic/make_data.sh OUTDIR [--seed N] [--conversations N] [--questions N]
#
# writes OUTDIR/chats.jsonl (conversations: a system prompt in a third of them, one to three
# questions each; `loom prepare chat` keeps the last tenth for validation) and OUTDIR/choices.jsonl
# (questions: a conversation up to a last question, four candidate answers, the label). The same
# seed gives the same files byte for byte on every host: the random numbers are Park and Miller's
# minimal standard generator in awk's doubles (products below 2^47, so exact in any awk), not
# awk's rand(), which differs between awk implementations (mawk, gawk, BWK awk). Plain bash and
# awk, so that the example needs nothing beyond loom and a POSIX system.
#
# Held out: the sums whose first number is the second plus 3 (modulo 10), 10 of the 100, appear in
# no training conversation; each question asks one of them last, so acc measures whether the model
# has learnt to add, not only recalled a conversation. Its earlier turns use the other sums.
#
# A question's context and candidates are the conversation as the chat template renders it (with
# the generation prompt), and the continuation the template writes for each candidate answer (the
# answer and the end of the turn): `loom prepare chat --render-only` renders them, so they match the
# training data's rendering whatever the template. $LOOM is the loom binary (default: loom on the
# PATH), $MODEL the model directory whose tokenizer_config.json's special tokens the template sees
# (default: the Llama fixture configs/chat_arithmetic.toml fine-tunes), $TEMPLATE the template
# (default: chatml.jinja beside this script; empty: the model's own).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
loom="${LOOM:-loom}"
model="${MODEL:-$here/../../tests/golden/hf/llama_tied}"
template="${TEMPLATE-$here/chatml.jinja}"

usage() {
  echo "usage: $0 OUTDIR [--seed N] [--conversations N] [--questions N]" >&2
  exit 2
}
out="" seed=1 conversations=2000 questions=200
while (($#)); do
  case "$1" in
    --seed | --conversations | --questions)
      (($# >= 2)) || usage
      [[ "$2" =~ ^[1-9][0-9]{0,8}$ ]] || {
        echo "$0: $1 must be a whole number from 1 to 999999999, not '$2'" >&2
        exit 2
      }
      declare "${1#--}=$2"
      shift 2
      ;;
    -*) usage ;;
    *)
      [[ -z "$out" ]] || usage
      out="$1"
      shift
      ;;
  esac
done
[[ -n "$out" ]] || usage

command -v "$loom" >/dev/null || {
  echo "$0: cannot run loom as '$loom': put loom on the PATH or set LOOM, e.g. LOOM=build/loom" >&2
  exit 2
}
# Everything is written beside OUTDIR first, so a failure leaves OUTDIR as it was.
mkdir -p "$(dirname "$out")"
scratch="$(mktemp -d "$(dirname "$out")/.make_data.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT

# chats.jsonl; contexts.jsonl: each question's conversation up to its last question;
# answers.jsonl: the same with each candidate answer, four lines per question; labels: one per line.
awk -v seed="$seed" -v conversations="$conversations" -v questions="$questions" -v dir="$scratch" '
function random(n) {  # 0 .. n-1
  state = (state * 48271) % 2147483647
  return int(state / 2147483647 * n)
}
function held_out(a, b) { return (a - b + 10) % 10 == 3 }
# One question as a user message; a and b from the pairs that are (held = 1) or are not held out.
function ask(held,    form) {
  do {
    a = random(10)
    b = random(10)
  } while (held_out(a, b) != held)
  form = random(4)
  if (form == 0) return sprintf("What is %d + %d?", a, b)
  if (form == 1) return sprintf("%d + %d = ?", a, b)
  if (form == 2) return sprintf("Add %d and %d.", a, b)
  return sprintf("How much is %d plus %d?", a, b)
}
function message(role, content) { return sprintf("{\"role\": \"%s\", \"content\": \"%s\"}", role, content) }
# A system prompt (a third of the time) and turns - 1 answered questions, with a leading comma on
# each message but the first.
function opening(turns,    s, t) {
  s = ""
  if (random(3) == 0) s = message("system", systems[random(3)])
  for (t = 1; t < turns; ++t) {
    s = s (s == "" ? "" : ", ") message("user", ask(0))
    s = s ", " message("assistant", a + b)
  }
  return s
}
function conversation(messages) { return "{\"messages\": [" messages "]}" }
BEGIN {
  state = seed % 2147483646 + 1
  systems[0] = "You are a calculator."
  systems[1] = "Answer with the number only."
  systems[2] = "You add small numbers."
  for (c = 0; c < conversations; ++c) {
    turns = 1 + random(3)
    s = opening(turns)
    s = s (s == "" ? "" : ", ") message("user", ask(0))
    print conversation(s ", " message("assistant", a + b))
  }
  for (q = 0; q < questions; ++q) {
    s = opening(1 + random(3))
    s = s (s == "" ? "" : ", ") message("user", ask(1))
    print conversation(s) > (dir "/contexts.jsonl")
    # Four different sums from 0 to 18, the right one at a random place.
    label = random(4)
    delete used
    used[a + b] = 1
    for (k = 0; k < 4; ++k) {
      if (k == label) {
        answer = a + b
      } else {
        do {
          answer = random(19)
        } while (answer in used)
        used[answer] = 1
      }
      print conversation(s ", " message("assistant", answer)) > (dir "/answers.jsonl")
    }
    print label > (dir "/labels")
  }
}' >"$scratch/chats.jsonl"

# render NAME [--add-generation-prompt]: NAME.jsonl rendered into NAME.rendered; the template's
# errors (printed as {"error": ...} lines) are shown and stop the script.
render() {
  "$loom" prepare chat "$model" "$scratch/$1.jsonl" --render-only ${template:+--template "$template"} "${@:2}" \
    >"$scratch/$1.rendered" || {
    grep -m 3 '^{"error"' "$scratch/$1.rendered" >&2
    echo "$0: the template does not render the questions" >&2
    exit 1
  }
}
render contexts --add-generation-prompt
render answers

# Both renderings are {"text": "..."} lines; JSON escapes each character on its own, so the escaped
# context is a prefix of each escaped answer and what follows it is the candidate, still escaped.
awk -v contexts="$scratch/contexts.rendered" -v answers="$scratch/answers.rendered" '
function text(line) {
  if (line !~ /^\{"text": ".*"\}$/) {
    print "make_data.sh: the rendering is not a {\"text\": ...} line: " line > "/dev/stderr"
    exit 1
  }
  return substr(line, 11, length(line) - 12)
}
{
  getline line < contexts
  context = text(line)
  choices = ""
  for (k = 0; k < 4; ++k) {
    getline line < answers
    answer = text(line)
    if (substr(answer, 1, length(context)) != context) {
      print "make_data.sh: the template renders an answered conversation that does not start with the question" > "/dev/stderr"
      exit 1
    }
    choices = choices (k ? ", " : "") "\"" substr(answer, length(context) + 1) "\""
  }
  printf "{\"context\": \"%s\", \"choices\": [%s], \"label\": %d}\n", context, choices, $1
}' "$scratch/labels" >"$scratch/choices.jsonl"

mkdir -p "$out"
mv "$scratch/chats.jsonl" "$scratch/choices.jsonl" "$out/"
echo "wrote $out/chats.jsonl ($conversations conversations) and $out/choices.jsonl ($questions questions, seed $seed)"
