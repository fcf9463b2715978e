"""Find one experts block in a checkpoint: the first reader kind whose keys are there, at the first prefix.

Every reader kind has one module (``dense``, ``mxfp4``; FP8 blocks and int4 groups come the
same way) and one class with the same three members:

* ``probe_keys(prefix)`` -- the keys it looks for (named in the error when nothing is found);
* ``find(ckpt, prefix, hidden_size, intermediate_size, num_experts=None, layout=CONCATENATED)``
  -- a reader when its keys are under ``prefix`` (shapes checked; ``num_experts`` None: any), else None;
* ``experts(ids)`` -- per id, ``(gate_up [2I, H], down [H, I])``, gate rows first, one expert read at a time.

A new reader kind is a module with such a class and a place in :data:`READERS`.
"""
from __future__ import annotations

from typing import Iterable, Optional

from .dense import FusedExperts, PerExpertTensors
from .fused_layout import CONCATENATED, FusedLayout
from .mxfp4 import Mxfp4Experts
from .safetensors_dir import SafetensorsCheckpoint

READERS = (FusedExperts, Mxfp4Experts, PerExpertTensors)  # tried in this order at each prefix


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
    raise KeyError(f"no experts of {what} in {ckpt.path}; looked for {tried}")
