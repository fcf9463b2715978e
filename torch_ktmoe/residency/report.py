"""``residency_report``: the residency figures and prediction recall of every layer of a model, and their totals.

It finds the layers by their :class:`~.layer_reads.LayerReads` (``module.reads``): nothing here knows a layer class.
"""
from __future__ import annotations

import torch.nn as nn

from .counters import COUNTERS, derived
from .layer_reads import LayerReads
from .prediction_gate import GATE_COUNTERS
from .recall import RECALL_COUNTERS

__all__ = ["residency_report"]


def residency_report(module: nn.Module, reset: bool = False) -> dict:
    """Residency figures of every KTMoE layer with file-backed experts (or with predictions of its experts) in
    ``module`` (a model, a ModuleList, one layer): the totals at the top level (``tokens``: the most any layer saw,
    since every token passes every layer; ``layers``: how many are counted; ``recall``: the mean of the predicted
    layers' recalls, ``predicted_layers`` of them; the prediction gate's switches, :mod:`.prediction_gate`) and per
    layer under ``per_layer`` (by module name).
    ``reset=True`` zeroes the counters after reading them."""
    per_layer = {}
    for name, m in module.named_modules():
        reads = getattr(m, "reads", None)
        if not isinstance(reads, LayerReads):
            continue
        stats = reads.stats()
        if stats is None:
            continue
        per_layer[name or "."] = stats
        if reset:
            reads.reset()
    total = {k: sum(s[k] for s in per_layer.values()) for k in COUNTERS + RECALL_COUNTERS + GATE_COUNTERS}
    total["tokens"] = max((s["tokens"] for s in per_layer.values()), default=0)
    total = derived(total)
    recalls = [s["recall"] for s in per_layer.values() if s["recall"] is not None]
    total["recall"] = sum(recalls) / len(recalls) if recalls else None
    total["predicted_layers"] = len(recalls)
    total["layers"] = len(per_layer)
    total["per_layer"] = per_layer
    return total
