"""Find one experts block in a checkpoint: the first reader kind whose keys are there, at the first prefix.

Every reader kind has one module (``dense``, ``mxfp4``, ``fp8``, ``fp4``, ``compressed_tensors``, ``gptq``) and one class
with the same three members:

* ``probe_keys(prefix)`` -- the keys it looks for (named in the error when nothing is found);
* ``find(ckpt, prefix, hidden_size, intermediate_size, num_experts=None, layout=CONCATENATED)``
  -- a reader when its keys are under ``prefix`` (shapes checked; ``num_experts`` None: any), else None;
* ``experts(ids)`` -- per id, ``(gate_up [2I, H], down [H, I])``, gate rows first, one expert read at a time.

A new reader kind is a module with such a class and a place in :data:`READERS`.
"""
from __future__ import annotations

from typing import Iterable, Optional

from .dense import FusedExperts, PerExpertTensors
from .compressed_tensors import CompressedTensorsExperts
from .fp4 import Fp4Experts
from .fp8 import Fp8Experts
from .fused_layout import CONCATENATED, FusedLayout
from .gptq import GptqExperts
from .mxfp4 import Mxfp4Experts
from .safetensors_dir import SafetensorsCheckpoint

READERS = (FusedExperts, Mxfp4Experts, Fp8Experts, Fp4Experts, CompressedTensorsExperts, GptqExperts,
           PerExpertTensors)  # tried in this order at each prefix
# What checkpoints call an MoE block whose module is ``mlp``: Mixtral's ``block_sparse_moe``, DeepSeek-V4's
# original ``ffn`` (its save_pretrained writes ``layers.{L}.ffn.experts.{e}.w1.weight``).
MOE_BLOCK_NAMES = ("mlp", "block_sparse_moe", "ffn")
# Keys of int4 encodings, refused by name (instead of "no experts found") in a layout no reader knows.
UNREAD_ENCODINGS = {"qweight": "GPTQ / AWQ int4 (qweight, qzeros, scales)",
                    "weight_packed": "compressed-tensors pack-quantized int4 (weight_packed, weight_scale)"}


def refuse_unread_encoding(ckpt: SafetensorsCheckpoint, prefix: str) -> None:
    """ValueError naming the first int4 tensor under ``prefix`` when no reader found experts there."""
    for key in ckpt.keys_under(prefix + "."):
        for marker, what in UNREAD_ENCODINGS.items():
            if key.endswith(marker):
                raise ValueError(f"{key}: the experts under {prefix} are {what} in a layout torch_ktmoe does not "
                                 f"read (it reads them per expert: {prefix}.<e>.gate_proj.{marker} ...); "
                                 f"in {ckpt.path}")


def find_experts(ckpt: SafetensorsCheckpoint, prefixes: Iterable[str], hidden_size: int, intermediate_size: int, *,
                 num_experts: Optional[int] = None, layout: FusedLayout = CONCATENATED, what: str = "the block"):
    """The reader of the first prefix that holds experts; KeyError naming ``what`` and every key looked for."""
    tried: list[str] = []
    for prefix in prefixes:
        for reader in READERS:
            found = reader.find(ckpt, prefix, hidden_size, intermediate_size, num_experts, layout)
            if found is not None:
                return found
            tried.extend(reader.probe_keys(prefix))
        refuse_unread_encoding(ckpt, prefix)
    raise KeyError(f"no experts of {what} in {ckpt.path}; looked for {tried}")
