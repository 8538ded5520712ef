#!/usr/bin/env bash
# Configures and builds the `loom` command (Release) into build/, then installs it into
# $LOOM_PREFIX/bin (default /usr/local/bin, which is on PATH). Without write access there (not
# root), it installs into ~/.local/bin instead and says so. Only the `loom` target: the test
# binaries are scripts/test.sh's (`ninja -C build` builds everything). Compiles go through ccache
# when it is installed (CMakeLists.txt), and an up-to-date build does nothing.
# Usage: [LOOM_PREFIX=DIR] scripts/build.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
ninja -C build loom
prefix="${LOOM_PREFIX:-/usr/local}"
if ! mkdir -p "$prefix/bin" 2>/dev/null || [ ! -w "$prefix/bin" ]; then
  echo "cannot write $prefix/bin: installing into $HOME/.local instead (set LOOM_PREFIX to choose)"
  prefix="$HOME/.local"
fi
cmake --install build --prefix "$prefix" >/dev/null
echo "installed $prefix/bin/loom ($("$prefix/bin/loom" --version))"
case ":$PATH:" in
  *":$prefix/bin:"*) ;;
  *) echo "note: $prefix/bin is not on PATH; add it: export PATH=\"$prefix/bin:\$PATH\"" ;;
esac
