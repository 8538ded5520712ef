#!/usr/bin/env bash
# Time to a quality: loom's default main job (configs/shakespeare_char.toml) next to nanoGPT's exact
# CPU recipe for tiny Shakespeare (character level) on today's PyTorch 2.x (bench/peers/torch_gpt.py
# train: nanoGPT's model.py and train.py loop, eager as nanoGPT's CPU example runs it), seed by seed,
# interleaved (loom, PyTorch, loom, PyTorch, ...), on the same machine in the same run:
#
#   n_layer 4, n_head 4, n_embd 128, block 64, batch 12, 2000 iters, dropout 0, bias False,
#   AdamW lr 1e-3 betas (0.9, 0.99), weight decay 0.1 on params with dim >= 2, grad clip 1.0,
#   get_lr: linear warmup lr*(it+1)/(100+1) for 100 iters, cosine to 1e-4 at 2000, evaluation
#   every 250 iters (nanoGPT: 20 random batches of each split; loom: the whole validation split).
#
# Reports per seed and implementation: the wall time until the first evaluation at or below
# validation loss 2.0 (the time since the training loop started, evaluations included; loom's
# `elapsed_s` also counts its setup), the final validation loss on the WHOLE validation split
# (every non-overlapping 64-token window), and the process's wall time. Writes
# bench/results/nanogpt_reference.json.
#
#   bash bench/nanogpt_reference.sh              # seeds 1337 1 2 (~1 min loom + ~2 min PyTorch each, quiet)
#   SEEDS="1337" bash bench/nanogpt_reference.sh
#   BENCH_PYTHON=path/to/python bash bench/nanogpt_reference.sh   # a python with torch 2.x and numpy
#
# Needs build/loom (built by scripts/build.sh when missing) and the PyTorch of bench/run.sh's venv
# .venv-bench (made by bench/run.sh, or here with torch alone when missing).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$root"
[[ -x build/loom ]] || bash scripts/build.sh
data="$root/data/shakespeare_char"
[[ -f "$data/val.bin" ]] || ./build/loom prepare char data/tinyshakespeare.txt data/shakespeare_char
# shellcheck source=tools/venv.sh
source "$root/tools/venv.sh"
py=$(venv_python BENCH_PYTHON "torch, numpy" "$root/.venv-bench" torch==2.15.0 numpy==2.4.6)
mkdir -p "$here/results"
out="$here/results/nanogpt_reference.json"
log="$here/results/nanogpt_reference.log"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
: > "$log"
export OMP_WAIT_POLICY=PASSIVE CUDA_VISIBLE_DEVICES=""
for seed in ${SEEDS:-1337 1 2}; do
  echo "== seed $seed: loom  ($(uptime | sed 's/.*load average/load average/'))"
  t0=$EPOCHREALTIME
  ./build/loom train configs/shakespeare_char.toml seed="$seed" threads=2 train.sample_tokens=0 --out "$work/loom_$seed" > "$work/loom_$seed.out"
  grep -E "val loss|run summary" "$work/loom_$seed.out" | tail -n 3 | sed 's/^/   /'
  echo "{\"event\": \"loom\", \"seed\": $seed, \"t0\": $t0, \"t1\": $EPOCHREALTIME, \"load\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}" >> "$log"
  grep val_loss "$work/loom_$seed/metrics.jsonl" | sed 's/^{/{"event": "loom_eval", /' >> "$log"
  echo "== seed $seed: PyTorch $("$py" -c 'import torch; print(torch.__version__)')  ($(uptime | sed 's/.*load average/load average/'))"
  t0=$EPOCHREALTIME
  "$py" "$here/peers/torch_gpt.py" train --threads 2 --data "$data" --seed "$seed" \
      --n-layer 4 --n-head 4 --n-embd 128 --block 64 --batch 12 --max-iters 2000 \
      --lr 1e-3 --min-lr 1e-4 --warmup-iters 100 --lr-decay-iters 2000 --beta1 0.9 --beta2 0.99 \
      --weight-decay 0.1 --grad-clip 1.0 --eval-interval 250 --eval-iters 20 --log "$log"
  echo "{\"event\": \"torch_process\", \"seed\": $seed, \"t0\": $t0, \"t1\": $EPOCHREALTIME, \"load\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}" >> "$log"
