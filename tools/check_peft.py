"""PEFT LoRA adapters against loom's (src/io/peft.h, src/nn/lora.h), in the venv of
tools/make_hf_fixtures.sh (torch, transformers, peft):

  .venv-hf/bin/python tools/check_peft.py --make-fixtures
      writes tests/golden/hf/peft_<model>/ for the gpt2 and llama_untied fixtures: PEFT's own
      adapter directory (adapter_config.json, adapter_model.safetensors; rank 4, alpha 8, every
      linear layer, lora_A and lora_B drawn at random so the adapters change every logit) and
      expected.safetensors with PeftModel's float32 logits on the fixture's ids ("inputs",
      "logits"). tests/hf/test_peft.cpp loads the base and the adapter into loom and compares its
      logits (within 1e-5 of their range), and checks that loom's export of the adapter it loaded
      is PEFT's file, name for name and bit for bit.

  .venv-hf/bin/python tools/check_peft.py --check DIR --base BASE [--expected EXPECTED]
      loads DIR (written by `loom export peft RUN DIR`) onto the Hugging Face model BASE with
      PeftModel.from_pretrained, requiring that every adapter tensor of the file is used and none
      is missing, and prints the logits' range on the fixed ids of EXPECTED (a fixture's
      expected.safetensors) next to the base model's.
Exits 1 when a check fails. Deterministic: --make-fixtures twice gives the same files.
"""

import argparse
import json
import os
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
GOLDEN = os.path.join(ROOT, "tests", "golden", "hf")
TARGETS = {
    "gpt2": ["c_attn", "c_proj", "c_fc"],
    "llama_untied": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


def base_model(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def make_fixture(name, seed):
    base_dir = os.path.join(GOLDEN, name)
    out = os.path.join(GOLDEN, "peft_" + name)
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS[name], bias="none",
                     fan_in_fan_out=name == "gpt2", task_type="CAUSAL_LM")
    model = get_peft_model(base_model(base_dir), cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in sorted(model.named_parameters()):
            if "lora_A" in pname or "lora_B" in pname:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    model.save_pretrained(out)
    os.remove(os.path.join(out, "README.md"))  # PEFT's model card template: nothing loom reads
    # The saved config names the base by the path it was loaded from: loom's tests name their own.
    with open(os.path.join(out, "adapter_config.json")) as f:
        conf = json.load(f)
    conf["base_model_name_or_path"] = "../" + name
    conf["target_modules"] = sorted(conf["target_modules"])  # PEFT saves a set, in no fixed order
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(conf, f, indent=2, sort_keys=True)
        f.write("\n")
    inputs = load_file(os.path.join(base_dir, "expected.safetensors"))["inputs"]
    with torch.no_grad():
        logits = model.eval()(input_ids=inputs.long()).logits.float()
    save_file({"inputs": inputs.contiguous(), "logits": logits.contiguous()}, os.path.join(out, "expected.safetensors"))
    base_logits = load_file(os.path.join(base_dir, "expected.safetensors"))["logits"]
    print(f"wrote {out}: {len(TARGETS[name])} target modules, logits {tuple(logits.shape)}, "
          f"range {logits.abs().max().item():.4f}, the adapter moves them by up to "
          f"{(logits - base_logits).abs().max().item():.4f}")


def check(a):
    base = base_model(a.base)
    model = PeftModel.from_pretrained(base, a.dir).eval()
    stored = load_file(os.path.join(a.dir, "adapter_model.safetensors"))
    used = {k.replace(".default", "") for k, _ in model.named_parameters() if "lora_" in k}
    ok = True
    if set(stored) != used:
        print(f"FAIL: tensors in the file but not used: {sorted(set(stored) - used)[:4]}, "
              f"used but not in the file: {sorted(used - set(stored))[:4]}")
        ok = False
    else:
        print(f"loaded {len(stored)} adapter tensors onto {type(base).__name__} from {a.dir}")
    if a.expected:
        inputs = load_file(a.expected)["inputs"]
        with torch.no_grad():
            logits = model(input_ids=inputs.long()).logits.float()
            with model.disable_adapter():  # PeftModel injected the adapters into `base` itself
                base_logits = model(input_ids=inputs.long()).logits.float()
        print(f"PEFT logits on {tuple(inputs.shape)} ids: range {logits.abs().max().item():.6f}, "
              f"the adapter moves them by up to {(logits - base_logits).abs().max().item():.6f}")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--make-fixtures", action="store_true")
    ap.add_argument("--check", dest="dir")
    ap.add_argument("--base")
    ap.add_argument("--expected")
    a = ap.parse_args()
    if a.make_fixtures:
        for seed, name in enumerate(TARGETS):
            make_fixture(name, seed + 1)
        return 0
    if not a.dir or not a.base:
        ap.error("give --make-fixtures, or --check DIR --base BASE")
    return 0 if check(a) else 1


if __name__ == "__main__":
    sys.exit(main())
