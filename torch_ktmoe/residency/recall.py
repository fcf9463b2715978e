"""The recall of next-layer predictions: the ids predicted for a layer wait on it, and its next forward counts how
many of the experts its router chose they named (recall = |predicted ∩ routed| / |routed|, summed over tokens, ids < 0
skipped). Shown by :meth:`torch_ktmoe.KTMoE.residency_stats` and :func:`torch_ktmoe.residency_report`; read by
:class:`~torch_ktmoe.residency.layer_reads.LayerReads` to tell whether a layer's predictions pay."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

RECALL_COUNTERS = ("predicted_forwards", "predicted_routed", "predicted_found")


class PredictionRecall:
    """The predictions waiting on one layer and how many of its routed experts they named (see the module)."""

    def __init__(self):
        self.pending: Optional[torch.Tensor] = None  # [T, k'] ids predicted for the next forward
        self.reset()

    def reset(self) -> None:
        self.counts = dict.fromkeys(RECALL_COUNTERS, 0)

    def expect(self, predicted: torch.Tensor) -> None:
        self.pending = predicted

    def observe(self, topk_ids: torch.Tensor) -> Optional[Tuple[int, int]]:
        """Compares the pending prediction with ``topk_ids`` [T, k] (or [B, S, k]) and drops it; returns (found,
        routed) of this forward. A prediction for another number of tokens (a forward that never reached this
        layer) is dropped uncounted (None)."""
        predicted, self.pending = self.pending, None
        routed = topk_ids.reshape(-1, topk_ids.shape[-1])
        if predicted is None or predicted.shape[0] != routed.shape[0]:
            return None
        valid = routed >= 0
        found = int(((routed.unsqueeze(-1) == predicted.unsqueeze(1)).any(-1) & valid).sum())
        routed_count = int(valid.sum())
        c = self.counts
        c["predicted_forwards"] += 1
        c["predicted_routed"] += routed_count
        c["predicted_found"] += found
        return found, routed_count

    def stats(self) -> dict:
        c = dict(self.counts)
        c["recall"] = c["predicted_found"] / c["predicted_routed"] if c["predicted_routed"] else None
        return c


