#!/usr/bin/env bash
# Installs loom's build and test dependencies, only those that are missing: Debian packages, then
# oneDNN 3.x into .deps/onednn inside the checkout (below). Run as root (or with sudo available)
# for the packages. Safe to run again.
set -euo pipefail
PKGS=(
  g++ cmake ninja-build pkg-config ccache
  python3-pip              # fetches oneDNN 3.x (below)
  nlohmann-json3-dev libtomlplusplus-dev libcli11-dev libfmt-dev
  openmpi-bin libopenmpi-dev  # data parallelism across processes and machines (src/dist/, mpirun)
  libgtest-dev
  gnuplot-nox              # `loom plot RUN`: the PNG of the training curves
  bindfs                   # tests: a real FUSE mount, which refuses renameat2's flags as NFS does
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# A python3 with its own pip (e.g. pyenv's) will do instead of Debian's.
if python3 -m pip --version >/dev/null 2>&1; then
  for i in "${!missing[@]}"; do [ "${missing[$i]}" = python3-pip ] && unset 'missing[i]'; done
fi
if [ ${#missing[@]} -ne 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# oneDNN 3.2 (loom's GEMMs: sgemm and the bf16 matmul; docs/blas.md), from Intel's CPU-only builds
# on the Python package index, whose library needs only GCC's libgomp: one thread pool with loom's
# own OpenMP kernels. Debian 12 ships oneDNN 2.6, whose matmul leaves the AMX tiles of Intel Xeons
# unused for several product layouts. The wheels are unpacked, not installed: only their data
# (include/, lib/) is kept, in the prefix CMakeLists.txt looks in first; the binaries carry an
# rpath to it. No Python environment is involved at build or run time.
ONEDNN_PREFIX="$(cd "$(dirname "$0")/.." && pwd)/.deps/onednn"
ONEDNN_VERSION=2023.2.0  # oneDNN 3.2.0
if [ ! -f "$ONEDNN_PREFIX/lib/libdnnl.so.3" ] || [ ! -f "$ONEDNN_PREFIX/include/oneapi/dnnl/dnnl.h" ]; then
  echo "installing: oneDNN 3.2 (onednn-cpu-gomp $ONEDNN_VERSION) into $ONEDNN_PREFIX"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: -d "$tmp" \
    "onednn-cpu-gomp==$ONEDNN_VERSION" "onednn-devel-cpu-gomp==$ONEDNN_VERSION"
  rm -rf "$ONEDNN_PREFIX.partial"
  python3 - "$ONEDNN_PREFIX.partial" "$tmp"/*.whl <<'PY'
import os, sys, zipfile
# A wheel's "<name>.data/data/" tree is what an install puts under its prefix. The library comes
# three times (libdnnl.so, .so.3, .so.3.2, no symlinks in wheels): keep the soname's file only.
prefix = sys.argv[1]
for wheel in sys.argv[2:]:
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            head, sep, rel = name.partition(".data/data/")
            if not sep or "/" in head or rel.startswith("lib/python") or rel.startswith("lib/cmake"):
                continue
            if rel.startswith("lib/libdnnl.so") and rel != "lib/libdnnl.so.3":
                continue
            dest = os.path.join(prefix, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(name) as src, open(dest, "wb") as out:
                out.write(src.read())
PY
  ln -s libdnnl.so.3 "$ONEDNN_PREFIX.partial/lib/libdnnl.so"
  rm -rf "$ONEDNN_PREFIX"
  mv "$ONEDNN_PREFIX.partial" "$ONEDNN_PREFIX"
fi
