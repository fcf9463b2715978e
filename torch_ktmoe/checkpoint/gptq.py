"""GPTQ and AWQ int4 weights (``quantization_config.quant_method`` ``"gptq"`` / ``"awq"``; sglang
``--kt-method GPTQ_INT4``).

Per linear module ``M`` with weights [n, k] and groups of g inputs (G = ceil(k/g)):

* GPTQ (auto-gptq / optimum, ``checkpoint_format: "gptq"``, v1): ``M.qweight`` int32 [k/8, n], 8 inputs per
  int32 (input ``8 j + i`` of column r in bits 4i..4i+3 of ``qweight[j, r]``); ``M.qzeros`` int32 [G, n/8],
  8 columns per int32 the same way, storing z - 1; ``M.scales`` fp16 [G, n]; ``M.g_idx`` int32 [k], the group
  of each input (act-order, ``desc_act``; ``c // g`` without it);
* AWQ (GEMM version): ``M.qweight`` int32 [k, n/8] and ``M.qzeros`` int32 [G, n/8], 8 columns per int32 in
  the order [0, 2, 4, 6, 1, 3, 5, 7] (nibble i holds column ``8 j + order[i]``), z stored as is;
  ``M.scales`` fp16 [G, n].

``w[r, c] = scales[g(c), r] * (q[r, c] - z[g(c), r])``, z in [0, 16]. The two are told apart by
``qweight``'s shape ([k/8, n] or [k, n/8]; never both for k > 0); :func:`read_gptq` returns either as
an :class:`~.int4_linear.Int4Linear`.
"""
from __future__ import annotations

import torch

from .int4_linear import (Int4Experts, Int4Linear, cdiv, expect_int32, expect_scale_dtype, group_of, read_g_idx,
                          unpack_int32_nibbles)

ENCODING = "GPTQ / AWQ int4"
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def read_gptq(ckpt, module: str, n: int, k: int, zero_offset: int = 1) -> Int4Linear:
    """``module``'s ``qweight`` / ``qzeros`` / ``scales`` (/ ``g_idx``) as codes, scales and zeros (GPTQ or
    AWQ by ``qweight``'s shape); ValueError naming the tensor for a wrong dtype or shape. ``zero_offset``:
    what GPTQ adds to its stored zeros (1 for v1, 0 for ``checkpoint_format: "gptq_v2"``)."""
    qweight, qzeros, scales = (f"{module}.{s}" for s in ("qweight", "qzeros", "scales"))
    for key in (qzeros, scales):
        if key not in ckpt:
            raise ValueError(f"{qweight}: {ENCODING} weight without {key} in {ckpt.path}")
    expect_int32(ckpt, qweight, "GPTQ / AWQ qweight")
    expect_int32(ckpt, qzeros, "GPTQ / AWQ qzeros")
    expect_scale_dtype(ckpt, scales)
    shape = ckpt.shape(qweight)
    awq = shape == [k, cdiv(n, 8)]
    if not awq and shape != [cdiv(k, 8), n]:
        raise ValueError(f"{qweight}: shape {shape} in {ckpt.path} fits neither GPTQ ([{cdiv(k, 8)}, {n}]) nor AWQ "
                         f"([{k}, {cdiv(n, 8)}]) for the model's [{n}, {k}] {module}")
    scale_shape = ckpt.shape(scales)
    if len(scale_shape) != 2 or scale_shape[1] != n:
        raise ValueError(f"{scales}: shape {scale_shape} in {ckpt.path}, expected [groups, {n}] (one scale per group "
                         f"of inputs and output column of the [{n}, {k}] weight)")
    groups = scale_shape[0]
    group = group_of(ckpt, scales, k, groups)
    ckpt.expect_shape(qzeros, (groups, cdiv(n, 8)))
    order = AWQ_ORDER if awq else None
    zero = unpack_int32_nibbles(ckpt.get(qzeros), 1, n, order).to(torch.int32).t()  # [n, G]
    if awq:
        codes = unpack_int32_nibbles(ckpt.get(qweight), 1, n, AWQ_ORDER).t()  # [k, n] -> [n, k]
    else:
        codes = unpack_int32_nibbles(ckpt.get(qweight), 0, k).t()
        zero = zero + zero_offset
    g_idx = None
    if f"{module}.g_idx" in ckpt:
        g_idx = read_g_idx(ckpt, f"{module}.g_idx", k, groups)
    return Int4Linear(module, codes.contiguous(), ckpt.get(scales).float().t().contiguous(), zero.contiguous(),
                      group, g_idx)


class GptqExperts(Int4Experts):
    """Per-expert ``{e}.{gate,up,down}_proj.qweight`` (see the module docstring)."""

    ENCODING = ENCODING
    MARKER = "qweight"
    read_linear = staticmethod(read_gptq)
