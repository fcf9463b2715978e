"""``KTLinear``: an ``nn.Linear`` whose weight is packed for ktmoe's bf16 gemm (``torch.ops.ktmoe.linear``).

The dense layers around the experts of an MoE model (attention projections, shared experts, lm_head) run
through the same bf16 gemm as the experts: the weight is rounded to bf16 once, packed in the experts'
layout, and read at close to the memory's read roof by one row of activations (decode), where torch's own
bf16 GEMV reads far slower. ``torch_ktmoe.hf.pack_linears(model)`` swaps a model's layers for these.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from . import ops
from .unpack import unpack_matrix

__all__ = ["KTLinear"]


class KTLinear(nn.Module):
    """``y = x Wᵀ + b`` over a packed bf16 ``W`` [out_features, in_features].

    ``forward``: x [..., in_features] bf16|fp16|fp32 -> [..., out_features] in x's dtype (x and W rounded to
    bf16, products summed in fp32, + bias). Buffers: ``w_packed`` uint8 [B] (:func:`torch_ktmoe.ops.pack_linear`);
    ``bias`` [out_features] (kept in its dtype, not trainable) or None. Inference only: a backward through it
    raises :class:`torch_ktmoe.ops.InferenceOnlyError`.

    ``state_dict()`` holds nn.Linear's keys: ``weight`` unpacked (the packed bf16 values exactly, in
    ``weight_dtype``, the replaced weight's dtype) and ``bias``, so ``save_pretrained`` writes a checkpoint the
    unpatched model loads; ``load_state_dict`` takes a dense ``weight`` [out, in] and packs it.
    """

    def __init__(self, w_packed: torch.Tensor, in_features: int, out_features: int,
                 bias: Optional[torch.Tensor] = None, weight_dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.weight_dtype = weight_dtype
        self.register_buffer("w_packed", w_packed)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self.register_state_dict_post_hook(_dense_weight_state_dict)
        self.register_load_state_dict_pre_hook(_pack_loaded_weight)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "KTLinear":
        """A KTLinear computing ``linear`` (its weight packed; it keeps no reference to the dense weight, so the
        weight is freed with ``linear`` unless something else, e.g. a tied embedding, holds it)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"KTLinear.from_linear takes an nn.Linear, got {type(linear).__name__}")
        weight = linear.weight
        if weight.device.type != "cpu":
            raise ValueError(f"KTLinear.from_linear: the weight is on {weight.device}; ktmoe runs on the CPU")
        return cls(ops.pack_linear(weight.detach()), linear.in_features, linear.out_features, linear.bias,
                   weight.dtype)

    @property
    def packed_bytes(self) -> int:
        return self.w_packed.numel()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in_features] -> [..., out_features]
        return ops.linear(x, self.w_packed, self.out_features, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _dense_weight_state_dict(module: KTLinear, state_dict, prefix, local_metadata):
    packed = state_dict.pop(prefix + "w_packed")
    state_dict[prefix + "weight"] = unpack_matrix(packed.view(1, -1))[0][0].to(module.weight_dtype)


def _pack_loaded_weight(module: KTLinear, state_dict, prefix, local_metadata, strict, missing_keys,
                        unexpected_keys, error_msgs):
    weight = state_dict.pop(prefix + "weight", None)
    if weight is None:
        return
    want = (module.out_features, module.in_features)
    if tuple(weight.shape) != want:  # a packed [41, 70] can have the bytes of [40, 72]: check the shape itself
        error_msgs.append(f"size mismatch for {prefix}weight: copying a param with shape {tuple(weight.shape)} from "
                          f"checkpoint, the shape in current model is {want} (KTLinear: [out_features, in_features])")
        state_dict[prefix + "w_packed"] = module.w_packed  # the layer keeps its weight
        return
    state_dict[prefix + "w_packed"] = ops.pack_linear(weight)
