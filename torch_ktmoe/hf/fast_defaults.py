"""What ``patch_model`` and ``from_pretrained`` do after the experts unless told not to (``apply_defaults``).

Each default is applied where it keeps the model's outputs within its dtype's rounding:

* ``pack_linears=True``: :func:`~torch_ktmoe.hf.pack_linears` over the bf16 layers of a **bf16** model. The
  packed weight holds the same bf16 values and the gemm takes bf16 activations, summing in fp32 as torch
  does: the outputs differ from torch's by summation order, and greedy tokens are equal
  (``tests/test_hf_defaults.py``). In an fp32 or fp16 model
  packing would round weights and activations to bf16, so its linears stay torch's (an explicit
  ``pack_linears(model)`` packs them). A checkpoint's FP8 / int4 dense weights are dequantized into the
  model's dtype when it loads (:mod:`.fp8_dense`, :mod:`.int4_dense`): in a bf16 model they are bf16
  weights like any other. Layers that stay quantized (``nn.Linear`` subclasses, integer or fp8 weights)
  are never packed: ``report.linears.skipped`` names each with the reason.
* ``decode_attention=True``: :func:`~torch_ktmoe.hf.use_decode_attention`, for a model on ``"sdpa"``
  attention in any dtype: one-token decode as grouped matmuls in fp32, rounded once to the model's dtype
  (SDPA's results within that rounding: ``tests/test_decode_attention.py``). Other attention
  implementations, and models whose code tests for ``"sdpa"`` by name, are left as they are.

The :class:`~torch_ktmoe.hf.PatchReport` says what was done (``linears``, ``decode_attention``) and why a
default was not applied (``defaults_left``).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .decode_attention import NAME as DECODE_ATTENTION
from .decode_attention import decode_attention_refusal, use_decode_attention
from .dense_linears import pack_linears as pack_dense_linears
from .vocabulary import PatchReport, model_dtype

__all__ = ["apply_defaults", "check_switches"]

PACKED_DTYPE = torch.bfloat16  # the dtype whose layers pack without changing their values


def linears_refusal(model: nn.Module) -> str | None:
    """Why packing ``model``'s linears would round them beyond its dtype, or None."""
    dtype = model_dtype(model)
    if dtype == PACKED_DTYPE:
        return None
    return (f"model dtype {dtype}: packing rounds weights and activations to bf16 "
            f"(hf.pack_linears(model) packs them anyway)")


def switch_attention(model: nn.Module) -> str | None:
    """Switches ``model`` to decode attention; returns why it did not, or None."""
    reason = decode_attention_refusal(model)
    if reason is None and not use_decode_attention(model):
        reason = f"transformers did not switch {type(model).__name__} to {DECODE_ATTENTION!r}"
    return reason


def check_switches(**switches) -> None:
    """TypeError unless each switch (``pack_linears=``, ``decode_attention=``) is a bool; loaders call it first."""
    for name, value in switches.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")


def apply_defaults(model: nn.Module, report: PatchReport, *, pack_linears: bool, decode_attention: bool) -> None:
    """Pack ``model``'s dense linears and switch its attention to decode attention where each keeps the
    outputs within the model dtype's rounding (module docstring); record both in ``report``."""
    reason = "pack_linears=False" if not pack_linears else linears_refusal(model)
    if reason is None:
        report.linears = pack_dense_linears(model, dtypes=(PACKED_DTYPE,))
    else:
        report.defaults_left["pack_linears"] = reason
    reason = "decode_attention=False" if not decode_attention else switch_attention(model)
    if reason is None:
        report.decode_attention = True
    else:
        report.defaults_left["decode_attention"] = reason
