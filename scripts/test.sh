#!/usr/bin/env bash
# Quick start 2: install what is missing, build, and run every test (ctest).
#
# Two builds: build/ (Release, -march=native: what `loom` runs as here), whose whole suite runs
# last, and build-avx2/ (no -march=native, -mavx2 -mfma -mf16c: the portable AVX2 code paths of
# the CPU kernels, e.g. attention's 8-wide product loops), whose backend op tests run first
# against the reference backend with oneDNN held to AVX2 as well.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
cmake -S . -B build-avx2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_NATIVE=OFF \
      "-DCMAKE_CXX_FLAGS=-mavx2 -mfma -mf16c" >/dev/null
ninja -C build-avx2 test_backend
(cd build-avx2 && ONEDNN_MAX_CPU_ISA=AVX2 ctest --output-on-failure -j 2 -L backend)
cd build
ctest --output-on-failure -j 2 "$@"
