#!/usr/bin/env bash
# Installs loom's build and test dependencies from Debian packages, only those that are missing.
# Run as root (or with sudo available). Safe to run again.
set -euo pipefail
PKGS=(
  g++ cmake ninja-build pkg-config ccache
  libdnnl-dev              # oneDNN sgemm (runs on libgomp: one thread pool with our kernels; docs/blas.md)
  nlohmann-json3-dev libtomlplusplus-dev libcli11-dev libfmt-dev
  openmpi-bin libopenmpi-dev  # data parallelism across processes and machines (src/dist/, mpirun)
  libgtest-dev
  gnuplot-nox              # `loom plot RUN`: the PNG of the training curves
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
