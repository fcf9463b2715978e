"""Where one sglang MoE layer's experts are in a safetensors checkpoint (what ``--kt-weight-path`` names).

Under ``model.layers.{L}`` (or a multimodal model's ``language_model`` variants), each of
``mlp.experts``, Mixtral's ``block_sparse_moe.experts`` and DeepSeek-V4's ``ffn.experts`` is tried with the readers of
:mod:`torch_ktmoe.checkpoint` (fused ``gate_up_proj`` [E, 2I, H] / ``down_proj`` [E, H, I],
per-expert ``{e}.{gate,up,down}_proj.weight`` or ``{e}.w1/w3/w2.weight``, gpt-oss MXFP4, FP8, compressed-tensors
and GPTQ / AWQ int4). An int4 checkpoint's ``config.json`` quantization_config, when the directory has one,
is checked (:func:`~torch_ktmoe.checkpoint.check_int4_config`). gpt-oss stores its fused experts with gate and up
interleaved (:data:`GPT_OSS_LAYOUT`) and with expert biases (:func:`layer_biases`); :func:`is_gpt_oss` recognises it
from config.json's ``model_type`` "gpt_oss" or, without one, from the biases beside the layer's experts, and refuses
a checkpoint whose config names another model while its experts carry them. ``config.json`` is read through the
checkpoint files' one opener (:func:`checkpoint_config`: a FIFO is refused, never waited on; not an object, or a
field of the wrong type, is an error naming the file and the field).
kt-kernel's own pre-converted files (``blk.*`` keys, AMX layouts) are refused with an error
that says so.
"""
from __future__ import annotations

import math
import os

import torch

from ..checkpoint.files import read_json
from ..checkpoint import INT4_QUANT_METHODS, MOE_BLOCK_NAMES, Int4Experts, SafetensorsCheckpoint, check_int4_config, find_experts
from ..checkpoint.fused_layout import CONCATENATED, FusedLayout

LAYER_PREFIXES = ("model.layers.{L}", "model.language_model.layers.{L}", "language_model.model.layers.{L}")
EXPERTS_NAMES = tuple(f"{block}.experts" for block in MOE_BLOCK_NAMES)
# gpt-oss's fused experts: bf16 gate_up_proj [E, H, 2I] (MXFP4 _blocks output-major), gate = 0::2, up = 1::2
GPT_OSS_LAYOUT = FusedLayout(transposed=True, interleaved=True)


def _experts_prefixes(layer_idx: int) -> list[str]:
    return [f"{lp.format(L=layer_idx)}.{en}" for lp in LAYER_PREFIXES for en in EXPERTS_NAMES]


def check_weight_path(path) -> None:
    """Raises a clear error unless ``path`` is an existing directory."""
    if path is None:
        raise ValueError("KTMoEWrapper: weight_path is None; sglang passes --kt-weight-path (a directory of "
                         "*.safetensors files holding the model's experts)")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"KTMoEWrapper: weight_path {path!r} is not a directory (--kt-weight-path must "
                                "name a directory of *.safetensors files)")


def layer_experts(ckpt: SafetensorsCheckpoint, layer_idx: int, hidden_size: int, intermediate_size: int,
                  layout: FusedLayout = CONCATENATED):
    """The reader of layer ``layer_idx``'s experts (fused tensors split as ``layout`` says); ``reader.experts(ids)``
    yields (gate_up [2I, H], down [H, I])."""
    if any(k.startswith("blk.") for k in ckpt.key_to_file):
        raise ValueError(f"KTMoEWrapper: {ckpt.path} holds kt-kernel's pre-converted CPU weights (blk.* keys); "
                         "torch_ktmoe packs from the original Hugging Face safetensors: point --kt-weight-path "
                         "at the model's checkpoint directory")
    reader = find_experts(ckpt, _experts_prefixes(layer_idx), hidden_size, intermediate_size, layout=layout,
                          what=f"layer {layer_idx}")
    if isinstance(reader, Int4Experts):
        check_int4_checkpoint_config(ckpt)
    return reader


