#!/usr/bin/env bash
# The memory viewer in a real browser: writes memory.html for a tiny Transformer with
# `loom memory --html`, loads it in headless Chromium, and checks that
#   - the page's script ran to the end without an error (body[data-rendered], no data-error, no
#     "Uncaught" or console error on Chromium's log),
#   - it drew the plot (phase polygons, the peak marker) and filled the buffer table,
#   - a screenshot can be taken (1400x900);
# and a second page, `loom memory --fit --budget B --html` with model.remat = auto, for the frontier:
#   - one mark per frontier point in each panel, each titled with its point's choice (the choices of
#     `loom memory --fit --json`), the choice for B marked in each panel,
#   - a table row per point and one for the chosen, and no script error.
# Installs Debian's chromium package when missing and running as root. Without a browser (no
# network, not root) it prints SKIP and passes. LOOM_CHROMIUM=/path/to/browser picks the browser;
# LOOM_CHROMIUM=none forces the SKIP path.
#
#   tests/profile/check_memory_html.sh LOOM_BINARY [SOURCE_DIR] [OUT_DIR]
set -u
loom=${1:?usage: check_memory_html.sh LOOM_BINARY [SOURCE_DIR] [OUT_DIR]}
src=${2:-$(cd "$(dirname "$0")/../.." && pwd)}
out=${3:-}
keep=1
if [ -z "$out" ]; then
  out=$(mktemp -d /tmp/loom_memory_html.XXXXXX)
  keep=0  # a temporary directory: removed when the check passes
fi
mkdir -p "$out"

find_browser() {
  if [ -n "${LOOM_CHROMIUM:-}" ]; then
    [ "$LOOM_CHROMIUM" != none ] && command -v "$LOOM_CHROMIUM"
    return
  fi
  for b in chromium chromium-browser google-chrome; do
    if command -v "$b" >/dev/null 2>&1; then
      command -v "$b"
      return 0
    fi
  done
  return 1
}

