#!/usr/bin/env bash
# The layering of docs/ARCHITECTURE.md ("Layers and directories"), checked on every #include "..."
# under src/: each room may include only itself and the rooms listed for it, so includes point one
# way and the graph of rooms stays acyclic. Prints every violation; exit 1 if there is one.
set -euo pipefail
src="${1:?usage: check_includes.sh SRC_DIR}"
declare -A allowed=(
  [core]=""
  [graph]="core"
  [nn]="graph core"
  [backend]="graph core"
  [runtime]="backend graph core"
  [dist]="core"
  [data]="core"
  [optim]="runtime backend graph core"
  [io]="nn runtime backend graph core"
  [train]="optim data io dist nn runtime backend graph core"
  [sample]="train optim data io nn runtime backend graph core"
  [report]="train optim data io dist nn runtime backend graph core"
  [run]="sample report train optim data io dist nn runtime backend graph core"
  [cli]="run sample report train optim data io dist nn runtime backend graph core"
)
bad=0
rooms=0
for dir in "$src"/*/; do
  room=$(basename "$dir")
  rooms=$((rooms + 1))
  if [[ -z "${allowed[$room]+x}" ]]; then
    echo "src/$room/: a room the layering does not know" \
         "(add it to tests/layout/check_includes.sh and docs/ARCHITECTURE.md)"
    bad=1
    continue
  fi
  [[ -f "$dir/README.md" ]] || { echo "src/$room/: no README.md saying what it holds and may use"; bad=1; }
  while IFS= read -r line; do
    file=${line%%:*}
    target=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$line")
    [[ "$target" == "$room" ]] && continue
    if [[ " ${allowed[$room]} " != *" $target "* ]]; then
      echo "${file#"$src"/}: includes $target/ (src/$room/ may include: ${allowed[$room]:-none})"
      bad=1
    fi
  done < <(grep -rHE '^#include "[a-z_]+/' "$dir" --include='*.h' --include='*.cpp' --include='*.def' || true)
done
# The planner never reaches execution: graph/ may not include backend/ or runtime/ (covered above),
# and backend/ reads only the op table and the graph IR of graph/.
if grep -rhE '^#include "graph/' "$src/backend" | grep -vE '"graph/(graph\.h|op\.h|ops\.def|attrs\.h)"'; then
  echo "backend/ includes graph/ beyond the op table and the IR (above)"
  bad=1
fi
[[ $bad -eq 0 ]] && echo "layering: $rooms rooms, every include points down"
exit $bad
