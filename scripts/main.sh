#!/usr/bin/env bash
# Quick start 1: install what is missing, build, and run the default main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
exec ./build/loom train "$@"
