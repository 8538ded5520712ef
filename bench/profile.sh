#!/usr/bin/env bash
# Profiles loom (`loom profile`, docs/profiling.md) at the benchmark's shapes in both ISA modes of
# bench/run.sh, into bench/results/profile/<mode>_<shape>/ (trace.json, summary.json, memory.html)
# with the printed summary beside it as <mode>_<shape>.txt. docs/performance.md reads these.
#
#   bash bench/profile.sh            # shapes a c and d (fp32/bf16, remat none/MLP,Attn), both modes (~3 min)
#   SHAPES="a c" MODES=native bash bench/profile.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$root"
out="$here/results/profile"
mkdir -p "$out"
SC="data.kind=random_tokens data.vocab_size=65 train.eval_interval=0 train.sample_tokens=0 model.dropout_rate=0"
SC+=" model.dtype=float32"
D="model.num_layers=4 model.hidden_size=256 model.head_dim=64 model.vocab_size=2048 model.num_outputs=2048"
D+=" data.vocab_size=2048 model.max_seq_len=128 data.seq_len=128 data.batch_size=8 optimizer.num_minibatches=1"
D+=" model.dropout_rate=0"
declare -A cfg=(
  [a]="configs/gpt2_124m.toml model.dtype=float32 model.dropout_rate=0 data.batch_size=4 data.seq_len=64"
  [b]="configs/shakespeare_char.toml $SC"
  [c]="configs/shakespeare_char.toml $SC model.hidden_size=384 model.num_layers=6 model.head_dim=64
       model.max_seq_len=256 data.seq_len=256 data.batch_size=8"
  [d_f32_none]="configs/tutorial_transformer.toml $D model.dtype=float32 model.remat=none"
  [d_f32_remat]="configs/tutorial_transformer.toml $D model.dtype=float32 model.remat=MLP,Attn"
  [d_bf16_none]="configs/tutorial_transformer.toml $D model.dtype=bfloat16 model.remat=none"
  [d_bf16_remat]="configs/tutorial_transformer.toml $D model.dtype=bfloat16 model.remat=MLP,Attn"
)
scrub=(-u OMP_NUM_THREADS -u OMP_WAIT_POLICY -u OPENBLAS_NUM_THREADS -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE
       -u ONEDNN_MAX_CPU_ISA -u DNNL_MAX_CPU_ISA -u GOMP_SPINCOUNT)
for mode in ${MODES:-avx2 native}; do
  if [[ $mode == avx2 ]]; then
    bin="$here/build/loom-avx2/loom"; caps=(OPENBLAS_CORETYPE=Haswell ONEDNN_MAX_CPU_ISA=AVX2)
    [[ -x "$bin" ]] || bash "$here/build_loom_avx2.sh"
  else
    bin="${LOOM:-$root/build/loom}"; caps=()
  fi
  for s in ${SHAPES:-a b c d_f32_none d_f32_remat d_bf16_none d_bf16_remat}; do
    steps=5; warm=2
    [[ $s == a || $s == c ]] || { steps=20; warm=5; }
    echo "== $mode $s  (load $(cut -d' ' -f1-3 /proc/loadavg))"
    env "${scrub[@]}" "${caps[@]}" "$bin" profile ${cfg[$s]} threads=2 --steps $steps --warmup $warm \
        --out "$out/${mode}_$s" > "$out/${mode}_$s.txt" 2>&1
    echo "load $(cut -d' ' -f1-3 /proc/loadavg) after" >> "$out/${mode}_$s.txt"
    grep -E "median step|achieved" "$out/${mode}_$s.txt"
  done
done