def layer_biases(ckpt: SafetensorsCheckpoint, layer_idx: int, num_experts: int, hidden_size: int,
                 intermediate_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss's expert biases of layer ``layer_idx``: (gate_up [E, 2I], gate columns then up; down [E, H]), fp32.
    KeyError naming the keys looked for where the layer has none, or only one of the two."""
    tried = []
    for prefix in _experts_prefixes(layer_idx):
        keys = (f"{prefix}.gate_up_proj_bias", f"{prefix}.down_proj_bias")
        tried.extend(keys)
        if not any(k in ckpt for k in keys):
            continue
        missing = [k for k in keys if k not in ckpt]
        if missing:
            raise KeyError(f"{missing[0]} is missing in {ckpt.path}: gpt-oss's experts carry a gate_up and a down bias")
        ckpt.expect_shape(keys[0], (num_experts, 2 * intermediate_size))
        ckpt.expect_shape(keys[1], (num_experts, hidden_size))
        gate_up = ckpt.get(keys[0]).float()
        return torch.cat([gate_up[:, 0::2], gate_up[:, 1::2]], -1), ckpt.get(keys[1]).float()
    raise KeyError(f"no expert biases of layer {layer_idx} in {ckpt.path} (gpt-oss's experts carry them); looked for "
                   f"{tried[:2]} and the like")


def check_int4_checkpoint_config(ckpt: SafetensorsCheckpoint) -> None:
    """The int4 quantization_config of the checkpoint's config.json, if there is one, is read by torch_ktmoe."""
    qc = ckpt.quantization_config
    if qc.get("quant_method") in INT4_QUANT_METHODS:
        check_int4_config(qc, os.path.join(ckpt.path, "config.json"))


def checkpoint_config(path: str) -> dict:
    """The checkpoint directory's ``config.json`` ({} without one); ValueError naming it if it is no regular file or
    no JSON object."""
    file = os.path.join(path, "config.json")
    if not os.path.lexists(file):
        return {}
    config = read_json(file)
    if not isinstance(config, dict):
        raise ValueError(f"checkpoint file {file!r} is not a JSON object (it holds a {type(config).__name__})")
    return config


def config_number(path: str, config: dict, field: str, default: float) -> float:
    """``config[field]`` (``default`` without it) as a float; ValueError naming config.json and the field unless it
    is a finite number (a string, a bool, null or a list is not one)."""
    value = config.get(field, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{os.path.join(path, 'config.json')}: {field} must be a finite number, got {value!r}")
    return float(value)


def expert_bias_key(ckpt: SafetensorsCheckpoint, layer_idx: int):
    """The first expert bias tensor (gpt-oss's ``gate_up_proj_bias`` / ``down_proj_bias``) beside layer
    ``layer_idx``'s experts, or None."""
    for prefix in _experts_prefixes(layer_idx):
        for key in (f"{prefix}.gate_up_proj_bias", f"{prefix}.down_proj_bias"):
            if key in ckpt:
                return key
    return None


def is_gpt_oss(ckpt: SafetensorsCheckpoint, layer_idx: int, config: dict) -> bool:
    """Whether layer ``layer_idx``'s experts are gpt-oss's (interleaved, biased, clamped SwiGLU): config.json's
    ``model_type`` "gpt_oss", or no ``model_type`` and expert biases beside the experts. ValueError naming both
    when config.json names another model while the experts carry biases (read either way, one would be wrong)."""
    model_type = config.get("model_type")
    if model_type == "gpt_oss":
        return True
    bias = expert_bias_key(ckpt, layer_idx)
    if bias is None:
        return False
    if model_type is None:
        return True
    raise ValueError(f"{ckpt.path}: config.json's model_type is {model_type!r}, but layer {layer_idx}'s experts "
                     f"carry expert biases ({bias}) as gpt-oss's do (gate/up interleaved, clamped SwiGLU); "
                     "torch_ktmoe reads such experts as gpt-oss's only under model_type 'gpt_oss'")
