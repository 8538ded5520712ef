#!/usr/bin/env bash
# Quick start 2: install what is missing, build, and run every test (ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
cd build
ctest --output-on-failure -j 2 "$@"
