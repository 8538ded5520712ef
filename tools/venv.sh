# Sourced by tools/make_goldens.sh, tools/make_hf_fixtures.sh and the bench scripts.
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

#   venv_python VAR IMPORTS VENV PIN...
# prints the python a benchmark uses: the one named by the environment variable VAR when set (it
# must import IMPORTS, a comma-separated module list), else VENV's, made or topped up with the pins
# (make_venv) when it cannot import them. make_venv's messages go to stderr.
venv_python() {
  local var="$1" imports="$2" venv="$3"
  shift 3
  local given="${!var:-}"
  local py="${given:-$venv/bin/python}"
  if ! "$py" -c "import $imports" 2>/dev/null; then
    if [[ -n "$given" ]]; then
      echo "$(basename "$0"): $var=$given cannot import $imports; unset it to use $venv" >&2
      return 2
    fi
    make_venv "$venv" "$@" >&2
  fi
  echo "$py"
}
