"""MXFP4 (OCP microscaling FP4) dequantization: how gpt-oss checkpoints ship their experts.

A block holds 32 weights: 16 bytes of FP4 E2M1 codes (two per byte, the low nibble first)
and one E8M0 scale byte, the power of two ``2^(scale - 127)``. E2M1 codes 0..7 are
0, 0.5, 1, 1.5, 2, 3, 4, 6 and codes 8..15 the same values negated. The scale byte 0xFF is E8M0's NaN: every
reader of E8M0 bytes (this module's, :mod:`.fp4`, :mod:`.fp8`'s ue8m0 scales) refuses it through :func:`e8m0_bytes`.

:class:`Mxfp4Experts` reads a gpt-oss checkpoint's experts, dequantized one expert at a time, or (its
``mxfp4_experts``) as codes and scale bytes for ``weight_format="mxfp4"``, which keeps them exactly.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Optional

import torch

from .fused_layout import CONCATENATED, FusedLayout

E8M0_DTYPES = ("F8_E8M0", "U8")  # safetensors' names of E8M0 scale bytes (float8_e8m0fnu, or raw uint8)
E8M0_NAN = 0xFF
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def split_nibbles(blocks: torch.Tensor) -> torch.Tensor:
    """blocks [..., G, 16] uint8 -> the e2m1 codes [..., G * 32], one per byte (the low nibble first), as
    :func:`torch_ktmoe.ops.pack_experts` takes an MXFP4 checkpoint's codes."""
    return torch.stack([blocks & 0x0F, blocks >> 4], -1).flatten(-3)


def e8m0_bytes(scale: torch.Tensor, key: str) -> torch.Tensor:
    """A checkpoint's E8M0 scales as their exponent bytes e (uint8, the value 2^(e - 127)): float8_e8m0fnu or uint8
    as they are, a float tensor of powers of two exactly; ValueError naming ``key`` for the NaN code 0xFF or a float
    that is no power of two in [2^-127, 2^127]."""
    if scale.dtype in (torch.float8_e8m0fnu, torch.uint8):
        e = scale.view(torch.uint8)
    else:
        mantissa, exponent = torch.frexp(scale.float())  # scale = mantissa * 2^exponent, mantissa in [0.5, 1)
        bad = (mantissa != 0.5) | (exponent < -126) | (exponent > 128)
        if bad.any():
            raise ValueError(f"{key}: scale {scale[bad][0].item()} at {bad.nonzero()[0].tolist()} is not a power of "
                             "two in [2^-127, 2^127]; an E8M0 (ue8m0) scale must be one")
        e = (exponent + 126).to(torch.uint8)
    nan = e == E8M0_NAN
    if nan.any():
        raise ValueError(f"{key}: E8M0 scale byte 0xFF (NaN) at {nan.nonzero()[0].tolist()}; every weight of its "
                         "group would be NaN")
    return e


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, name: str = "MXFP4 scales") -> torch.Tensor:
    """blocks [..., G, 16] uint8, scales [..., G] uint8 -> [..., G * 32] float32 (exact); the scales go through
    :func:`e8m0_bytes` (ValueError naming ``name`` for the NaN byte 0xFF)."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise TypeError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} / {scales.dtype}")
    if blocks.shape[-1] != 16 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} must be scales {tuple(scales.shape)} + (16,)")
    scales = e8m0_bytes(scales, name)
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


class Mxfp4Experts:
    """gpt-oss MXFP4 experts: ``<prefix>.gate_up_proj_blocks`` [E, 2I, H/32, 16] with ``_scales`` [E, 2I, H/32],
    and the same for ``down_proj`` ([E, H, I/32, 16]). Rows are output features (never transposed);
    gate and up alternate as ``layout.interleaved`` says. Yields fp32 ``(gate_up [2I, H], down [H, I])``."""

    @staticmethod
    def probe_keys(prefix: str) -> list[str]:
        return [f"{prefix}.gate_up_proj_blocks"]

    @classmethod
    def find(cls, ckpt, prefix: str, hidden_size: int, intermediate_size: int, num_experts: Optional[int] = None,
             layout: FusedLayout = CONCATENATED) -> Optional["Mxfp4Experts"]:
        if f"{prefix}.gate_up_proj_blocks" not in ckpt:
            return None
        return cls(ckpt, prefix, hidden_size, intermediate_size, num_experts, layout)

    def __init__(self, ckpt, prefix: str, hidden_size: int, intermediate_size: int, num_experts: Optional[int],
                 layout: FusedLayout):
        H, I = hidden_size, intermediate_size
        E = ckpt.shape(f"{prefix}.gate_up_proj_blocks")[0] if num_experts is None else num_experts
        for name, shape in {"gate_up_proj": (E, 2 * I, H // 32, 16), "down_proj": (E, H, I // 32, 16)}.items():
            ckpt.expect_shape(f"{prefix}.{name}_blocks", shape)
            ckpt.expect_shape(f"{prefix}.{name}_scales", shape[:3])
        self.ckpt, self.prefix = ckpt, prefix
        self.rows = FusedLayout(transposed=False, interleaved=layout.interleaved)  # stored output-major

    def _scales(self, name: str, e: int) -> torch.Tensor:
        """Expert ``e``'s E8M0 scale bytes of ``name`` (ValueError naming the tensor for the NaN byte 0xFF)."""
        key = f"{self.prefix}.{name}_scales"
        return e8m0_bytes(self.ckpt.get_row(key, e), key)

    def _dequantized_row(self, name: str, e: int) -> torch.Tensor:
        return dequantize_mxfp4(self.ckpt.get_row(f"{self.prefix}.{name}_blocks", e), self._scales(name, e))

    def mxfp4_experts(self, ids: Iterable[int], group: int = 32) -> Iterator[tuple[torch.Tensor, ...]]:
        """Per id, the e2m1 codes ``(gate_up [2I, H], down [H, I])`` (uint8, one per byte) and their E8M0
        scale bytes ``(gate_up_scale [2I, H/32], down_scale [H, I/32])``, exactly; ``group`` must be 32."""
        if group != 32:
            raise ValueError(f"MXFP4 checkpoints have one scale per 32 inputs, not per {group}")
        ids = list(ids)
        self.ckpt.expect_rows(f"{self.prefix}.gate_up_proj_blocks", ids)
        for e in ids:
            gate_up, down = (self.ckpt.get_row(f"{self.prefix}.{name}_blocks", e) for name in ("gate_up_proj", "down_proj"))
            gate_up_scale, down_scale = (self._scales(name, e) for name in ("gate_up_proj", "down_proj"))
            gate, up = self.rows.split_gate_up(split_nibbles(gate_up))
            gate_scale, up_scale = self.rows.split_gate_up(gate_up_scale)
            yield torch.cat([gate, up]), split_nibbles(down), torch.cat([gate_scale, up_scale]), down_scale

    def experts(self, ids: Iterable[int]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        ids = list(ids)
        self.ckpt.expect_rows(f"{self.prefix}.gate_up_proj_blocks", ids)
        for e in ids:
            gate, up = self.rows.split_gate_up(self._dequantized_row("gate_up_proj", e))  # [2I, H]
            yield torch.cat([gate, up]), self._dequantized_row("down_proj", e)