browser=$(find_browser)
if [ -z "$browser" ]; then
  if [ "${LOOM_CHROMIUM:-}" != none ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "chromium not found: installing Debian's chromium package (apt-get install -y chromium)"
    export DEBIAN_FRONTEND=noninteractive
    timeout 300 apt-get install -y chromium >"$out/apt.log" 2>&1 ||
      { timeout 120 apt-get update >>"$out/apt.log" 2>&1 &&
          timeout 300 apt-get install -y chromium >>"$out/apt.log" 2>&1; }
    browser=$(find_browser)
  fi
fi
if [ -z "$browser" ]; then
  echo "SKIP: no chromium and it could not be installed (see $out/apt.log); memory.html was not checked in a browser"
  exit 0
fi

fail=0
check() {  # check CONDITION_RESULT MESSAGE
  if [ "$1" != 0 ]; then
    echo "FAIL: $2"
    fail=1
  else
    echo "ok: $2"
  fi
}

tiny=(model.kind=transformer model.hidden_size=32 model.num_layers=2 model.head_dim=8 model.vocab_size=31
  model.num_outputs=31 model.max_seq_len=16 data.kind=random_tokens data.batch_size=4 data.seq_len=16
  data.vocab_size=31 optimizer.num_minibatches=2)
html="$out/memory.html"
(cd "$src" && "$loom" memory "${tiny[@]}" 'model.remat=MLP,Attn' --html "$html" >"$out/memory.txt" 2>&1)
check $? "loom memory --html wrote $html"
[ -s "$html" ] || { echo "FAIL: no memory.html"; exit 1; }

flags=(--headless --disable-gpu --no-sandbox --user-data-dir="$out/chromium-profile" --window-size=1400,900)
timeout 120 "$browser" "${flags[@]}" --screenshot="$out/memory.png" "file://$html" >"$out/screenshot.log" 2>&1
[ -s "$out/memory.png" ]
check $? "screenshot $out/memory.png"

dump=(timeout 120 "$browser" "${flags[@]}" --enable-logging=stderr --v=0 --dump-dom)
"${dump[@]}" "file://$html" >"$out/dom.html" 2>"$out/dom.log"
check $? "chromium --dump-dom ran"

rendered=$(grep -o 'data-rendered="[0-9]*"' "$out/dom.html" | grep -o '[0-9]\+')
[ -n "$rendered" ] && [ "$rendered" -gt 0 ]
check $? "the page's script ran to the end (data-rendered=${rendered:-missing})"
! grep -q 'data-error=' "$out/dom.html"
check $? "no script error on the page ($(grep -o 'data-error="[^"]*"' "$out/dom.html"))"
! grep -E 'Uncaught|:CONSOLE[^]]*\] "[^"]*(Error|error)' "$out/dom.log"
check $? "no console errors in Chromium's log"
polygons=$(grep -o '<polygon class="area" data-phase="[a-z]*"' "$out/dom.html" | wc -l)
[ "$polygons" -gt 0 ]
check $? "plot drawn: $polygons phase areas"
for phase in forward backward recompute; do
  grep -q "<polygon class=\"area\" data-phase=\"$phase\"" "$out/dom.html"
  check $? "plot has $phase areas"
done
grep -q '<circle id="peak"' "$out/dom.html"
check $? "peak marked"
rows=$(grep -o '<tr class="buf-row" data-id=' "$out/dom.html" | wc -l)
[ "$rows" -gt 0 ]
check $? "buffer table filled: $rows rows"

# Hover: a copy of the page that moves the mouse over the peak step once it has rendered; the
# tooltip must show that step's op and the largest buffers live there.
hover="$out/memory_hover.html"
sed 's|</body>|<script>(function () {\
  var hit = document.getElementById("hit"), r = hit.getBoundingClientRect();\
  var D = JSON.parse(document.getElementById("plan-data").textContent);\
  var x = r.left + (D.peak_step + 0.5) / D.live.length * r.width;\
  hit.dispatchEvent(new MouseEvent("mousemove", { bubbles: true, clientX: x, clientY: r.top + r.height / 2 }));\
  document.body.setAttribute("data-hover", document.getElementById("tip").style.display);\
})();</script></body>|' "$html" >"$hover"
"${dump[@]}" "file://$hover" >"$out/dom_hover.html" 2>"$out/dom_hover.log"
grep -q 'data-hover="block"' "$out/dom_hover.html"
check $? "hovering the plot shows the tooltip"
tip=$(grep -o '<div id="tip"[^>]*>.*</table></div>' "$out/dom_hover.html" | head -1)
echo "$tip" | grep -q 'peak' && [ "$(echo "$tip" | grep -o '<tr>' | wc -l)" -gt 0 ]
check $? "the tooltip names the peak step and lists the buffers live there"
timeout 120 "$browser" "${flags[@]}" --screenshot="$out/memory_hover.png" "file://$hover" >>"$out/screenshot.log" 2>&1

# The frontier: budgets and choices from `--fit --json`, the page fitted to the middle budget.
(cd "$src" && "$loom" memory "${tiny[@]}" model.remat=auto --fit --json >"$out/fit.json" 2>"$out/fit.log")
check $? "loom memory --fit --json"
# The frontier's rows, not the choice for the budget that follows them (marked "chosen": true);
# keys are sorted, so a row's budget and choice come before its "chosen".
rows=$(awk '/"budget_bytes":/ { b = $2; sub(/,$/, "", b) }
            /"choice":/ { c = $0; sub(/^ *"choice": "/, "", c); sub(/",?$/, "", c) }
            /"chosen": false/ { print b "\t" c }' "$out/fit.json")
mapfile -t budgets < <(printf '%s\n' "$rows" | cut -f1)
mapfile -t choices < <(printf '%s\n' "$rows" | cut -f2)
points=${#budgets[@]}
[ "$points" -gt 2 ] && [ "${#choices[@]}" = "$points" ]
check $? "the frontier has $points points with a choice each"
budget=${budgets[$((points / 2))]}
fit_html="$out/memory_fit.html"
(cd "$src" && "$loom" memory "${tiny[@]}" model.remat=auto --fit --budget "$budget" --html "$fit_html" \
  >"$out/fit.txt" 2>&1)
check $? "loom memory --fit --budget $budget --html wrote $fit_html"
"${dump[@]}" "file://$fit_html" >"$out/dom_fit.html" 2>"$out/dom_fit.log"
check $? "chromium --dump-dom ran on the frontier page"
grep -q 'data-rendered="[1-9][0-9]*"' "$out/dom_fit.html" && ! grep -q 'data-error=' "$out/dom_fit.html" &&
  ! grep -E 'Uncaught|:CONSOLE[^]]*\] "[^"]*(Error|error)' "$out/dom_fit.log"
check $? "the frontier page's script ran to the end without an error"
drawn=$(grep -o 'data-frontier="[0-9]*"' "$out/dom_fit.html" | grep -o '[0-9]\+')
[ "${drawn:-0}" = "$points" ]
check $? "the frontier drawn: data-frontier=${drawn:-missing} of $points points"
# (patterns that the drawn elements match and the script's own source text does not)
panels=$(grep -o '<circle class="fit-mark" data-panel="[a-z]\+"' "$out/dom_fit.html" | sort -u | wc -l)
marks=$(grep -o '<circle class="fit-mark" data-panel="[a-z]\+" data-i="[0-9]\+"' "$out/dom_fit.html" | wc -l)
[ "$panels" -ge 2 ] && [ "$marks" = $((points * panels)) ]
check $? "one mark per point in each panel: $marks marks in $panels panels"
labelled=0
for i in $(seq 0 $((points - 1))); do
  grep -o "<title>#$((i + 1)), budget [^<]*</title>" "$out/dom_fit.html" | grep -qF ": ${choices[$i]}; planned" &&
    labelled=$((labelled + 1))
done
[ "$labelled" = "$points" ]
check $? "each point titled with its choice: $labelled of $points"
[ "$panels" -ge 2 ] &&
  [ "$(grep -o '<circle class="fit-chosen" data-panel="[a-z]\+"' "$out/dom_fit.html" | wc -l)" = "$panels" ] &&
  grep -q '<text id="fit-chosen-label" class="fit-chosen-label" x="[0-9.]\+"' "$out/dom_fit.html"
check $? "the choice for budget $budget marked in each panel"
[ "$(grep -o '<tr class="fit-row">' "$out/dom_fit.html" | wc -l)" = "$points" ] &&
  [ "$(grep -o '<tr class="fit-row sel">' "$out/dom_fit.html" | wc -l)" = 1 ]
check $? "the frontier table: a row per point and the chosen one"
timeout 120 "$browser" "${flags[@]}" --screenshot="$out/memory_fit.png" "file://$fit_html" >>"$out/screenshot.log" 2>&1

if [ "$fail" != 0 ]; then
  echo "memory.html check FAILED (files in $out)"
  exit 1
fi
echo "memory.html renders in $("$browser" --version 2>/dev/null | head -1)"
if [ "$keep" = 0 ]; then rm -rf "$out"; else echo "files in $out"; fi
