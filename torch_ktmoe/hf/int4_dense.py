"""The non-expert int4 linears of a compressed-tensors / GPTQ / AWQ checkpoint, dequantized into the model's weights.

``hf.from_pretrained`` hands transformers such a checkpoint's config without its quantization_config
(transformers' own paths need the GPTQ / AWQ kernels or compressed-tensors' and a GPU for speed). The
model then has plain ``nn.Linear`` weights that the checkpoint does not hold (it holds ``qweight`` /
``qzeros`` / ``scales`` / ``g_idx`` or ``weight_packed`` / ``weight_scale`` / ``weight_shape`` /
``weight_zero_point`` instead): transformers reports the weights missing and those tensors unexpected.
:func:`dequantize_loaded_int4` fills each such weight with its dequantized values, in the parameter's
dtype (the fp32 values are exact; a bf16 model rounds them once). Those weights are not reported
missing, so transformers leaves them on the meta device and they are created here, never initialized
at random first. The experts never take this path: they stream into KTMoE.
"""
from __future__ import annotations

import torch

from ..checkpoint import SafetensorsCheckpoint
from ..checkpoint.compressed_tensors import read_pack_quantized
from ..checkpoint.gptq import read_gptq
from .fp8_dense import parameter_name

# the key of a module's int4 tensors that names its encoding -> that encoding's reader
MARKERS = {"weight_packed": read_pack_quantized, "qweight": read_gptq}
INT4_SUFFIXES = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx",
                 "qweight", "qzeros", "scales", "g_idx")


def is_int4_key(key: str) -> bool:
    return key.rsplit(".", 1)[-1] in INT4_SUFFIXES


def int4_modules(keys) -> dict[str, str]:
    """module -> its marker key's suffix, for every module among ``keys`` with an int4 marker tensor."""
    out = {}
    for key in keys:
        module, _, suffix = key.rpartition(".")
        if suffix in MARKERS:
            out[module] = suffix
    return out


@torch.no_grad()
def dequantize_loaded_int4(model, path: str, int4_keys) -> None:
    """Each module with ``weight_packed`` or ``qweight`` among ``int4_keys``: ``module.weight`` = its
    dequantized int4 values (in place, in the parameter's dtype)."""
    modules = int4_modules(int4_keys)
    if not modules:
        return
    with SafetensorsCheckpoint(path) as ckpt:
        for module, marker in sorted(modules.items()):
            name = parameter_name(model, f"{module}.weight")
            param = model.get_parameter(name)
            n, k = param.shape
            values = MARKERS[marker](ckpt, module, n, k).dequantize().to(param.dtype)
            if param.is_meta:  # not materialized by transformers (not reported missing): a new Parameter
                owner, _, attr = name.rpartition(".")
                setattr(model.get_submodule(owner), attr, torch.nn.Parameter(values, param.requires_grad))
            else:
                param.data.copy_(values)
