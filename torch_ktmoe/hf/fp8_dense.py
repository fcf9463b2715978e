"""The non-expert weights of an FP8 checkpoint, dequantized in place after transformers loaded them.

``hf.from_pretrained`` hands transformers an FP8 checkpoint's config without its quantization_config
(transformers' own FP8 path needs ``accelerate`` and, without a GPU, dequantizes everything, experts
included, to bf16). transformers then loads each FP8 ``...weight`` into its float parameter, which is
exact (every e4m3 value is a bf16, fp16 and fp32 value), and reports its ``weight_scale_inv`` as
unexpected; :func:`dequantize_loaded_fp8` multiplies each such parameter by its scale, as
``torch_ktmoe.checkpoint.fp8`` defines it (128 x 128 blocks or one scale per row). The experts never
take this path: they stream into KTMoE.
"""
from __future__ import annotations

import torch

from ..checkpoint import SafetensorsCheckpoint
from ..checkpoint.fp8 import FP8_DTYPE, SCALE_SUFFIXES, dequantize_fp8, group_scales, scale_block


def is_scale_key(key: str) -> bool:
    return key.endswith(SCALE_SUFFIXES)


def _parameter(model, name: str) -> torch.nn.Parameter:
    return model.get_parameter(parameter_name(model, name))


def parameter_name(model, name: str) -> str:
    """The name in ``model`` of a checkpoint's parameter ``name`` (with or without the base model prefix)."""
    prefix = model.base_model_prefix + "." if model.base_model_prefix else ""
    for candidate in (name, name[len(prefix):] if prefix and name.startswith(prefix) else prefix + name):
        try:
            model.get_parameter(candidate)
            return candidate
        except AttributeError:
            continue
    raise ValueError(f"{name}: a quantized weight of the checkpoint that is no parameter of "
                     f"{type(model).__name__}; it cannot be dequantized")


@torch.no_grad()
def dequantize_loaded_fp8(model, path: str, scale_keys) -> None:
    """Each ``...weight_scale_inv`` (or ``weight_scale``) key's weight: ``param = e4m3 * scale`` in place."""
    if not scale_keys:
        return
    with SafetensorsCheckpoint(path) as ckpt:
        for scale_key in sorted(scale_keys):
            suffix = next(s for s in SCALE_SUFFIXES if scale_key.endswith(s))
            key = scale_key[: -len(suffix)] + "weight"
            if key not in ckpt or ckpt.dtype(key) != FP8_DTYPE:
                continue  # a scale of something else (e.g. a bf16 weight's activation scale): not ours to apply
            param = _parameter(model, key)
            n, k = param.shape
            block = scale_block(ckpt.shape(scale_key), n, k, scale_key)
            scales = group_scales(ckpt.get(scale_key), n, k, 32, block)
            param.data.copy_(dequantize_fp8(ckpt.get(key), scales, 32).to(param.dtype))
