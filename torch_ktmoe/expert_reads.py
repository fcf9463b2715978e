"""STAND-IN for the reader pool's API (issue 36 item 2), so that the next-layer predictor has something to call.

The reader pool, built on another branch, replaces this file: ``read_ahead_experts(w13, w2, expert_ids)`` queues
the listed experts' packed rows of a layer (``w13`` / ``w2``: one NUMA part's packed tensors) to I/O threads that
read them into the page cache, returns at once, and does nothing for anonymous tensors. This stand-in does
nothing at all.
"""
from __future__ import annotations

import torch

__all__ = ["read_ahead_experts"]


def read_ahead_experts(w13: torch.Tensor, w2: torch.Tensor, expert_ids) -> None:
    """STAND-IN: does nothing (the reader pool queues ``expert_ids``' packed rows of ``w13`` / ``w2`` for reading)."""
    return None
