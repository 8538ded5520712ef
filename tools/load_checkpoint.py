#!/usr/bin/env python3
"""Loads a loom checkpoint's parameters into Python with the `safetensors` package, unchanged.

    bash tools/make_goldens.sh            # once: creates .venv-golden with safetensors and numpy
    .venv-golden/bin/python tools/load_checkpoint.py runs/shakespeare_char

Prints every parameter (name, dtype, shape) and checks, independently of the safetensors package,
that each tensor's bytes are exactly the bytes the file stores for it (a plain-Python parse of the
header), so what Python sees is what loom wrote."""
import json
import pathlib
import struct
import sys

import numpy as np
from safetensors.numpy import load_file


def checkpoint_dir(path: pathlib.Path) -> pathlib.Path:
    if (path / "state.json").exists():
        return path
    ckpts = sorted(p for p in path.glob("ckpt_*") if p.is_dir())
    if not ckpts:
        sys.exit(f"{path}: no checkpoint (no state.json, no ckpt_<step>/)")
    return ckpts[-1]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    ck = checkpoint_dir(pathlib.Path(sys.argv[1]))
    model = ck / "model.safetensors"
    tensors = load_file(str(model))
    raw = model.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    state = json.loads((ck / "state.json").read_text())
    params = {k: v for k, v in tensors.items() if not k.startswith("opt/")}
    total = 0
    for name, arr in params.items():
        begin, end = header[name]["data_offsets"]
        assert arr.tobytes() == data[begin:end], f"{name}: bytes differ from the file"
        assert list(arr.shape) == header[name]["shape"], name
        total += arr.size
        print(f"{name:48s} {str(arr.dtype):8s} {list(arr.shape)}")
    moments = len(tensors) - len(params)
    print(f"\n{len(params)} parameter tensors, {total:,} parameters (float32), {moments} optimizer tensors; "
          f"step {state['step']} of {ck}")
    print("all tensors load unchanged:", all(isinstance(v, np.ndarray) for v in tensors.values()))


if __name__ == "__main__":
    main()
