"""Dense experts in a checkpoint (bf16 / fp16 / fp32): stacked in two fused tensors, or one tensor per expert.

Both readers yield, per expert id, ``(gate_up [2I, H], down [H, I])`` (gate rows first) in the
checkpoint's dtype, reading one expert at a time; shapes and dtypes are checked before anything is
read: a tensor that is not fp32 / bf16 / fp16 is refused by :func:`expect_dense`, never converted.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Optional

import torch

from .fused_layout import CONCATENATED, FusedLayout
from .safetensors_dir import SafetensorsCheckpoint

DENSE_DTYPES = ("F32", "BF16", "F16")  # safetensors' names of the dtypes read as weights
# Name fragments of the tensors quantized encodings keep beside (or instead of) a weight.
COMPANION_MARKERS = ("scale", "zero", "qweight", "qzeros", "weight_packed", "weight_shape", "g_idx", "_blocks")


def companions(ckpt: SafetensorsCheckpoint, key: str) -> list[str]:
    """The quantization companions of ``key`` in the checkpoint: keys of its module (``key`` without its last
    component) named like scales, zero points or packed codes."""
    module = key.rsplit(".", 1)[0] + "."
    return [k for k in ckpt.keys_under(module)
            if k != key and any(m in k[len(module):] for m in COMPANION_MARKERS)]


def expect_dense(ckpt: SafetensorsCheckpoint, key: str) -> None:
    """ValueError naming ``key``, its dtype and its quantization companions unless it is fp32 / bf16 / fp16."""
    dtype = ckpt.dtype(key)
    if dtype not in DENSE_DTYPES:
        raise ValueError(
            f"{key}: expert weight of dtype {dtype} in {ckpt.path}; torch_ktmoe reads fp32 / bf16 / fp16 experts, "
            f"FP8 (F8_E4M3 with its weight_scale_inv / weight_scale), gpt-oss MXFP4 and DeepSeek-V4 FP4 (I8, U8 or F4 "
            f"with its UE8M0 scale), and refuses anything else rather than read codes as numbers; companion tensors found: {companions(ckpt, key) or 'none'}")


# (gate, up, down) key suffixes under "<prefix>.<expert>."
PER_EXPERT_LAYOUTS = (
    ("gate_proj.weight", "up_proj.weight", "down_proj.weight"),  # Qwen2/3-MoE, OLMoE, DeepSeek-V3
    ("w1.weight", "w3.weight", "w2.weight"),  # Mixtral
)


def per_expert_probe_keys(prefix: str, tensor: str = "weight") -> list[str]:
    """Per suffix triple of :data:`PER_EXPERT_LAYOUTS`, expert 0's gate ``tensor`` (``weight``, or a companion
    such as ``weight_scale_inv``) under ``prefix``: what a per-expert reader looks for."""
    return [f"{prefix}.0.{s[0][: -len('weight')]}{tensor}" for s in PER_EXPERT_LAYOUTS]


def per_expert_suffixes(ckpt: SafetensorsCheckpoint, prefix: str, dtypes=None) -> Optional[tuple[str, str, str]]:
    """The first suffix triple of :data:`PER_EXPERT_LAYOUTS` whose expert 0 gate weight is under ``prefix``
    (with a safetensors dtype in ``dtypes``, None: any), else None."""
    for suffixes in PER_EXPERT_LAYOUTS:
        key = f"{prefix}.0.{suffixes[0]}"
        if key in ckpt and (dtypes is None or ckpt.dtype(key) in dtypes):
            return suffixes
    return None


class FusedExperts:
    """``<prefix>.gate_up_proj`` [E, 2I, H] and ``<prefix>.down_proj`` [E, H, I] in a :class:`FusedLayout`
    (transformers 5 checkpoints; gpt-oss's bf16 ones are transposed and interleaved). Granite-MoE
    names the pair ``<block>.input_linear.weight`` / ``<block>.output_linear.weight``."""

    @staticmethod
    def key_pairs(prefix: str) -> list[tuple[str, str]]:
        pairs = [(f"{prefix}.gate_up_proj", f"{prefix}.down_proj")]
        if prefix.endswith(".experts"):
            parent = prefix[: -len(".experts")]
            pairs.append((f"{parent}.input_linear.weight", f"{parent}.output_linear.weight"))
        return pairs

    @classmethod
    def probe_keys(cls, prefix: str) -> list[str]:
        return [gate_up for gate_up, _ in cls.key_pairs(prefix)]

    @classmethod
    def find(cls, ckpt: SafetensorsCheckpoint, prefix: str, hidden_size: int, intermediate_size: int,
             num_experts: Optional[int] = None, layout: FusedLayout = CONCATENATED) -> Optional["FusedExperts"]:
        for gate_up, down in cls.key_pairs(prefix):
            if gate_up in ckpt and down in ckpt:
                return cls(ckpt, gate_up, down, hidden_size, intermediate_size, num_experts, layout)
        return None

    def __init__(self, ckpt, gate_up_key: str, down_key: str, hidden_size: int, intermediate_size: int,
                 num_experts: Optional[int], layout: FusedLayout):
        E = ckpt.shape(gate_up_key)[0] if num_experts is None else num_experts
        shapes = layout.shapes(E, hidden_size, intermediate_size)
        for key, name in ((gate_up_key, "gate_up_proj"), (down_key, "down_proj")):
            ckpt.expect_shape(key, shapes[name])
            expect_dense(ckpt, key)
        self.ckpt, self.gate_up_key, self.down_key, self.layout = ckpt, gate_up_key, down_key, layout

    def experts(self, ids: Iterable[int]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        ids = list(ids)
        self.ckpt.expect_rows(self.gate_up_key, ids)
        for e in ids:
            gate, up = self.layout.split_gate_up(self.ckpt.get_row(self.gate_up_key, e))
            yield torch.cat([gate, up]), self.layout.down(self.ckpt.get_row(self.down_key, e))


class PerExpertTensors:
    """``<prefix>.<e>.gate_proj.weight`` [I, H], ``up_proj`` [I, H], ``down_proj`` [H, I], or another
    suffix triple of :data:`PER_EXPERT_LAYOUTS` (Mixtral's ``w1`` / ``w3`` / ``w2``)."""

    probe_keys = staticmethod(per_expert_probe_keys)

    @classmethod
    def find(cls, ckpt: SafetensorsCheckpoint, prefix: str, hidden_size: int, intermediate_size: int,
             num_experts: Optional[int] = None, layout: FusedLayout = CONCATENATED) -> Optional["PerExpertTensors"]:
        suffixes = per_expert_suffixes(ckpt, prefix)
        return None if suffixes is None else cls(ckpt, prefix, suffixes, hidden_size, intermediate_size)

    def __init__(self, ckpt, prefix: str, suffixes: tuple[str, str, str], hidden_size: int, intermediate_size: int):
        self.ckpt, self.prefix, self.suffixes = ckpt, prefix, suffixes
        H, I = hidden_size, intermediate_size
        self.shapes = ((I, H), (I, H), (H, I))

    def experts(self, ids: Iterable[int]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for e in ids:
            keys = [f"{self.prefix}.{e}.{s}" for s in self.suffixes]
            missing = [k for k in keys if k not in self.ckpt]
            if missing:
                raise KeyError(f"expert {e} is missing in {self.ckpt.path}: {missing}")
            for key, shape in zip(keys, self.shapes):
                self.ckpt.expect_shape(key, shape)
                expect_dense(self.ckpt, key)
            gate, up, down = (self.ckpt.get(k) for k in keys)
            yield torch.cat([gate, up]), down
