#include "report/memory_html.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <map>
#include <stdexcept>

#include "core/error.h"
#include "core/write_error.h"
#include "report/memory_report.h"

namespace loom {

namespace {

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

// JSON safe inside <script>: no "</" (would close the element) and no "<!--".
std::string script_json(const nlohmann::json& j) {
  const std::string s = j.dump(-1, ' ', /*ensure_ascii=*/true);
  std::string o;
  o.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<' && i + 1 < s.size() && (s[i + 1] == '/' || s[i + 1] == '!')) {
      o += "\\u003c";
      continue;
    }
    o += s[i];
  }
  return o;
}

// Interned strings (scopes and op names repeat across thousands of steps and buffers).
struct Strings {
  std::map<std::string, int> index;
  nlohmann::json list = nlohmann::json::array();
  int operator()(const std::string& s) {
    auto [it, fresh] = index.emplace(s, static_cast<int>(list.size()));
    if (fresh) list.push_back(s);
    return it->second;
  }
};

const char* kPage = R"HTML(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>__TITLE__ - loom memory</title>
<style>
  :root { --fg: #1d2330; --muted: #5b6475; --line: #d9dde5; --bg: #ffffff; --panel: #f5f7fa; }
  * { box-sizing: border-box; }
  body { margin: 0; padding: 18px 24px 40px; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
         color: var(--fg); background: var(--bg); }
  h1 { font-size: 19px; margin: 0 0 4px; font-weight: 600; }
  .sub { color: var(--muted); margin-bottom: 12px; }
  .cards { display: flex; flex-wrap: wrap; gap: 8px; margin-bottom: 12px; }
  .card { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: 6px 12px;
          min-width: 120px; }
  .card .k { color: var(--muted); font-size: 12px; }
  .card .v { font-size: 16px; font-weight: 600; font-variant-numeric: tabular-nums; }
  .legend { display: flex; gap: 16px; align-items: center; margin: 4px 0 6px; color: var(--muted); font-size: 13px; }
  .legend span.sw { display: inline-block; width: 12px; height: 12px; border-radius: 2px; margin-right: 5px;
                    vertical-align: -1px; }
  #plot-wrap { position: relative; border: 1px solid var(--line); border-radius: 6px; background: #fff; }
  #plot { display: block; width: 100%; height: auto; }
  #plot text { font: 12px system-ui, sans-serif; fill: var(--muted); }
  #plot .peak-label { fill: #b0243a; font-weight: 600; }
  #tip { position: absolute; pointer-events: none; background: rgba(255,255,255,0.97); border: 1px solid #aab1bf;
         border-radius: 6px; padding: 8px 10px; box-shadow: 0 2px 10px rgba(0,0,0,0.15); font-size: 12px;
         display: none; max-width: 560px; z-index: 5; }
  #tip b { font-weight: 600; }
  #tip table { border-collapse: collapse; margin-top: 4px; }
  #tip td { padding: 1px 6px 1px 0; white-space: nowrap; font-variant-numeric: tabular-nums; }
  h2 { font-size: 16px; margin: 20px 0 6px; font-weight: 600; }
  .controls { display: flex; gap: 14px; align-items: center; margin-bottom: 6px; color: var(--muted); }
  .controls input[type=text] { padding: 3px 6px; border: 1px solid var(--line); border-radius: 4px; width: 240px; }
  table.bufs { border-collapse: collapse; width: 100%; font-size: 13px; }
  table.bufs th { text-align: left; background: var(--panel); border-bottom: 2px solid var(--line); padding: 5px 8px;
                  cursor: pointer; user-select: none; white-space: nowrap; position: sticky; top: 0; }
  table.bufs th.sorted::after { content: " \25BE"; }
  table.bufs th.sorted.asc::after { content: " \25B4"; }
  table.bufs td { border-bottom: 1px solid #eceef2; padding: 3px 8px; white-space: nowrap;
                  font-variant-numeric: tabular-nums; }
  table.bufs td.num { text-align: right; }
  table.bufs tr.buf-row:hover { background: #eef3fb; cursor: pointer; }
  table.bufs tr.sel { background: #fdeccf !important; }
  .ph { display: inline-block; padding: 0 5px; border-radius: 3px; color: #fff; font-size: 11px; }
  .note { color: var(--muted); font-size: 12px; margin-top: 6px; }
  #frontier { display: block; width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px; }
  #frontier text { font: 12px system-ui, sans-serif; fill: var(--muted); }
  #frontier .fit-label { fill: var(--fg); font-size: 11px; }
  #frontier .fit-chosen-label { fill: #b0243a; font-weight: 600; }
  #frontier .fit-mark:hover { stroke: #222; stroke-width: 2; }
  table.bufs tr.fit-row.sel td:first-child { color: #b0243a; font-weight: 600; }
  table.bufs tr.fit-row td:last-child { white-space: normal; }
</style>
</head>
<body>
<h1>__TITLE__</h1>
<div class="sub">Memory plan of one minibatch's program (forward, backward, recompute) as the executor runs it:
live activation bytes per schedule step. Planned, not measured: nothing ran to draw this page.</div>
<div class="cards" id="cards"></div>
<div class="legend" id="legend"></div>
<div id="plot-wrap">
  <svg id="plot" role="img" aria-label="live arena bytes over the schedule"></svg>
  <div id="tip"></div>
</div>
__FRONTIER__<h2>Buffers</h2>
<div class="controls">
  <label>filter <input type="text" id="filter" placeholder="scope, op, shape or dtype"></label>
  <label><input type="checkbox" id="at-peak"> live at the peak only</label>
  <span id="count"></span>
</div>
<table class="bufs" id="buffers">
  <thead><tr id="buffer-head"></tr></thead>
  <tbody id="buffer-rows"></tbody>
</table>
<div class="note">Click a column to sort, a row to shade its live range on the plot. Sizes are the planned
(64-byte aligned) buffer sizes; views and in-place outputs share their root's buffer.</div>
<script type="application/json" id="plan-data">__DATA__</script>
<script>
(function () {
  'use strict';
  window.addEventListener('error', function (e) { document.body.setAttribute('data-error', String(e.message)); });
  var D = JSON.parse(document.getElementById('plan-data').textContent);
  var COL = { forward: '#4e79a7', backward: '#f28e2b', recompute: '#e15759' };
  var N = D.live.length;
  function fmtB(b) {
    if (b >= 1073741824) return (b / 1073741824).toFixed(2) + ' GiB';
    if (b >= 1048576) return (b / 1048576).toFixed(2) + ' MiB';
    if (b >= 1024) return (b / 1024).toFixed(1) + ' KiB';
    return b + ' B';
  }
  function esc(s) {
    var ent = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' };
    return String(s).replace(/[&<>"]/g, function (c) { return ent[c]; });
  }
  function phaseOf(s) { return D.phases[D.phase[s]]; }
  function badge(p) { return '<span class="ph" style="background:' + COL[p] + '">' + p + '</span>'; }
  var bufs = D.buffers.map(function (b, i) {
    return { id: i, scope: D.strings[b[0]], op: D.strings[b[1]], shape: b[2], dtype: b[3], bytes: b[4],
             first: b[5], last: b[6], offset: b[7], len: b[6] - b[5] + 1 };
  });

  // ---- cards and legend
  var cards = [['arena (allocated)', fmtB(D.arena_bytes)], ['live-bytes peak', fmtB(D.lower_bound_bytes)],
               ['peak at step', N ? D.peak_step + ' of ' + N : '-'], ['params', fmtB(D.param_bytes)],
               ['grads', fmtB(D.grad_bytes)]];
  if (D.optimizer_bytes >= 0) cards.push(['optimizer state', fmtB(D.optimizer_bytes)]);
  cards.push(['inputs', fmtB(D.input_bytes)]);
  cards.push(['largest kernel workspace', fmtB(D.max_workspace_bytes) + ' (' + D.workspace_threads + ' threads)']);
  var total = D.arena_bytes + D.param_bytes + D.grad_bytes + D.input_bytes + Math.max(0, D.optimizer_bytes);
  cards.push(['total', fmtB(total)], ['buffers', String(bufs.length)]);
  document.getElementById('cards').innerHTML = cards.map(function (c) {
    return '<div class="card"><div class="k">' + esc(c[0]) + '</div><div class="v">' + esc(c[1]) + '</div></div>';
  }).join('');
  var present = {};
  for (var s = 0; s < N; ++s) present[phaseOf(s)] = true;
  document.getElementById('legend').innerHTML = D.phases.map(function (p) {
    return '<span' + (present[p] ? '' : ' style="opacity:0.4"') + '><span class="sw" style="background:' + COL[p] +
           '"></span>' + p + '</span>';
  }).join('') + '<span><span class="sw" style="background:#b0243a"></span>peak</span>';

  // ---- plot
  var W = 1200, H = 380, L = 78, R = 18, T = 16, B = 40, PW = W - L - R, PH = H - T - B;
  var svg = document.getElementById('plot');
  svg.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
  function niceStep(range, n) {
    var raw = range / n, p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 2.5 ? 2.5 : m <= 5 ? 5 : 10) * p;
  }
  var unit = D.arena_bytes >= 1073741824 ? [1073741824, 'GiB']
           : D.arena_bytes >= 1048576 ? [1048576, 'MiB'] : [1024, 'KiB'];
  var ytop = Math.max(D.arena_bytes, 1) / unit[0] * 1.08, ystep = niceStep(ytop, 5);
  ytop = Math.ceil(ytop / ystep) * ystep;
  function X(s) { return L + (N ? s * PW / N : 0); }
  function Y(b) { return T + PH - (b / unit[0]) / ytop * PH; }
  var g = [];
  for (var v = 0; v <= ytop + 1e-9; v += ystep) {
    var y = Y(v * unit[0]);
    g.push('<line x1="' + L + '" x2="' + (W - R) + '" y1="' + y + '" y2="' + y + '" stroke="#eceef2"/>');
    g.push('<text x="' + (L - 6) + '" y="' + (y + 4) + '" text-anchor="end">' + (+v.toFixed(3)) + ' ' + unit[1] +
           '</text>');
  }
  var xstep = Math.max(1, niceStep(Math.max(N, 1), 10));
  for (var xs = 0; xs <= N; xs += xstep) {
    g.push('<line x1="' + X(xs) + '" x2="' + X(xs) + '" y1="' + (T + PH) + '" y2="' + (T + PH + 5) +
           '" stroke="#99a"/>');
    g.push('<text x="' + X(xs) + '" y="' + (T + PH + 18) + '" text-anchor="middle">' + xs + '</text>');
  }
  g.push('<text x="' + (L + PW / 2) + '" y="' + (H - 4) + '" text-anchor="middle">schedule step</text>');
  // One step-function area per run of steps in the same phase.
  var a = 0;
  while (a < N) {
    var b2 = a, p = D.phase[a];
    while (b2 + 1 < N && D.phase[b2 + 1] === p) ++b2;
    var pts = [X(a) + ',' + Y(0)];
    for (var k = a; k <= b2; ++k) pts.push(X(k) + ',' + Y(D.live[k]), X(k + 1) + ',' + Y(D.live[k]));
    pts.push(X(b2 + 1) + ',' + Y(0));
    g.push('<polygon class="area" data-phase="' + D.phases[p] + '" points="' + pts.join(' ') +
           '" fill="' + COL[D.phases[p]] +
           '" fill-opacity="0.75" stroke="' + COL[D.phases[p]] + '" stroke-width="0.8"/>');
    a = b2 + 1;
  }
  g.push('<line x1="' + L + '" x2="' + (W - R) + '" y1="' + Y(D.arena_bytes) + '" y2="' + Y(D.arena_bytes) +
         '" stroke="#555" stroke-dasharray="5,4"/>');
  g.push('<text x="' + (W - R - 4) + '" y="' + (Y(D.arena_bytes) - 5) + '" text-anchor="end">arena ' +
         fmtB(D.arena_bytes) + '</text>');
  g.push('<line x1="' + L + '" x2="' + L + '" y1="' + T + '" y2="' + (T + PH) + '" stroke="#99a"/>');
  g.push('<line x1="' + L + '" x2="' + (W - R) + '" y1="' + (T + PH) + '" y2="' + (T + PH) + '" stroke="#99a"/>');
  if (N) {
    var px = X(D.peak_step + 0.5), py = Y(D.live[D.peak_step]), right = px > L + PW * 0.6;
    g.push('<line id="peak-line" x1="' + px + '" x2="' + px + '" y1="' + T + '" y2="' + (T + PH) +
           '" stroke="#b0243a" stroke-dasharray="3,3"/>');
    g.push('<circle id="peak" cx="' + px + '" cy="' + py + '" r="5" fill="#b0243a" stroke="#fff" stroke-width="1.5"/>');
    var ps = D.peak_step, pscope = D.strings[D.scope[ps]];
    g.push('<text class="peak-label" x="' + (px + (right ? -8 : 8)) + '" y="' + (T + 14) +
           '" text-anchor="' + (right ? 'end' : 'start') + '">peak ' + fmtB(D.live[ps]) + ' at step ' + ps + ': ' +
           esc(D.strings[D.op[ps]]) + (pscope ? ' in ' + esc(pscope) : '') + ' (' + phaseOf(ps) + ')</text>');
  }
  g.push('<rect id="range" x="0" y="' + T + '" width="0" height="' + PH +
         '" fill="#f5b041" fill-opacity="0.25" visibility="hidden"/>');
  g.push('<line id="cursor" x1="0" x2="0" y1="' + T + '" y2="' + (T + PH) +
         '" stroke="#222" stroke-width="0.8" visibility="hidden"/>');
  g.push('<circle id="dot" r="4" fill="#222" visibility="hidden"/>');
  g.push('<rect id="hit" x="' + L + '" y="' + T + '" width="' + PW + '" height="' + PH + '" fill="transparent"/>');
  svg.innerHTML = g.join('');

  // ---- hover: the step's op and the largest buffers live there
  var tip = document.getElementById('tip'), cursor = document.getElementById('cursor');
  var dot = document.getElementById('dot');
  var wrap = document.getElementById('plot-wrap');
  function liveAt(s, n) {
    var r = [];
    for (var i = 0; i < bufs.length; ++i) if (bufs[i].first <= s && s <= bufs[i].last) r.push(bufs[i]);
    r.sort(function (x, y) { return y.bytes - x.bytes; });
    return { count: r.length, top: r.slice(0, n) };
  }
  function showStep(s, cx, cy) {
    var x = X(s + 0.5);
    cursor.setAttribute('x1', x); cursor.setAttribute('x2', x); cursor.setAttribute('visibility', 'visible');
    dot.setAttribute('cx', x); dot.setAttribute('cy', Y(D.live[s])); dot.setAttribute('visibility', 'visible');
    var lv = liveAt(s, 6), ph = phaseOf(s);
    var h = '<div><b>step ' + s + '</b> ' + badge(ph) + ' <b>' + esc(D.strings[D.op[s]]) + '</b> ' +
            (D.strings[D.scope[s]] ? 'in <b>' + esc(D.strings[D.scope[s]]) + '</b>' : '') + '</div>' +
            '<div>live ' + fmtB(D.live[s]) + ' in ' + lv.count + ' buffers' +
            (s === D.peak_step ? ' &mdash; <b style="color:#b0243a">peak</b>' : '') + '</div>';
    if (lv.top.length) {
      h += '<table>';
      lv.top.forEach(function (b) {
        h += '<tr><td>' + fmtB(b.bytes) + '</td><td>' + esc(b.scope || '-') + '</td><td>' + esc(b.op) +
             '</td><td>' + esc(b.shape) +
             '</td><td>' + esc(b.dtype) + '</td><td>' + b.first + '&ndash;' + b.last + '</td></tr>';
      });
      h += '</table>';
    }
    tip.innerHTML = h;
    tip.style.display = 'block';
    var wr = wrap.getBoundingClientRect();
    var left = cx - wr.left + 14, top = cy - wr.top + 14;
    if (left + tip.offsetWidth > wr.width) left = Math.max(0, cx - wr.left - tip.offsetWidth - 14);
    tip.style.left = left + 'px';
    tip.style.top = Math.min(top, Math.max(0, wr.height - tip.offsetHeight)) + 'px';
  }
  var hit = document.getElementById('hit');
  hit.addEventListener('mousemove', function (e) {
    var r = svg.getBoundingClientRect();
    var vx = (e.clientX - r.left) * W / r.width;
    var s = Math.floor((vx - L) / PW * N);
    if (s < 0 || s >= N) return;
    showStep(s, e.clientX, e.clientY);
  });
  hit.addEventListener('mouseleave', function () {
    tip.style.display = 'none';
    cursor.setAttribute('visibility', 'hidden');
    dot.setAttribute('visibility', 'hidden');
  });

  // ---- the buffer table
  var cols = [
    { key: 'bytes', label: 'size', num: true, fmt: function (b) { return fmtB(b.bytes); } },
    { key: 'scope', label: 'scope', fmt: function (b) { return esc(b.scope || '-'); } },
    { key: 'op', label: 'op', fmt: function (b) { return esc(b.op); } },
    { key: 'shape', label: 'shape', fmt: function (b) { return esc(b.shape); } },
    { key: 'dtype', label: 'dtype', fmt: function (b) { return esc(b.dtype); } },
    { key: 'first', label: 'first step', num: true, fmt: function (b) { return b.first; } },
    { key: 'last', label: 'last step', num: true, fmt: function (b) { return b.last; } },
    { key: 'len', label: 'live steps', num: true, fmt: function (b) { return b.len; } },
    { key: 'phases', label: 'live range',
      fmt: function (b) { return badge(phaseOf(b.first)) + ' &rarr; ' + badge(phaseOf(b.last)); } },
    { key: 'offset', label: 'arena offset', num: true, fmt: function (b) { return b.offset; } }
  ];
  var sortKey = 'bytes', asc = false, selected = -1, LIMIT = 400;
  var head = document.getElementById('buffer-head');
  head.innerHTML = cols.map(function (c) { return '<th data-key="' + c.key + '">' + c.label + '</th>'; }).join('');
  head.addEventListener('click', function (e) {
    var k = e.target.getAttribute('data-key');
    if (!k) return;
    if (k === sortKey) {
      asc = !asc;
    } else {
      sortKey = k;
      asc = !cols.filter(function (c) { return c.key === k; })[0].num;
    }
    renderTable();
  });
  document.getElementById('filter').addEventListener('input', renderTable);
  document.getElementById('at-peak').addEventListener('change', renderTable);
  function renderTable() {
    var f = document.getElementById('filter').value.toLowerCase(), atPeak = document.getElementById('at-peak').checked;
    var rows = bufs.filter(function (b) {
      if (atPeak && !(b.first <= D.peak_step && D.peak_step <= b.last)) return false;
      return !f || (b.scope + ' ' + b.op + ' ' + b.shape + ' ' + b.dtype).toLowerCase().indexOf(f) >= 0;
    });
    var key = sortKey === 'phases' ? 'first' : sortKey;
    rows.sort(function (x, y) {
      var u = x[key], w = y[key], c = u < w ? -1 : u > w ? 1 : 0;
      return (asc ? c : -c) || (y.bytes - x.bytes) || (x.id - y.id);
    });
    Array.prototype.forEach.call(head.children, function (th) {
      th.className = th.getAttribute('data-key') === sortKey ? 'sorted' + (asc ? ' asc' : '') : '';
    });
    document.getElementById('count').textContent = rows.length + ' of ' + bufs.length + ' buffers' +
        (rows.length > LIMIT ? ' (first ' + LIMIT + ' shown)' : '');
    document.getElementById('buffer-rows').innerHTML = rows.slice(0, LIMIT).map(function (b) {
      var open = '<tr class="buf-row' + (b.id === selected ? ' sel' : '') + '" data-id="' + b.id + '">';
      return open + cols.map(function (c) {
        return '<td' + (c.num ? ' class="num"' : '') + '>' + c.fmt(b) + '</td>';
      }).join('') + '</tr>';
    }).join('');
  }
  document.getElementById('buffer-rows').addEventListener('click', function (e) {
    var tr = e.target.closest('tr');
    if (!tr) return;
    var id = +tr.getAttribute('data-id'), b = bufs[id], rg = document.getElementById('range');
    selected = selected === id ? -1 : id;
    if (selected >= 0) {
      rg.setAttribute('x', X(b.first)); rg.setAttribute('width', Math.max(1, X(b.last + 1) - X(b.first)));
      rg.setAttribute('visibility', 'visible');
    } else {
      rg.setAttribute('visibility', 'hidden');
    }
    renderTable();
  });
  renderTable();

  // ---- model.remat = auto's frontier: one panel per measure over the budget, one mark per point
  function drawFrontier(F) {
    var rows = F.points.map(function (p, i) { return { n: String(i + 1), p: p, chosen: false }; });
    if (F.chosen) rows.push({ n: 'chosen', p: F.chosen, chosen: true });
    rows.sort(function (x, y) { return (y.p.budget_bytes - x.p.budget_bytes) || (y.chosen - x.chosen); });
    function share(p) { return 100 * p.recompute_flops / p.step_flops; }
    function fmtS(v) {
      return v >= 1 ? +v.toPrecision(4) + ' s' : v >= 1e-3 ? +(v * 1e3).toPrecision(4) + ' ms'
                                                           : +(v * 1e6).toPrecision(4) + ' \u00b5s';
    }
    var panels = [
      { key: 'total', label: 'planned total', val: function (p) { return p.total_bytes; }, bytes: true },
      { key: 'recompute', label: 'recompute, % of the step\'s FLOPs', val: share, fmt: function (v) { return +v.toFixed(2) + '%'; } }
    ];
    if (F.ceiling_flops > 0)
      panels.push({ key: 'step', label: 'predicted step time', val: function (p) { return p.predicted_step_seconds; },
                    fmt: fmtS });
    var FW = 1200, FL = 78, FR = 18, FT = 48, FB = 40, FPH = 140, GAP = 34, FPW = FW - FL - FR;
    var FH = FT + panels.length * FPH + (panels.length - 1) * GAP + FB;
    var fsvg = document.getElementById('frontier');
    fsvg.setAttribute('viewBox', '0 0 ' + FW + ' ' + FH);
    var budgets = F.points.map(function (p) { return p.budget_bytes; });
    var bhi = Math.max.apply(null, budgets), blo = Math.min.apply(null, budgets);
    var bpad = (bhi - blo) * 0.04 || bhi * 0.02 || 1;
    function FX(b) { return FL + (b - blo + bpad) / (bhi - blo + 2 * bpad) * FPW; }
    // A budget above the no-remat plan chooses what the no-remat plan's budget does: drawn there.
    function BX(b) { return FX(Math.min(b, bhi)); }
    function byteUnit(b) { return b >= 1073741824 ? [1073741824, 'GiB'] : b >= 1048576 ? [1048576, 'MiB'] : [1024, 'KiB']; }
    function ticks(lo, hi, n) {
      if (!(hi > lo)) return [lo];
      var st = niceStep(hi - lo, n), out = [];
      for (var t = Math.ceil(lo / st) * st; t <= hi + st * 1e-9; t += st) out.push(t);
      return out;
    }
    var f = [], bu = byteUnit(bhi);
    panels.forEach(function (pn, k) {
      var top = FT + k * (FPH + GAP), vals = rows.map(function (r) { return pn.val(r.p); });
      var lo = Math.min.apply(null, vals), hi = Math.max.apply(null, vals);
      if (pn.bytes) { lo = Math.min(lo, blo); hi = Math.max(hi, bhi); }
      var pad = (hi - lo) * 0.08 || Math.abs(hi) * 0.05 || 1;
      lo = pn.bytes || pn.key === 'step' ? Math.max(0, lo - pad) : 0;
      hi += pad;
      var u = pn.bytes ? byteUnit(hi)[0] : 1;
      function FY(v) { return top + FPH - (v - lo) / (hi - lo) * FPH; }
      ticks(lo / u, hi / u, 4).forEach(function (t) {
        var y = FY(t * u);
        f.push('<line x1="' + FL + '" x2="' + (FW - FR) + '" y1="' + y + '" y2="' + y + '" stroke="#eceef2"/>');
        f.push('<text x="' + (FL - 6) + '" y="' + (y + 4) + '" text-anchor="end">' +
               (pn.bytes ? +t.toFixed(3) + ' ' + byteUnit(hi)[1] : pn.fmt(t)) + '</text>');
      });
      f.push('<line x1="' + FL + '" x2="' + FL + '" y1="' + top + '" y2="' + (top + FPH) + '" stroke="#99a"/>');
      f.push('<line x1="' + FL + '" x2="' + (FW - FR) + '" y1="' + (top + FPH) + '" y2="' + (top + FPH) +
             '" stroke="#99a"/>');
      f.push('<text x="' + FL + '" y="' + (top - 8) + '">' + esc(pn.label) + '</text>');
      if (pn.bytes)  // what fits lies on or below planned = budget
        f.push('<line class="fit-budget-line" x1="' + FX(blo) + '" y1="' + FY(blo) + '" x2="' + FX(bhi) + '" y2="' +
               FY(bhi) + '" stroke="#999" stroke-dasharray="5,4"/>' +
               '<text x="' + FX((blo + bhi) / 2) + '" y="' + (FY((blo + bhi) / 2) - 8) +
               '" text-anchor="middle">planned = budget</text>');
      var pts = F.points.map(function (p) { return BX(p.budget_bytes) + ',' + FY(pn.val(p)); });
      f.push('<polyline points="' + pts.join(' ') + '" fill="none" stroke="#4e79a7" stroke-width="1.5"/>');
      rows.forEach(function (r) {
        var x = BX(r.p.budget_bytes), y = FY(pn.val(r.p));
        var title = (r.chosen ? 'chosen for ' : '#' + r.n + ', budget ') + fmtB(r.p.budget_bytes) + ': ' + r.p.choice +
                    '; planned ' + fmtB(r.p.total_bytes) + ', recompute ' + share(r.p).toFixed(1) + '%';
        if (r.chosen) {
          f.push('<circle class="fit-chosen" data-panel="' + pn.key + '" cx="' + x + '" cy="' + y +
                 '" r="8" fill="none" stroke="#b0243a" stroke-width="2.5"><title>' + esc(title) + '</title></circle>');
          return;
        }
        f.push('<circle class="fit-mark" data-panel="' + pn.key + '" data-i="' + (+r.n - 1) + '" cx="' + x + '" cy="' +
               y + '" r="4.5" fill="#4e79a7" stroke="#fff" stroke-width="1"><title>' + esc(title) + '</title></circle>');
        if (k === 0)
          f.push('<text class="fit-label" x="' + x + '" y="' + (y + 16) + '" text-anchor="middle">' + r.n + '</text>');
      });
    });
    if (F.chosen) {
      var cx = BX(F.chosen.budget_bytes);
      f.push('<line id="fit-chosen-line" x1="' + cx + '" x2="' + cx + '" y1="' + (FT - 26) + '" y2="' + (FH - FB) +
             '" stroke="#b0243a" stroke-dasharray="3,3"/>');
      f.push('<text id="fit-chosen-label" class="fit-chosen-label" x="' + cx + '" y="' + (FT - 30) + '">budget ' +
             fmtB(F.chosen.budget_bytes) + ': ' + esc(F.chosen.choice) + '</text>');
    }
    ticks((blo - bpad) / bu[0], (bhi + bpad) / bu[0], 8).forEach(function (t) {
      var x = FX(t * bu[0]), y = FH - FB;
      f.push('<line x1="' + x + '" x2="' + x + '" y1="' + y + '" y2="' + (y + 5) + '" stroke="#99a"/>');
      f.push('<text x="' + x + '" y="' + (y + 18) + '" text-anchor="middle">' + (+t.toFixed(3)) + ' ' + bu[1] + '</text>');
    });
    f.push('<text x="' + (FL + FPW / 2) + '" y="' + (FH - 4) + '" text-anchor="middle">budget</text>');
    fsvg.innerHTML = f.join('');
    if (F.chosen) {  // centred on the chosen budget's line, kept inside the chart: cut short, whole in its title
      var lab = document.getElementById('fit-chosen-label'), full = lab.textContent, n = full.length;
      while (n > 20 && lab.getComputedTextLength() > FPW) {
        n = Math.floor(n * 0.9);
        lab.textContent = full.slice(0, n) + '\u2026';
      }
      if (n < full.length) {
        var whole = document.createElementNS(fsvg.namespaceURI, 'title');
        whole.textContent = full;
        lab.appendChild(whole);
      }
      var w = lab.getComputedTextLength();
      lab.setAttribute('x', Math.max(FL, Math.min(FW - FR - w, BX(F.chosen.budget_bytes) - w / 2)));
    }

    var cols = ['#', 'budget', 'planned total', 'recompute'];
    if (F.ceiling_flops > 0) cols.push('predicted step');
    cols.push('choice');
    document.getElementById('frontier-head').innerHTML = cols.map(function (c) { return '<th>' + c + '</th>'; }).join('');
    document.getElementById('frontier-rows').innerHTML = rows.map(function (r) {
      var td = [r.n, fmtB(r.p.budget_bytes), fmtB(r.p.total_bytes), share(r.p).toFixed(1) + '%'];
      if (F.ceiling_flops > 0) td.push(fmtS(r.p.predicted_step_seconds));
      td.push(r.p.choice + (r.p.proven_least ? '' : ' (not proven least)'));
      return '<tr class="fit-row' + (r.chosen ? ' sel' : '') + '">' + td.map(function (v, j) {
        return '<td' + (j > 0 && j < td.length - 1 ? ' class="num"' : '') + '>' + esc(v) + '</td>';
      }).join('') + '</tr>';
    }).join('');
    document.body.setAttribute('data-frontier', String(F.points.length));
  }
  if (D.frontier) drawFrontier(D.frontier);
  document.body.setAttribute('data-rendered', String(N));
})();
</script>
</body>
</html>
)HTML";

// The frontier's place on the page (memory_html's `frontier`), filled by drawFrontier.
const char* kFrontierSection = R"HTML(<h2>Fitting a budget: model.remat = auto</h2>
<div class="sub">For budgets from the no-remat plan down to the smallest plan that fits, the choice that
recomputes the least (layers, minibatches, head), its planned total and its recomputed FLOPs as a share of the
step's; the predicted step time is every FLOP at the matmul ceiling. Hover a mark for its choice; the plan below is
the one marked chosen, when there is one.</div>
<svg id="frontier" role="img" aria-label="model.remat = auto: planned total and recompute per budget"></svg>
<table class="bufs" id="frontier-table">
  <thead><tr id="frontier-head"></tr></thead>
  <tbody id="frontier-rows"></tbody>
</table>
)HTML";

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
}

}  // namespace

std::string memory_html(const TrainProgram& prog, const MemoryPlan& plan, const std::string& title,
                        int64_t optimizer_bytes, const FitFrontier* frontier) {
  const Graph& g = prog.model.graph;
  Strings str;
  nlohmann::json live = nlohmann::json::array(), phase = nlohmann::json::array(), op = nlohmann::json::array(),
                 scope = nlohmann::json::array();
  for (size_t s = 0; s < plan.schedule.size(); ++s) {
    const Node& n = g.node(plan.schedule[s]);
    live.push_back(s < plan.live_bytes.size() ? plan.live_bytes[s] : 0);
    phase.push_back(static_cast<int>(n.phase));
    op.push_back(str(op_name(n.op)));
    scope.push_back(str(n.scope));
  }
  nlohmann::json phases = nlohmann::json::array();  // names by Phase value (the page colours them)
  for (size_t p = 0; p < kNumPhases; ++p) phases.push_back(phase_name(static_cast<Phase>(p)));
  nlohmann::json buffers = nlohmann::json::array();
  int64_t max_workspace = 0;
  for (const BufferInfo& b : plan.buffers) {
    if (b.value == kNoValue) {  // a node's kernel workspace, live at its step
      const Node& n = g.node(plan.schedule[b.first]);
      buffers.push_back({str(n.scope), str(op_name(n.op)), "-", "workspace", b.bytes, b.first, b.last, b.offset});
      max_workspace = std::max(max_workspace, b.bytes);
      continue;
    }
    const Value& v = g.value(b.value);
    const Node* prod = v.producer >= 0 ? &g.node(v.producer) : nullptr;
    buffers.push_back({str(prod ? prod->scope : v.name), str(prod ? op_name(prod->op) : "-"), v.shape.str(),
                       dtype_name(v.dtype), b.bytes, b.first, b.last, b.offset});
  }
  nlohmann::json data = {{"title", title},
                         {"phases", phases},
                         {"live", live},
                         {"phase", phase},
                         {"op", op},
                         {"scope", scope},
                         {"buffers", buffers},
                         {"strings", str.list},
                         {"arena_bytes", plan.arena_bytes},
                         {"lower_bound_bytes", plan.lower_bound_bytes},
                         {"peak_step", plan.peak_step},
                         {"param_bytes", plan.param_bytes},
                         {"grad_bytes", plan.grad_bytes},
                         {"input_bytes", plan.input_bytes},
                         {"max_workspace_bytes", max_workspace},
                         {"workspace_threads", plan.workspace_threads},
                         {"optimizer_bytes", optimizer_bytes}};
  if (frontier) {
    data["frontier"] = {{"points", fit_frontier_json(frontier->points, frontier->ceiling_flops)},
                        {"ceiling_flops", frontier->ceiling_flops}};
    if (frontier->chosen)
      data["frontier"]["chosen"] = fit_frontier_json({*frontier->chosen}, frontier->ceiling_flops)[0];
  }
  std::string page = kPage;
  replace_all(page, "__FRONTIER__", frontier ? kFrontierSection : "");
  replace_all(page, "__TITLE__", html_escape(title));
  replace_all(page, "__DATA__", script_json(data));
  return page;
}

void write_memory_html(const Config& c, const std::string& path, const FitFrontier* frontier) {
  const MemoryReport r = memory_report(c, 0);
  const TrainProgram prog = build_train_program(c);
  const MemoryPlan plan = plan_training(c, prog);
  std::ofstream f(path, std::ios::binary);
  if (!f)
    throw UserError("--html " + path, "cannot be opened for writing (a directory, a missing folder or no permission)",
                    "give a file path in a folder you can write, e.g. --html memory.html");
  f << memory_html(prog, plan, r.config_summary, r.optimizer_bytes, frontier);
  if (!f.flush()) fail_write(path, "cannot write it", errno);
}

}  // namespace loom
