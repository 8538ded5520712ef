# Sourced by tools/make_goldens.sh and tools/make_hf_fixtures.sh.
#   make_venv VENV PIN...
# creates the venv VENV when it is missing (with $PYTHON, else python3.11 when installed, else
# python3) and installs the pinned packages into it.
make_venv() {
  local venv="$1" python="${PYTHON:-}"
  shift
  if [[ -z "$python" ]]; then
    if command -v python3.11 >/dev/null 2>&1; then python=python3.11; else python=python3; fi
  fi
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "$(basename "$0"): creating $venv with $($python --version 2>&1)"
    "$python" -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
}
