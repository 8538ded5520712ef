"""The machine a benchmark ran on, for every bench/ script's JSON and header line (issue 28 point 1):
loom's kernels and oneDNN choose their code at run time by the CPU's ISA extensions, so a figure
means little without them. Standard library only.

    from host import describe, summary
    h = describe()      # {"cpu", "family", "model", "isa", "cores", "node", "kernel", "load_start"}
    print(summary(h))
"""
import os
import platform

# The extensions that decide which kernels run: AVX2/FMA (the portable paths), AVX-512 (loom's wide
# kernels), VNNI, AVX512-BF16 (native bf16 dot products, AMD Zen 4/5) and AMX (Intel's tile units).
ISA = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def describe():
    fields = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if not line.strip():  # the first processor's block is enough
                break
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    return {"cpu": fields.get("model name", "?"), "family": fields.get("cpu family"), "model": fields.get("model"),
            "isa": [f for f in ISA if f in flags], "cores": os.cpu_count(), "node": platform.node(),
            "kernel": platform.release(), "load_start": [round(x, 2) for x in os.getloadavg()]}


def summary(h):
    return (f"{h['cpu']} (family {h['family']} model {h['model']}), {h['cores']} cores, "
            f"{' '.join(h['isa']) or 'no AVX2'}; load {h['load_start'][0]:.2f}")
