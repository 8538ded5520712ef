#!/usr/bin/env bash
# Interleaved A/B of two loom binaries on a few short training runs, for a change that must not
# slow a step: per run, the user+sys CPU seconds of the whole `loom train` (/usr/bin/time) and the
# fastest step's wall time (metrics file). CPU time stays meaningful on a busy host, where wall
# times of a 2-thread run vary several-fold; with threads=2, set OMP_WAIT_POLICY=PASSIVE so that
# waiting threads sleep instead of spinning on CPU time.
#
#   bash bench/ab_cpu_time.sh BEFORE_BINARY AFTER_BINARY [ROUNDS] [THREADS] > ab.txt
#   OMP_WAIT_POLICY=PASSIVE bash bench/ab_cpu_time.sh /path/to/loom_before build/loom 4 2
#
# Prints one line per run: round, config, which, cpu_s, wall_s, fastest step s; then the medians.
set -euo pipefail
before=${1:?usage: ab_cpu_time.sh BEFORE AFTER [ROUNDS] [THREADS]}; after=${2:?}
rounds=${3:-4}; threads=${4:-1}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SC="data.kind=random_tokens data.vocab_size=65"
D="model.num_layers=4 model.hidden_size=256 model.head_dim=64 model.vocab_size=2048 model.num_outputs=2048"
D="$D data.vocab_size=2048 model.max_seq_len=128 data.seq_len=128 data.batch_size=8 optimizer.num_minibatches=1"
D="$D model.dropout_rate=0 model.remat=none"
declare -A cfg=(
  [shakespeare_f32]="configs/shakespeare_char.toml $SC model.dtype=float32 train.steps=20"
  [shakespeare_bf16]="configs/shakespeare_char.toml $SC model.dtype=bfloat16 train.steps=20"
  [tutorial_f32]="configs/tutorial_transformer.toml $D model.dtype=float32 train.steps=6"
  [tutorial_bf16]="configs/tutorial_transformer.toml $D model.dtype=bfloat16 train.steps=6"
)
T="train.eval_interval=0 train.sample_tokens=0 train.log_every=1 threads=$threads"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq 1 "$rounds"); do
  for name in shakespeare_f32 shakespeare_bf16 tutorial_f32 tutorial_bf16; do
    order="before after"
    (( r % 2 == 0 )) && order="after before"
    for which in $order; do
      bin=$before
      [[ $which == after ]] && bin=$after
      rm -f "$tmp/m.jsonl"
      # shellcheck disable=SC2086
      /usr/bin/time -o "$tmp/t" -f "%U %S %e" "$bin" train ${cfg[$name]} $T train.metrics_file="$tmp/m.jsonl" \
        > /dev/null 2>&1
      fastest=$(python3 -c "import json,sys; print(min(json.loads(l)['step_time_s'] for l in open(sys.argv[1])))" \
        "$tmp/m.jsonl")
      read -r user sys wall < "$tmp/t"
      echo "$r $name $which $(python3 -c "print(round($user + $sys, 2))") $wall $fastest" | tee -a "$tmp/all"
    done
  done
done
python3 - "$tmp/all" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    _, name, which, cpu, _, fastest = line.split()
    runs.setdefault((name, which), []).append((float(cpu), float(fastest)))
print("\n| config | CPU s before (median; runs) | CPU s after | change | fastest step before / after |")
print("|---|---|---|---|---|")
for name in dict.fromkeys(n for n, _ in runs):
    b, a = runs[(name, "before")], runs[(name, "after")]
    mb, ma = statistics.median(c for c, _ in b), statistics.median(c for c, _ in a)
    print(f"| {name} | {mb:.3f} ({', '.join(str(c) for c, _ in b)}) | {ma:.3f} ({', '.join(str(c) for c, _ in a)}) | "
          f"{(ma / mb - 1) * 100:+.1f} % | {min(f for _, f in b) * 1e3:.1f} / {min(f for _, f in a) * 1e3:.1f} ms |")
PY
