"""Pack once, serve anywhere: hf.save_packed writes a packed model directory, hf.from_pretrained maps it.

    python examples/packed_model_dir.py [--format bf16|int8|int4]

Saves a tiny random Qwen3-MoE checkpoint, loads it with its experts packed
(torch_ktmoe.hf.from_pretrained), writes the packed model directory (config, non-expert
safetensors, packed expert files, ktmoe_packed.json), deletes the source checkpoint and loads
the directory: the experts are mapped, not packed, and the logits are bit-identical.
"""
import argparse
import os
import shutil
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # from a checkout
from torch_ktmoe import hf  # noqa: E402
from torch_ktmoe.ops import WEIGHT_FORMATS  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--format", default="bf16", choices=WEIGHT_FORMATS)
args = parser.parse_args()

torch.manual_seed(0)
config = Qwen3MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=64, moe_intermediate_size=32, head_dim=16,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=8,
                        num_experts_per_tok=2)
prompt = torch.tensor([[3, 17, 42, 8]])
work = tempfile.mkdtemp(prefix="ktmoe_packed_example_", dir="/var/tmp" if os.access("/var/tmp", os.W_OK) else None)
try:
    AutoModelForCausalLM.from_config(config).save_pretrained(os.path.join(work, "checkpoint"))
    model = hf.from_pretrained(os.path.join(work, "checkpoint"), weight_format=args.format, progress=False)
    with torch.no_grad():
        ref = model(prompt).logits
    hf.save_packed(model, os.path.join(work, "packed"))
    shutil.rmtree(os.path.join(work, "checkpoint"))
    print("packed model directory:", sorted(os.listdir(os.path.join(work, "packed"))))
    served = hf.from_pretrained(os.path.join(work, "packed"), progress=False)
    with torch.no_grad():
        out = served(prompt).logits
    print(f"layers mapped: {served.ktmoe_report.num_layers}, bit-identical logits: {torch.equal(out, ref)}")
finally:
    shutil.rmtree(work, ignore_errors=True)
