"""The non-expert weights of an FP8 checkpoint, dequantized in place after transformers loaded them.

``hf.from_pretrained`` hands transformers an FP8 checkpoint's config without its quantization_config
(transformers' own FP8 path needs ``accelerate`` and, without a GPU, dequantizes everything, experts
included, to bf16). transformers then loads each FP8 ``...weight`` into its float parameter, which is
exact (every e4m3 value is a bf16, fp16 and fp32 value), and reports its ``weight_scale_inv`` as
unexpected; :func:`dequantize_loaded_fp8` multiplies each such parameter by its scale, as
``torch_ktmoe.checkpoint.fp8`` defines it (128 x 128 blocks or one scale per row), after the checks the
experts' reader makes (an e5m2 weight, a missing, integer or non-finite scale: refused by name). The
experts never take this path: they stream into KTMoE.
"""
from __future__ import annotations

import torch

from ..checkpoint import SafetensorsCheckpoint
from ..checkpoint.fp8 import SCALE_SUFFIXES, dequantize_fp8, fp8_scale_key, read_fp8_scales


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


def fp8_weight_keys(ckpt, skip_prefixes=()) -> list[str]:
    """The checkpoint's ``...weight`` tensors of any float8 dtype (e4m3, e5m2, ...) outside ``skip_prefixes``
    (the experts, which stream into KTMoE), sorted."""
    return [k for k in ckpt.keys_under("") if k.endswith("weight") and not k.startswith(tuple(skip_prefixes))
            and ckpt.dtype(k).startswith("F8_")]


@torch.no_grad()
def dequantize_loaded_fp8(model, path: str, skip_prefixes=()) -> None:
    """Each FP8 weight of the checkpoint outside ``skip_prefixes``: ``param = e4m3 * scale`` in place, after
    the checks the experts get (:func:`~torch_ktmoe.checkpoint.fp8.fp8_scale_key`: e4m3, a float scale
    present; :func:`~torch_ktmoe.checkpoint.fp8.read_fp8_scales`: its shape, finite); a weight that is not
    finite in the parameter's dtype is refused too. Each refusal is a ValueError naming the tensor."""
    with SafetensorsCheckpoint(path) as ckpt:
        for key in fp8_weight_keys(ckpt, skip_prefixes):
            scale_key = fp8_scale_key(ckpt, key)
            param = _parameter(model, key)
            n, k = param.shape
            values = dequantize_fp8(ckpt.get(key), read_fp8_scales(ckpt, scale_key, n, k, 32), 32).to(param.dtype)
            if not torch.isfinite(values).all():
                raise ValueError(f"{key}: non-finite weights once dequantized into {param.dtype} (NaN codes, or "
                                 f"values past the dtype's range) in {ckpt.path}")
            param.data.copy_(values)
