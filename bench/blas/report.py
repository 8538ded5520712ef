#!/usr/bin/env python3
"""Merge the per-run JSON files written by gemm_bench into results.json and print
markdown comparison tables (used for docs/blas.md).

usage: report.py OUT_JSON MACHINE_JSON RUN_JSON...
Runs with the same "config" are merged (e.g. one linked binary per library).
"""
import json
import math
import sys
from collections import defaultdict

LIBS = ["openblas", "blis", "onednn"]
ORDER = ["avx2", "avx512", "avx2_1t", "avx512_1t", "auto"]


def size_class(flop):
    if flop >= 1e9:
        return "size: large (>=1 GFLOP/call)"
    if flop >= 1e8:
        return "size: medium (0.1-1 GFLOP)"
    return "size: small (<0.1 GFLOP)"


def fmt_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def num(v):
    return f"{v:.0f}" if v >= 10 else f"{v:.1f}"


def bold_best(vals, higher=True):
    present = [v for v in vals if v is not None]
    best = (max if higher else min)(present) if present else None
    return ["-" if v is None else (f"**{num(v)}**" if v == best and len(present) > 1 else num(v))
            for v in vals]


def main():
    out_json, machine_json, *paths = sys.argv[1:]
    with open(machine_json) as f:
        machine = json.load(f)
    runs = []
    for p in paths:
        with open(p) as f:
            runs.append(json.load(f))

    # config -> ordered shape keys, key -> shape dict, key -> lib -> result; lib -> info
    cfgs = {}
    for r in runs:
        c = cfgs.setdefault(r["config"], {"keys": [], "shape": {}, "res": defaultdict(dict),
                                           "info": {}, "env": {}, "threads": r["threads"]})
        for lib in r["libraries"]:
            c["info"][lib["name"]] = lib["info"]
            c["env"][lib["name"]] = r["env"]
        for x in r["results"]:
            k = (x["model"], x["layer"], x["op"])
            if k not in c["shape"]:
                c["keys"].append(k)
            elif set(x["libs"]) == set(c["res"][k]) and x["other_load"] >= c["shape"][k]["other_load"]:
                continue  # a re-measurement of the same shape: keep the quieter one
            c["shape"][k] = x
            for lib, v in x["libs"].items():
                c["res"][k][lib] = dict(v, other_load=x.get("other_load", 0.0))

    summary = {}
    md = []
    for cfg in sorted(cfgs, key=lambda c: ORDER.index(c) if c in ORDER else 99):
        c = cfgs[cfg]
        libs = [l for l in LIBS if l in c["info"]]
        res, shape, keys = c["res"], c["shape"], c["keys"]
        md.append(f"\n### config `{cfg}` ({c['threads']} thread{'s' if c['threads'] > 1 else ''})\n")
        md.append("\n".join(f"- {l}: `{c['info'][l]}`" for l in libs))
        md.append(f"- env: `{json.dumps(c['env'][libs[0]])}`")
        busy = [k for k in keys if shape[k].get("other_load", 0) > 0.05]
        md.append(f"- shapes measured while other load > 5%: {len(busy)}"
                  + (f" ({', '.join('/'.join(k) for k in busy)})" if busy else ""))

        rows = []
        for k in keys:
            s = shape[k]
            vals = [res[k][l]["gflops"] if l in res[k] else None for l in libs]
            rows.append([k[0], k[1], k[2], s["M"], s["N"], s["K"]] + bold_best(vals)
                        + [f"{100 * s.get('other_load', 0):.0f}%"])
        shape_md = fmt_table(["model", "layer", "op", "M", "N", "K"] + [f"{l}" for l in libs]
                             + ["other load"], rows)
        cfg_sum = {"libs": {l: c["info"][l] for l in libs}, "per_model": {}, "per_class": {}}
        # models with all 15 GEMMs (5 layers x NN/NT/TN) measured
        models = [m for m in dict.fromkeys(k[0] for k in keys)
                  if m != "square" and sum(1 for k in keys if k[0] == m) == 15]
        sq = [k for k in keys if k[0] == "square"]
        cfg_sum["square_gflops"] = {"/".join(k): {l: res[k][l]["gflops"] for l in libs} for k in sq}
        if not models:
            md += ["\n#### per shape (GFLOP/s, median)\n", shape_md]
            summary[cfg] = cfg_sum
            continue

        # per-model training-step summary (count-weighted time)
        step_rows, rel = [], defaultdict(list)
        for m in models:
            mk = [k for k in keys if k[0] == m]
            flop = sum(shape[k]["count_per_step"] * 2.0 * shape[k]["M"] * shape[k]["N"] * shape[k]["K"]
                       for k in mk)
            t = {l: sum(shape[k]["count_per_step"] * res[k][l]["median_ms"] for k in mk) for l in libs}
            best = min(t.values())
            for l in libs:
                rel[l].append(t[l] / best)
            cfg_sum["per_model"][m] = {
                "gflop_per_step": round(flop / 1e9, 3),
                **{l: {"gemm_ms_per_step": round(t[l], 3), "eff_gflops": round(flop / (t[l] * 1e6), 1),
                       "time_vs_best": round(t[l] / best, 3)} for l in libs}}
            step_rows.append([m, f"{flop / 1e9:.2f}"]
                             + [("**" if t[l] == best else "") + f"{t[l]:.1f} ms ({flop / (t[l] * 1e6):.0f})"
                                + ("**" if t[l] == best else "") for l in libs])
        geo = {l: math.exp(sum(map(math.log, rel[l])) / len(rel[l])) for l in libs}
        cfg_sum["geomean_step_time_vs_best"] = {l: round(geo[l], 3) for l in libs}
        step_rows.append(["geomean step time vs best", ""] + [f"{geo[l]:.2f}x" for l in libs])
        step_md = fmt_table(["model", "GFLOP/step"] + [f"{l} ms/step (GF/s)" for l in libs], step_rows)

        # per shape class, step-weighted (count x time), summed over all four models
        classes = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
        for k in keys:
            if k[0] not in models:
                continue
            s = shape[k]
            f = 2.0 * s["M"] * s["N"] * s["K"]
            n = s["count_per_step"]
            for cls in (f"op {s['op']}", "layer: lm_head" if s["layer"] == "lm_head"
                        else "layer: block (qkv/proj/mlp)", size_class(f)):
                for l in libs:
                    classes[cls][l][0] += n * f
                    classes[cls][l][1] += n * res[k][l]["median_ms"] * 1e-3
        class_rows = []
        for cls in sorted(classes):
            vals = [classes[cls][l][0] / classes[cls][l][1] * 1e-9 for l in libs]
            cfg_sum["per_class"][cls] = {l: round(v, 1) for l, v in zip(libs, vals)}
            class_rows.append([cls] + bold_best(vals))
        class_md = fmt_table(["shape class (GF/s = sum flop / sum time, step-weighted)"] + libs, class_rows)
        summary[cfg] = cfg_sum
        md += ["\n#### GEMM time per training step (ms, effective GFLOP/s)\n", step_md,
               "\n#### per shape class\n", class_md, "\n#### per shape (GFLOP/s, median)\n", shape_md]

    with open(out_json, "w") as f:
        json.dump({"machine": machine, "summary": summary, "runs": runs}, f, indent=1)
    print("\n".join(md))


if __name__ == "__main__":
    main()