done
python3 - "$log" "$out" <<'PY'
import json, statistics, sys
TARGET = 2.0
runs = {}
seed = None
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    seed = d.get("seed", seed)  # the PyTorch peer's eval lines carry no seed: the current one
    r = runs.setdefault(seed, dict(seed=seed, loom={}, pytorch=dict(evals=[])))
    if d["event"] == "loom":
        r["loom"] = dict(evals=[], process_s=d["t1"] - d["t0"], load=d["load"])
    elif d["event"] == "loom_eval":
        evals = r["loom"]["evals"]
        evals.append(dict(step=d["step"], val_loss=d["val_loss"], elapsed_s=d["elapsed_s"]))
        hit = next((e for e in evals if e["val_loss"] <= TARGET), None)
        r["loom"].update(final_val_loss=evals[-1]["val_loss"], time_to_target_s=hit["elapsed_s"] if hit else None,
                         step_at_target=hit["step"] if hit else None)
    elif d["event"] == "eval":
        r["pytorch"]["evals"].append(dict(step=d["iter"], val_loss=d["val_loss"], elapsed_s=d["elapsed_s"]))
    elif d["event"] == "start":
        r["pytorch"]["torch"] = d["env"]["torch"]
    elif d["event"] == "final":
        hit = next((e for e in r["pytorch"]["evals"] if e["val_loss"] <= TARGET), None)
        r["pytorch"].update(final_val_loss=d["val_loss_full"], final_val_loss_estimate=d["val_loss_estimate"],
                            train_s=d["wall_s"], time_to_target_s=hit["elapsed_s"] if hit else None,
                            step_at_target=hit["step"] if hit else None)
    elif d["event"] == "torch_process":
        r["pytorch"].update(process_s=d["t1"] - d["t0"], load=d["load"])
rows = list(runs.values())
def mean(impl, key):
    v = [r[impl][key] for r in rows if r[impl].get(key) is not None]
    return statistics.mean(v) if len(v) == len(rows) and v else None
summary = dict(
    recipe="nanoGPT shakespeare_char CPU recipe: 4L 4H 128, block 64, batch 12, 2000 iters, AdamW 1e-3 "
           "(0.9, 0.99) wd 0.1, warmup 100, cosine to 1e-4, clip 1.0, dropout 0, bias False",
    target_val_loss=TARGET, runs=rows,
    mean={impl: {k: mean(impl, k) for k in ("time_to_target_s", "final_val_loss", "process_s")}
          for impl in ("loom", "pytorch")},
)
json.dump(summary, open(sys.argv[2], "w"), indent=1)
fmt = lambda v, f="{:.1f}": "-" if v is None else f.format(v)
print(f"\n| seed | loom: time to val {TARGET} | PyTorch: time to val {TARGET} | speedup | loom final val loss "
      f"| PyTorch final val loss | loom process | PyTorch process |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for r in rows + [dict(seed="mean", **summary["mean"])]:
    l, p = r["loom"], r["pytorch"]
    sp = p["time_to_target_s"] / l["time_to_target_s"] if l.get("time_to_target_s") and p.get("time_to_target_s") else None
    print(f"| {r['seed']} | {fmt(l.get('time_to_target_s'))} s (step {l.get('step_at_target') or '-'}) "
          f"| {fmt(p.get('time_to_target_s'))} s (iter {p.get('step_at_target') or '-'}) | {fmt(sp, '{:.2f}x')} "
          f"| {fmt(l.get('final_val_loss'), '{:.4f}')} | {fmt(p.get('final_val_loss'), '{:.4f}')} "
          f"| {fmt(l.get('process_s'))} s | {fmt(p.get('process_s'))} s |")
print(f"\nwrote {sys.argv[2]}")
PY
