#!/usr/bin/env bash
# Same-machine reference for loom's shakespeare_char result: nanoGPT's exact CPU recipe for tiny
# Shakespeare (character level), trained by the PyTorch peer (bench/peers/torch_gpt.py train:
# nanoGPT's model.py and train.py loop) for seeds 1337, 1 and 2:
#
#   n_layer 4, n_head 4, n_embd 128, block 64, batch 12, 2000 iters, dropout 0, bias False,
#   AdamW lr 1e-3 betas (0.9, 0.99), weight decay 0.1 on params with dim >= 2, grad clip 1.0,
#   get_lr: linear warmup lr*(it+1)/(100+1) for 100 iters, cosine to 1e-4 at 2000,
#   estimate_loss every 250 iters with eval_iters 20 (as nanoGPT, so the RNG stream matches).
#
# Reports per seed the validation loss at iter 2000 on the WHOLE val split (every
# non-overlapping 64-token window: labels are val tokens 1..111488, each once) and nanoGPT's own
# 20-random-batch estimate, plus wall time. Writes bench/results/nanogpt_reference.json.
#
#   bash bench/nanogpt_reference.sh              # seeds 1337 1 2 (~2 min each on 2 quiet cores)
#   SEEDS="1337" bash bench/nanogpt_reference.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$root"
data="$root/data/shakespeare_char"
if [[ ! -f "$data/val.bin" ]]; then
  [[ -x build/loom ]] || bash scripts/build.sh
  ./build/loom prepare char data/tinyshakespeare.txt data/shakespeare_char
fi
if ! /usr/bin/python3 -c "import torch, numpy" 2>/dev/null; then
  echo "nanogpt_reference: needs python3-torch and python3-numpy (apt-get install -y python3-torch python3-numpy)" >&2
  exit 2
fi
mkdir -p "$here/results"
out="$here/results/nanogpt_reference.json"
log="$here/results/nanogpt_reference.log"
: > "$log"
export OMP_WAIT_POLICY=PASSIVE OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
for seed in ${SEEDS:-1337 1 2}; do
  echo "== seed $seed  ($(uptime | sed 's/.*load average/load average/'))"
  /usr/bin/python3 "$here/peers/torch_gpt.py" train --threads 2 --data "$data" --seed "$seed" \
      --n-layer 4 --n-head 4 --n-embd 128 --block 64 --batch 12 --max-iters 2000 \
      --lr 1e-3 --min-lr 1e-4 --warmup-iters 100 --lr-decay-iters 2000 --beta1 0.9 --beta2 0.99 \
      --weight-decay 0.1 --grad-clip 1.0 --eval-interval 250 --eval-iters 20 --log "$log"
  echo "   load after: $(uptime | sed 's/.*load average: //')" | tee -a "$log"
done
/usr/bin/python3 - "$log" "$out" <<'PY'
import json, statistics, sys
rows = []
loads = []
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        d = json.loads(line)
        if d["event"] == "final":
            rows.append(d)
    elif line.startswith("load after"):
        loads.append(line.split(": ", 1)[1])
for r, l in zip(rows, loads):
    r["load_after"] = l
full = [r["val_loss_full"] for r in rows]
est = [r["val_loss_estimate"] for r in rows]
summary = dict(
    recipe="nanoGPT shakespeare_char CPU recipe: 4L 4H 128, block 64, batch 12, 2000 iters, AdamW 1e-3 "
           "(0.9, 0.99) wd 0.1, warmup 100, cosine to 1e-4, clip 1.0, dropout 0, bias False; PyTorch peer",
    runs=rows,
    mean_val_loss_full=statistics.mean(full) if full else None,
    mean_val_loss_estimate=statistics.mean(est) if est else None,
)
json.dump(summary, open(sys.argv[2], "w"), indent=1)
print(f"== whole-split val loss: " + ", ".join(f"seed {r['seed']}: {r['val_loss_full']:.4f}" for r in rows)
      + (f"; mean {summary['mean_val_loss_full']:.4f}" if full else ""))
print(f"== 20-batch estimate:    " + ", ".join(f"seed {r['seed']}: {r['val_loss_estimate']:.4f}" for r in rows))
print(f"wrote {sys.argv[2]}")
PY
