#!/usr/bin/env bash
# Builds an AVX2+FMA-only loom (no -march=native) into bench/build/loom-avx2/loom, for timing loom
# on a machine that has AVX-512 as it would run on the AVX2-only target:
#   bash bench/build_loom_avx2.sh && LOOM=bench/build/loom-avx2/loom bash bench/run.sh --no-peers \
#       --out bench/results/loom_avx2.json
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
b="$root/bench/build/loom-avx2"
cmake -S "$root" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_NATIVE=OFF -DLOOM_BUILD_TESTS=OFF \
      "-DCMAKE_CXX_FLAGS=-mavx2 -mfma -mf16c"
cmake --build "$b" --target loom
echo "zmm (AVX-512) instructions in $b/loom: $(objdump -d "$b/loom" | grep -c zmm || true)"
