"""Layer accuracy of every format, next to llama.cpp's q8_0 / q4_0 at the same bytes per weight.

    python -m benchmarks.layer.bench_accuracy [--experts 4 --top-k 2 --hidden 2048 --intermediate 768 --tokens 64]

Error = mean|out - ref| / mean|ref| of a whole MoE layer (gate, up, SiLU, down, weighted sum)
against the fp32 layer on the dense weights (torch_ktmoe.reference.moe_reference). Three
weight distributions, all scaled by 1/sqrt(fan_in): Gaussian (the README's format table and
the tests' bounds), and Student-t with 3 and 6 degrees of freedom (heavy tails: the outliers
real checkpoints have).

Ours runs the real kernels (KTMoE). The llama.cpp rows are *emulated* in torch from ggml's
definitions (ggml-quants.c, quantize_row_q8_0 / quantize_row_q4_0 reference): per block of
32, q8_0 stores d = amax / 127 and round(w / d); q4_0 stores d = -v / 8 (v the signed
largest-magnitude weight) and clamp(floor(w / d + 8.5), 0, 15) - 8; d in fp16. Their
activations are q8_0 too (per block of 32), as llama.cpp's CPU mul_mat quantizes them
(ours: int8 with a scale per token for int4 and per-channel int8, per (token, group) for int8
with groups, the weights' groups).
Bits per weight: bf16 16, int8 (its default group_size 32: an fp32 scale per row and group) 9,
int8 g64 8.5, int8 per channel (group_size=0) 8 (+ a float per row), q8_0 8.5, int4 4.5, q4_0 4.5.
"""
import argparse
import os

import torch

from benchmarks.cli import add_shape_arguments
from ktmoe_harness.moe_inputs import random_routing
from torch_ktmoe import KTMoE, reference
from torch_ktmoe.ops import WEIGHT_FORMATS


INT8_VARIANTS = (("int8 g64", 64), ("int8 per channel", 0))  # next to int8's default group of 32


def draw(dist, shape, gen):
    if dist == "gauss":
        w = torch.randn(shape, generator=gen)
    else:  # Student-t(nu) = N / sqrt(chi2(nu) / nu), from the same generator
        nu = int(dist[1:])
        chi2 = torch.randn((nu, *shape), generator=gen).pow(2).sum(0)
        w = torch.randn(shape, generator=gen) / (chi2 / nu).sqrt()
    return w / shape[-1] ** 0.5


def ggml_blocks(w, dequant):
    """Applies a per-block-of-32 quantize + dequantize along the last dimension (padded with 0)."""
    k = w.shape[-1]
    g = torch.nn.functional.pad(w, (0, (-k) % 32)).reshape(*w.shape[:-1], -1, 32)
    return dequant(g).reshape(*w.shape[:-1], -1)[..., :k]


def q8_0(g):
    d = (g.abs().amax(-1, keepdim=True) / 127).half().float()
    return torch.where(d > 0, g / torch.where(d > 0, d, 1), 0).round() * d


def q4_0(g):
    v = g.gather(-1, g.abs().argmax(-1, keepdim=True))
    d = (v / -8).half().float()
    q = torch.where(d != 0, g / torch.where(d != 0, d, 1), 0).add(8.5).floor().clamp(0, 15)
    return (q - 8) * d


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_arguments(ap, experts=4, top_k=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    E, k, H, I, T = args.experts, args.top_k, args.hidden, args.intermediate, args.tokens
    print(f"torch {torch.__version__}; E={E} top-{k} H={H} I={I}, {T} tokens; {os.cpu_count()} CPUs")
    dists = ("gauss", "t3", "t6")
    ours = [(fmt, fmt, None) for fmt in WEIGHT_FORMATS] + [(name, "int8", g) for name, g in INT8_VARIANTS]
    rows = {name: {} for name in (*(n for n, _, _ in ours), "llama.cpp q8_0 (emulated)", "llama.cpp q4_0 (emulated)")}
    for dist in dists:
        gen = torch.Generator().manual_seed(args.seed)
        gate_up, down = draw(dist, (E, 2 * I, H), gen), draw(dist, (E, H, I), gen)
        x = torch.randn(T, H, generator=gen)
        ids, w = random_routing(T, E, k, generator=gen)
        ref = reference.moe_reference(x, ids, w, gate_up, down)
        for name, fmt, group in ours:
            layer = KTMoE(E, k, H, I, weight_format=fmt, group_size=group)
            layer.load_weights(gate_up, down)
            rows[name][dist] = reference.relative_error(layer(x, ids, w), ref)
        for name, fn in (("llama.cpp q8_0 (emulated)", q8_0), ("llama.cpp q4_0 (emulated)", q4_0)):
            out = reference.moe_reference(x, ids, w, ggml_blocks(gate_up, fn), ggml_blocks(down, fn),
                                          lambda a: ggml_blocks(a, q8_0))
            rows[name][dist] = reference.relative_error(out, ref)
    print("\n| format | " + " | ".join({"gauss": "Gaussian", "t3": "Student-t(3)", "t6": "Student-t(6)"}[d]
                                         for d in dists) + " |")
    print("| --- |" + " --- |" * len(dists))
    for name, errs in rows.items():
        print(f"| {name} | " + " | ".join(f"{errs[d]:.4f}" for d in dists) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
