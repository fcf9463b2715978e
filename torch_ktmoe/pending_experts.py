"""PendingExperts: a layer's experts as they arrive one by one (``KTMoE.load_expert``), until all are in.

Holds at most one layer's dense experts, filled in place (no stacking copy), so a checkpoint can be streamed
expert by expert. Every expert must come with the same tensors (weights, and scales / zero points for a
quantized checkpoint) in the same dtypes: a layer is one dtype, as ``KTMoE.load_weights`` takes it (a cast
would pack int8 codes, or fp32 values as e4m3, as weights).
"""
from typing import Dict, Optional

import torch


class PendingExperts:
    def __init__(self, num_experts: int, where: str):
        self.num_experts, self.where = num_experts, where
        self._tensors: Dict[str, torch.Tensor] = {}  # name -> [E, ...], filled in place
        self._have = set()

    def __len__(self) -> int:
        """How many experts are in (0: nothing pending)."""
        return len(self._have)

    def add(self, expert: int, given: Dict[str, torch.Tensor]) -> Optional[Dict[str, torch.Tensor]]:
        """Takes ``expert``'s tensors by name; returns the whole layer's ``{name: [E, ...]}`` once all are in
        (and starts over), else None."""
        if not self._tensors:
            self._tensors = {k: t.new_empty((self.num_experts, *t.shape)) for k, t in given.items()}
        if set(given) != set(self._tensors):
            raise ValueError(f"{self.where}: expert {expert} comes with {sorted(given)}, the "
                             f"experts before it with {sorted(self._tensors)}")
        for k, t in given.items():
            if t.dtype != self._tensors[k].dtype:
                raise ValueError(f"{self.where}: expert {expert}'s {k} is {t.dtype}, the experts "
                                 f"before it {self._tensors[k].dtype}; a layer's experts must share one dtype")
        for k, t in given.items():
            self._tensors[k][expert].copy_(t)
        self._have.add(expert)
        if len(self._have) < self.num_experts:
            return None
        done, self._tensors, self._have = self._tensors, {}, set()
        return done
