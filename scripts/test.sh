#!/usr/bin/env bash
# Quick start 2: install what is missing, build, and run every test (ctest).
#
# Each build is incremental: run again, it rebuilds only what changed (ninja), and a fresh build
# of unchanged sources comes from ccache when it is installed; the test binaries of a build share
# one precompiled header.
# Three builds: build/ (Release, -march=native: what `loom` runs as here), whose whole suite runs
# last; build-avx2/ (no -march=native, -mavx2 -mfma -mf16c: the portable AVX2 code paths of the
# CPU kernels, e.g. attention's 8-wide product loops), whose backend op tests run first against
# the reference backend with oneDNN held to AVX2 as well; and build-asan/ (AddressSanitizer +
# UndefinedBehaviorSanitizer, -DLOOM_SANITIZE=ON), whose whole suite runs second: any report
# fails the test that hit it. LOOM_TEST_SANITIZE=0 skips that build (e.g. while iterating).
# The AVX2 and sanitizer builds are unity builds (CMakeLists.txt, LOOM_UNITY_BATCH): nobody edits in
# them, so a changed file recompiling the rest of its unity group costs nobody anything.
set -euo pipefail
cd "$(dirname "$0")/.."
# A suite runs with a slot per core for the tests that compute and no limit but -j for those that
# mostly wait (tests/CMakeLists.txt, LOOM_TESTS_THAT_WAIT), which then overlap the others.
cores=$(nproc)
suite() {  # in a build directory: ctest with that resource spec, and this script's arguments
  printf '{"version": {"major": 1, "minor": 0}, "local": [{"cpu": [{"id": "0", "slots": %d}]}]}\n' "$cores" \
    > cores.json
  ctest --output-on-failure -j $((2 * cores)) --resource-spec-file cores.json "$@"
}
bash scripts/install-deps.sh
bash scripts/build.sh
ninja -C build
cmake -S . -B build-avx2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_NATIVE=OFF \
      "-DCMAKE_CXX_FLAGS=-mavx2 -mfma -mf16c" -DCMAKE_UNITY_BUILD=ON >/dev/null
ninja -C build-avx2 test_backend
(cd build-avx2 && ONEDNN_MAX_CPU_ISA=AVX2 ctest --output-on-failure -j 2 -L backend)
if [ "${LOOM_TEST_SANITIZE:-1}" != 0 ]; then
  # -O1 -g1: half the compile time of -O2 -g, still file:line in every report's stack.
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
        -DLOOM_SANITIZE=ON -DCMAKE_UNITY_BUILD=ON >/dev/null
  ninja -C build-asan
  # Leaks count too (tests/lsan.supp names only oneDNN's process-long JIT kernels), except in the
  # mpirun tests (tests/CMakeLists.txt turns them off there). One run, so the long tests of both
  # kinds share the two cores.
  (cd build-asan && UBSAN_OPTIONS=print_stacktrace=1 ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 \
    LSAN_OPTIONS="suppressions=$PWD/../tests/lsan.supp" suite "$@")
fi
cd build
suite "$@"
