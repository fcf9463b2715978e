"""KTMoE inside a hand-written MoE block: your router, torch_ktmoe's experts.

Run: python examples/ktmoe_in_a_block.py [--mmap-experts-dir DIR]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import torch_ktmoe  # noqa: E402


class MoEBlock(nn.Module):
    def __init__(self, hidden, inter, experts, top_k, mmap_experts_dir=None):
        super().__init__()
        self.router = nn.Linear(hidden, experts, bias=False)
        self.top_k = top_k
        self.experts = torch_ktmoe.KTMoE(experts, top_k, hidden, inter, weight_format="int8",
                                         mmap_experts_dir=mmap_experts_dir)

    def forward(self, x):                                   # [B, S, H]
        logits = self.router(x.reshape(-1, x.shape[-1]))    # [T, E]
        weights, ids = torch.topk(logits.softmax(-1), self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        return x + self.experts(x, ids, weights)            # [B, S, H]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mmap-experts-dir", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    hidden, inter, experts, top_k = 256, 128, 16, 4
    block = MoEBlock(hidden, inter, experts, top_k, args.mmap_experts_dir)
    gate_up = torch.randn(experts, 2 * inter, hidden) / hidden ** 0.5
    down = torch.randn(experts, hidden, inter) / inter ** 0.5
    block.experts.load_weights(gate_up, down)               # packed; the dense tensors can go
    del gate_up, down
    x = torch.randn(2, 8, hidden)
    compiled = torch.compile(block, fullgraph=True)
    torch.testing.assert_close(compiled(x), block(x))
    print(block)
    print("output", tuple(block(x).shape), "memory:", {k: v for k, v in torch_ktmoe.memory_report().items()
                                                       if k.startswith("arena_") and k != "arena_fallback_reasons"})


if __name__ == "__main__":
    main()
