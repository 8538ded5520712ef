#!/usr/bin/env bash
# Renders a set of conversations with real chat templates twice, with Python's jinja2 in the
# environment transformers gives templates and with `loom prepare chat --render-only`, and
# compares the texts byte for byte (tools/check_chat_templates.py says how):
#
#   bash tools/check_chat_templates.sh TEMPLATE_DIR [--loom build/loom] [--conversations FILE.jsonl]
#
# TEMPLATE_DIR holds one chat template per file (*.jinja, e.g. copied from the models'
# tokenizer_config.json); the real templates are not part of the repository. jinja2 comes from
# its own venv in .venv-chat/ (gitignored); loom's build and tests do not need it.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-chat"
# shellcheck source=tools/venv.sh
source "$root/tools/venv.sh"

# The version transformers requires at least (3.1) that the comparison was made with.
make_venv "$venv" jinja2==3.1.6

exec "$venv/bin/python" "$root/tools/check_chat_templates.py" --loom "$root/build/loom" "$@"
