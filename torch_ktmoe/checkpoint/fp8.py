"""FP8 (e4m3) expert checkpoints: DeepSeek-V3 / R1, Qwen3-*-FP8, GLM-4.5-FP8 and per-channel FP8.

Per expert, ``<prefix>.<e>.{gate,up,down}_proj.weight`` (float8_e4m3fn, [n, k]) with its scale,
``weight_scale_inv`` (the name DeepSeek-V3 gives it), ``weight_scale`` or ``scale`` (DeepSeek-V4's original
names), in fp32 / bf16 / fp16 or as UE8M0 powers of two (``scale_fmt="ue8m0"``, DeepSeek-V3.2 / V4:
float8_e8m0fnu, read exactly as 2^(e - 127); the NaN code 0xFF is refused):

* block scales [ceil(n/128), ceil(k/128)] (``quantization_config.weight_block_size = [128, 128]``),
* or one scale per output row, [n] or [n, 1] (sglang's ``--kt-method FP8_PERCHANNEL``);

``w[r, c] = e4m3(q[r, c]) * scale`` of the block (or row) holding (r, c).

:class:`Fp8Experts` reads them one expert at a time, either exactly (:meth:`~Fp8Experts.fp8_experts`:
the e4m3 tensors and the scales per (row, k-group) that ``torch_ktmoe.ops.pack_experts(..., "fp8",
gate_up_scale=..., down_scale=...)`` packs into the ``fp8`` format as they are) or dequantized to fp32
(:meth:`~Fp8Experts.experts`, for the other formats). No dequantized copy of a layer is ever made in the exact
path.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Optional

import torch

from ..unpack import e8m0_values
from .dense import per_expert_probe_keys, per_expert_suffixes
from .fused_layout import CONCATENATED, FusedLayout
from .mxfp4 import e8m0_bytes

BLOCK = 128  # DeepSeek-V3's weight_block_size, the only block size its scales' shape identifies
SCALE_SUFFIXES = ("weight_scale_inv", "weight_scale")
WEIGHT_SCALE_SUFFIXES = SCALE_SUFFIXES + ("scale",)  # what a weight's scale may be called: DeepSeek-V4's ``w1.scale``
SCALE_DTYPES = ("F32", "BF16", "F16", "F8_E8M0")  # float scales, or UE8M0 powers of two
FP8_DTYPE = "F8_E4M3"  # safetensors' name of float8_e4m3fn


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def scale_block(scale_shape, n: int, k: int, key: str) -> Optional[int]:
    """The block of a checkpoint scale of weights [n, k]: 128 for [ceil(n/128), ceil(k/128)], None for
    one scale per row ([n] or [n, 1]); ValueError naming ``key`` for any other shape."""
    shape = list(scale_shape)
    if shape == [_cdiv(n, BLOCK), _cdiv(k, BLOCK)]:
        return BLOCK
    if shape in ([n], [n, 1]):
        return None
    raise ValueError(f"{key}: scale shape {shape} fits neither {BLOCK}x{BLOCK} blocks of its [{n}, {k}] weight "
                     f"({[_cdiv(n, BLOCK), _cdiv(k, BLOCK)]}) nor one scale per row ([{n}] or [{n}, 1])")


def group_scales(scale: torch.Tensor, n: int, k: int, group: int, block: Optional[int] = BLOCK) -> torch.Tensor:
    """A checkpoint scale of weights [n, k] -> fp32 [n, ceil(k/group)]: the scale of each (row, k-group),
    what the ``fp8`` format stores. ``block`` 128: ``scale`` is [ceil(n/128), ceil(k/128)] and every
    group must lie in one block (group divides 128); None: one scale per row, [n] or [n, 1]."""
    if block is None:
        return scale.float().reshape(n, 1).expand(n, _cdiv(k, group)).contiguous()
    if block % group:
        raise ValueError(f"fp8 group_size {group} does not divide the checkpoint's {block}-input scale blocks")
    rows = torch.arange(n) // block
    cols = torch.arange(_cdiv(k, group)) * group // block
    return scale.float()[rows][:, cols].contiguous()


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    """e4m3 q [n, k] with scales per (row, k-group) [n, ceil(k/group)] -> fp32 [n, k] (exact products)."""
    return q.float() * scale.repeat_interleave(group, -1)[:, : q.shape[-1]]


def weight_scale_key(ckpt, key: str, what: str, dtypes=SCALE_DTYPES) -> str:
    """The scale tensor of the quantized weight ``key`` (``what``: its encoding, for the errors), the first of
    :data:`WEIGHT_SCALE_SUFFIXES` beside it; ValueError naming the tensor when there is none or its dtype is
    not in ``dtypes``."""
    base = key[: -len("weight")]
    scale_key = next((base + s for s in WEIGHT_SCALE_SUFFIXES if base + s in ckpt), None)
    if scale_key is None:
        raise ValueError(f"{key}: {what} weight without its scale (looked for "
                         f"{[base + s for s in WEIGHT_SCALE_SUFFIXES]}) in {ckpt.path}; without it the "
                         "weights would be off by the scale's factor")
    if ckpt.dtype(scale_key) not in dtypes:
        raise ValueError(f"{scale_key}: dtype {ckpt.dtype(scale_key)}, expected a float scale or UE8M0 "
                         f"powers of two ({', '.join(dtypes)})")
    return scale_key


def fp8_scale_key(ckpt, key: str, mixed: str = "") -> str:
    """The scale tensor of the FP8 weight ``key``, after checking both: ValueError naming the tensor unless
    ``key`` is e4m3 (``mixed``: why another dtype is wrong here, e.g. the rest of its block is FP8) and its
    scale (:func:`weight_scale_key`) exists with a float or E8M0 dtype."""
    dtype = ckpt.dtype(key)
    if dtype != FP8_DTYPE:
        raise ValueError(f"{key}: dtype {dtype} in {ckpt.path}, "
                         f"{mixed or f'expected FP8 as e4m3 ({FP8_DTYPE}) with its scale, the only FP8 read'}")
    return weight_scale_key(ckpt, key, f"FP8 ({FP8_DTYPE})")


def read_fp8_scales(ckpt, scale_key: str, n: int, k: int, group: int) -> torch.Tensor:
    """The checked scale ``scale_key`` of an FP8 weight [n, k] as fp32 scales per (row, k-group),
    [n, ceil(k/group)]; ValueError naming it for a shape that fits no block or a non-finite value (a UE8M0
    scale: its NaN code 0xFF)."""
    block = scale_block(ckpt.shape(scale_key), n, k, scale_key)
    scale = ckpt.get(scale_key)
    if scale.dtype == torch.float8_e8m0fnu:
        scale = e8m0_values(e8m0_bytes(scale, scale_key))  # 2^(e - 127), exactly
    bad = scale[~torch.isfinite(scale)]
    if bad.numel():
        raise ValueError(f"{scale_key}: non-finite scale ({bad[0].item()}) in {ckpt.path}; every weight of its "
                         "block would be NaN or infinite")
    return group_scales(scale, n, k, group, block)


class Fp8Experts:
    """Per-expert e4m3 weights with their scales (see the module docstring), under the suffixes of
    :data:`~torch_ktmoe.checkpoint.dense.PER_EXPERT_LAYOUTS`. Every expert's tensors are checked
    (dtype, scale present, scale shape) before it is read."""

    @staticmethod
    def probe_keys(prefix: str) -> list[str]:
        return per_expert_probe_keys(prefix, SCALE_SUFFIXES[0])

    @classmethod
    def find(cls, ckpt, prefix: str, hidden_size: int, intermediate_size: int, num_experts: Optional[int] = None,
             layout: FusedLayout = CONCATENATED) -> Optional["Fp8Experts"]:
        suffixes = per_expert_suffixes(ckpt, prefix, (FP8_DTYPE,))
        return None if suffixes is None else cls(ckpt, prefix, suffixes, hidden_size, intermediate_size)

    def __init__(self, ckpt, prefix: str, suffixes: tuple[str, str, str], hidden_size: int, intermediate_size: int):
        H, I = hidden_size, intermediate_size
        self.ckpt, self.prefix, self.suffixes = ckpt, prefix, suffixes
        self.shapes = ((I, H), (I, H), (H, I))
        self.blocks = [self._block(f"{prefix}.0.{s}", shape) for s, shape in zip(suffixes, self.shapes)]

    def _scale_key(self, key: str, shape) -> str:
        """``key``'s scale tensor, after checking the weight (present, shape, e4m3) and the scale's dtype."""
        if key not in self.ckpt:
            raise KeyError(f"{key} is missing in {self.ckpt.path}")
        self.ckpt.expect_shape(key, shape)
        return fp8_scale_key(self.ckpt, key, f"but the other experts of this block are FP8 ({FP8_DTYPE}); a block "
                                             "must be one format")

    def _block(self, key: str, shape) -> Optional[int]:
        scale_key = self._scale_key(key, shape)
        return scale_block(self.ckpt.shape(scale_key), *shape, scale_key)

    def _read(self, e: int, group: int):
        """Expert e: [(q [n, k] e4m3, scale [n, ceil(k/group)] fp32)] for gate, up, down."""
        out = []
        for s, shape in zip(self.suffixes, self.shapes):
            key = f"{self.prefix}.{e}.{s}"
            scale_key = self._scale_key(key, shape)
            out.append((self.ckpt.get(key), read_fp8_scales(self.ckpt, scale_key, *shape, group)))
        return out

    def fp8_experts(self, ids: Iterable[int], group: int = BLOCK) -> Iterator[tuple[torch.Tensor, ...]]:
        """Per id, ``(gate_up [2I, H], down [H, I])`` in float8_e4m3fn and their scales per (row, k-group of
        ``group`` inputs), ``(gate_up_scale [2I, ceil(H/group)], down_scale [H, ceil(I/group)])``: exact."""
        for e in ids:
            (gq, gs), (uq, us), (dq, ds) = self._read(e, group)
            yield torch.cat([gq, uq]), dq, torch.cat([gs, us]), ds

    def experts(self, ids: Iterable[int]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Per id, ``(gate_up [2I, H], down [H, I])`` dequantized to fp32, one expert at a time."""
        for gate_up, down, gate_up_scale, down_scale in self.fp8_experts(ids, 32):
            yield dequantize_fp8(gate_up, gate_up_scale, 32), dequantize_fp8(down, down_scale, 32)
