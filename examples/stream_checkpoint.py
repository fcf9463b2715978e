"""Load an MoE checkpoint with its experts streamed from safetensors into KTMoE (offline, tiny random model).

    python examples/stream_checkpoint.py [--mmap-experts-dir DIR]

Saves a tiny Mixtral (per-expert keys ...block_sparse_moe.experts.E.w1/w2/w3.weight) to a
temporary directory in two shards, then torch_ktmoe.hf.from_pretrained builds the model on
the meta device, lets transformers load the non-expert weights and streams each layer's
experts, one expert at a time, into KTMoE.load_expert (which holds at most one layer's
dense experts) -- the dense experts of the whole model are never in memory. The result
is bit-identical to loading densely and calling patch_model. (In bf16 a tiny random
model's greedy tokens may part from transformers' own dense kernels: different
summation order; tests/test_hf.py compares against them in fp32.)
"""
import argparse
import os
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM, MixtralConfig

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # from a checkout
from torch_ktmoe import hf  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--mmap-experts-dir", default=None, help="keep packed experts in files here (not on tmpfs)")
args = parser.parse_args()

torch.manual_seed(0)
config = MixtralConfig(vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                       num_experts_per_tok=2, pad_token_id=0)
prompt = torch.tensor([[3, 17, 42, 8, 99]])


def greedy(model):
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False)


with tempfile.TemporaryDirectory() as ckpt:
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(ckpt, max_shard_size="100KB")
    print("checkpoint:", sorted(os.listdir(ckpt)))

    model = hf.from_pretrained(ckpt, dtype=torch.bfloat16, weight_format="bf16",
                               mmap_experts_dir=args.mmap_experts_dir)
    report = model.ktmoe_report
    print(f"streamed layers {report.layers_patched}: packed {report.packed_bytes / 2**10:.0f} KiB, "
          f"file-backed {report.file_backed_bytes / 2**10:.0f} KiB")
    streamed = greedy(model)

    # the same thing the memory-hungry way: load everything densely, then patch
    dense = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16)
    reference = greedy(dense)
    hf.patch_model(dense)
    patched = greedy(dense)
    print("dense (transformers):", reference[0].tolist())
    print("patch_model:         ", patched[0].tolist())
    print("streamed:            ", streamed[0].tolist(), "(= patch_model)" if torch.equal(streamed, patched) else "(!)")
