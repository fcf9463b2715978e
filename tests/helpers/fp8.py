"""FP8 checkpoints written offline, in DeepSeek-V3's layout: float8_e4m3fn weights, each with an fp32
``weight_scale_inv`` per 128 x 128 block (or, per channel, ``weight_scale`` [n, 1]), and
``quantization_config = {"quant_method": "fp8", "weight_block_size": [128, 128], ...}``.

``w = e4m3(q) * scale``: the scale of a block is max|w| / 448 over the block, so its largest weight
lands on e4m3's largest value.
"""
from __future__ import annotations

import json
import os

import torch

BLOCK = 128
FP8_CONFIG = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [BLOCK, BLOCK]}


def quantize_blocks(w: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """w [n, k] -> (q [n, k] float8_e4m3fn, scale_inv [ceil(n/block), ceil(k/block)] fp32)."""
    n, k = w.shape
    sn, sk = -(-n // block), -(-k // block)
    padded = torch.zeros(sn * block, sk * block)
    padded[:n, :k] = w.float()
    amax = padded.reshape(sn, block, sk, block).abs().amax((1, 3))
    scale = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    full = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:n, :k]
    return (w.float() / full).clamp(-448, 448).to(torch.float8_e4m3fn), scale


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [n, k] -> (q [n, k] float8_e4m3fn, scale [n, 1] fp32): one scale per output row."""
    amax = w.float().abs().amax(1, keepdim=True)
    scale = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    return (w.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale


def dequantize_blocks(q: torch.Tensor, scale: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    n, k = q.shape
    return q.float() * scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:n, :k]


def random_fp8_experts(E: int, H: int, I: int, seed: int = 0):
    """An FP8 checkpoint's experts as tensors: per expert gate / up [I, H], down [H, I] e4m3 with block scales.
    Returns {"gate", "up", "down"}: (q [E, n, k], scale_inv [E, ceil(n/128), ceil(k/128)])."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (n, k) in {"gate": (I, H), "up": (I, H), "down": (H, I)}.items():
        pairs = [quantize_blocks(torch.randn(n, k, generator=g) / k ** 0.5) for _ in range(E)]
        out[name] = (torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs]))
    return out


def _quantized(key: str, t: torch.Tensor) -> bool:
    """The weights an FP8 release quantizes: 2-D linear weights, not embeddings, lm_head or the router."""
    return (t.dim() == 2 and key.endswith(".weight") and "embed" not in key and "lm_head" not in key
            and not key.endswith("mlp.gate.weight") and "norm" not in key)


def fp8_checkpoint(src, dst, *, per_channel: bool = False, experts_only: bool = False) -> str:
    """Writes ``dst``: the safetensors checkpoint ``src`` (one file) with its linear weights in FP8 (only the
    experts' with ``experts_only``) and the config's quantization_config; returns ``dst``."""
    from safetensors.torch import load_file, save_file

    os.makedirs(dst, exist_ok=True)
    tensors = {}
    for key, t in load_file(os.path.join(src, "model.safetensors")).items():
        if _quantized(key, t) and (not experts_only or ".experts." in key):
            q, s = quantize_rows(t) if per_channel else quantize_blocks(t)
            tensors[key], tensors[key + ("_scale" if per_channel else "_scale_inv")] = q, s
        else:
            tensors[key] = t
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = dict(FP8_CONFIG)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    if os.path.exists(os.path.join(src, "generation_config.json")):
        with open(os.path.join(src, "generation_config.json")) as f, \
                open(os.path.join(dst, "generation_config.json"), "w") as g:
            g.write(f.read())
    return os.fspath(dst)
