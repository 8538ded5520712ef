# Sourced by tools/make_goldens.sh, tools/make_hf_fixtures.sh, tools/check_family_examples.sh and
# the bench scripts.

# transformers and what it needs, at the versions tests/golden/hf/ was made with: the venv of
# tools/make_hf_fixtures.sh (.venv-hf/), where tools/check_hf_export.py runs too.
hf_pins=(
  torch==2.15.0
  transformers==5.23.0
  tokenizers==0.23.3
  safetensors==0.8.0
  numpy==2.4.6
)

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
