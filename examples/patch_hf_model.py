"""Replace the experts of a loaded Hugging Face MoE model with KTMoE (offline, tiny random model).

    python examples/patch_hf_model.py [--mmap-experts-dir DIR]

Builds a 2-layer Qwen3-MoE from a config, generates greedily, patches it with
torch_ktmoe.hf.patch_model and generates again: same tokens, dense experts gone. The model is fp32, so
patch_model's defaults switch its attention to decode attention but leave its linears to torch (the
report says why).
"""
import argparse
import os
import sys

import torch
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # from a checkout
from torch_ktmoe import hf  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--mmap-experts-dir", default=None, help="keep packed experts in files here (not on tmpfs)")
args = parser.parse_args()

torch.manual_seed(0)
config = Qwen3MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        num_experts=8, num_experts_per_tok=2, pad_token_id=0)
model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
prompt = torch.tensor([[3, 17, 42, 8, 99]])
before = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False)
param_mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20

report = hf.patch_model(model, weight_format="bf16", mmap_experts_dir=args.mmap_experts_dir)

after = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False)
print(model.model.layers[0].mlp)
print(f"patched layers {report.layers_patched} ({report.replaced_classes}), "
      f"packed {report.packed_bytes / 2**10:.0f} KiB, file-backed {report.file_backed_bytes / 2**10:.0f} KiB, "
      f"dense freed {report.dense_bytes_freed / 2**10:.0f} KiB")
print(f"dense linears packed: {report.linears.replaced if report.linears else 0}, decode attention: "
      f"{report.decode_attention}, defaults not applied: {report.defaults_left or 'none'}")
print(f"parameters: {param_mib:.2f} MiB -> "
      f"{sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20:.2f} MiB")
print("tokens before:", before[0].tolist())
print("tokens after: ", after[0].tolist(), "(same)" if torch.equal(before, after) else "(DIFFERENT)")
