"""MXFP4 (OCP microscaling FP4) dequantization: how gpt-oss checkpoints ship their experts.

A block holds 32 weights: 16 bytes of FP4 E2M1 codes (two per byte, the low nibble first)
and one E8M0 scale byte, the power of two ``2^(scale - 127)``. E2M1 codes 0..7 are
0, 0.5, 1, 1.5, 2, 3, 4, 6 and codes 8..15 the same values negated.
"""
import torch

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """blocks [..., G, 16] uint8, scales [..., G] uint8 -> [..., G * 32] float32 (exact)."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise TypeError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} / {scales.dtype}")
    if blocks.shape[-1] != 16 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} must be scales {tuple(scales.shape)} + (16,)")
    lut = torch.tensor(_E2M1, dtype=torch.float32)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], -1).long()  # [..., G, 16, 2]: low nibble first
    values = lut[codes].flatten(-2)  # [..., G, 32]
    values = torch.ldexp(values, scales.to(torch.int32)[..., None] - 127)
    return values.flatten(-2)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., K] (K % 32 == 0) -> (blocks [..., K/32, 16], scales [..., K/32]) uint8.

    Per block: scale = 2^(floor(log2 max|w|) - 2), so the largest magnitude lands in [4, 8)
    and rounds to at most 6; codes are the nearest E2M1 values (ties to the lower magnitude).
    For making MXFP4 test checkpoints; dequantize_mxfp4 is the reader.
    """
    if w.shape[-1] % 32:
        raise ValueError(f"MXFP4 needs the last dimension to be a multiple of 32, got {w.shape[-1]}")
    g = w.float().reshape(*w.shape[:-1], -1, 32)
    amax = g.abs().amax(-1)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(2.0 ** -126))) - 2, torch.zeros_like(amax))
    exp = exp.clamp(-127, 127)
    scaled = g / torch.ldexp(torch.ones_like(exp), exp.to(torch.int32))[..., None]
    mags = torch.tensor(_E2M1[:8])
    idx = (scaled.abs()[..., None] - mags).abs().argmin(-1)  # nearest magnitude, first on ties
    codes = (idx + 8 * (scaled < 0)).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exp + 127).to(torch.uint8)
