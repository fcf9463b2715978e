"""compressed-tensors ``pack-quantized`` int4 weights (``quantization_config.quant_method == "compressed-tensors"``,
``format: "pack-quantized"``; Kimi-K2-Thinking, llm-compressor W4A16 releases; sglang ``--kt-method RAWINT4``).

Per linear module ``M`` (the package's ``PackedQuantizationCompressor``):

* ``M.weight_packed`` int32 [n, ceil(k/8)]: 8 codes per int32 along the inputs, element ``8 j + i`` in bits
  4i..4i+3 (little-endian nibbles), each the signed value + 8, so a code q is in [0, 15];
* ``M.weight_scale`` float [n, ceil(k/group)] (bf16 in the releases; strategy ``group``, or [n, 1] for
  ``channel``);
* ``M.weight_shape`` int [2], the logical [n, k];
* ``M.weight_zero_point`` int32 [ceil(n/8), G] for asymmetric schemes, packed the same way along the rows
  (absent: symmetric, zero point 8);
* ``M.weight_g_idx`` int [k] for act-order (``actorder: "group"``).

``w = scale * (q - zero)``: :func:`read_pack_quantized` returns it as an :class:`~.int4_linear.Int4Linear`.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .int4_linear import (Int4Experts, Int4Linear, cdiv, expect_int32, expect_scale_dtype, group_of, read_g_idx,
                          unpack_int32_nibbles)

ENCODING = "compressed-tensors pack-quantized int4"


def _logical_shape(ckpt, shape_key: str) -> list[int]:
    """``weight_shape``'s two values; its shape is checked in the header first, so a huge tensor is never read
    (nor printed)."""
    shape = ckpt.shape(shape_key)
    if math.prod(shape) != 2:
        raise ValueError(f"{shape_key}: shape {shape} in {ckpt.path}, expected [2] (the weight's logical [n, k])")
    return [int(v) for v in ckpt.get(shape_key).reshape(-1).tolist()]


def read_pack_quantized(ckpt, module: str, n: int, k: int) -> Int4Linear:
    """``module``'s ``weight_packed`` / ``weight_scale`` / ``weight_shape`` (/ ``weight_zero_point`` /
    ``weight_g_idx``) as codes, scales and zeros; ValueError naming the tensor for a wrong dtype or shape."""
    packed_key, scale_key, shape_key = (f"{module}.{s}" for s in ("weight_packed", "weight_scale", "weight_shape"))
    for key in (scale_key, shape_key):
        if key not in ckpt:
            raise ValueError(f"{packed_key}: {ENCODING} weight without {key} in {ckpt.path}")
    logical = _logical_shape(ckpt, shape_key)
    if logical != [n, k]:
        raise ValueError(f"{shape_key}: {logical} in {ckpt.path}, but the model's {module} is [{n}, {k}] "
                         "(weight_shape disagrees)")
    expect_int32(ckpt, packed_key, ENCODING)
    ckpt.expect_shape(packed_key, (n, cdiv(k, 8)))
    expect_scale_dtype(ckpt, scale_key)
    scale_shape = ckpt.shape(scale_key)
    if len(scale_shape) != 2 or scale_shape[0] != n:
        raise ValueError(f"{scale_key}: shape {scale_shape} in {ckpt.path}, expected [{n}, groups] (one scale per "
                         f"output row and group of inputs of the [{n}, {k}] weight)")
    groups = scale_shape[1]
    group = group_of(ckpt, scale_key, k, groups)
    zero: Optional[torch.Tensor] = None
    zero_key = f"{module}.weight_zero_point"
    if zero_key in ckpt:
        expect_int32(ckpt, zero_key, ENCODING + " zero points")
        ckpt.expect_shape(zero_key, (cdiv(n, 8), groups))
        zero = unpack_int32_nibbles(ckpt.get(zero_key), 0, n).to(torch.int32)
    g_idx = None
    g_idx_key = f"{module}.weight_g_idx"
    if g_idx_key in ckpt:
        g_idx = read_g_idx(ckpt, g_idx_key, k, groups)
    codes = unpack_int32_nibbles(ckpt.get(packed_key), 1, k)
    return Int4Linear(module, codes, ckpt.get(scale_key).float(), zero, group, g_idx)


class CompressedTensorsExperts(Int4Experts):
    """Per-expert ``{e}.{gate,up,down}_proj.weight_packed`` (see the module docstring)."""

    ENCODING = ENCODING
    MARKER = "weight_packed"
    read_linear = staticmethod(read_pack_quantized)
