"""Next-layer prefetch: while MoE layer L computes, guess the experts layer L+1 will route to and read them ahead.

[NOTE] What is predicted, from what, and what it costs
-------------------------------------------------------
The residual stream changes little from one layer to the next, so layer L+1's router applied to a hidden state of
layer L picks most of the experts L+1 will pick (training-free: nothing is learned). :class:`NextLayerPredictor`
holds layer L+1's router weight (and bias) and its :class:`~.layer_reads.LayerReads`; called with the hidden state
entering layer L's experts (``[T, H]``, before they run), it computes

* ``logits = x @ W_{L+1}^T (+ b)`` (``ktmoe::linear`` when the router was packed by ``pack_linears``),
* the choice score: the logits themselves when the router picks its top-k by softmax or by the raw logits (both
  keep the logits' order: Mixtral, Qwen2/3-MoE, OLMoE, gpt-oss); with an ``e_score_correction_bias`` (DeepSeek-V3
  / V4), ``score_fn(logits) + bias`` with the router's ``score_fn`` (sigmoid where it has none). Group-limited
  selection (DeepSeek-V3's ``n_group`` / ``topk_group``) is **not** applied: a plain top-k' over all experts,
  a superset-leaning guess;
* the top-k' experts of each token (k' = k by default: on a 30B-class model 2k read twice the bytes and decoded
  slower, docs/memory.md), their union over the tokens, and
  ``torch_ktmoe.residency.reads.read_ahead_experts(w13, w2, ids)`` per NUMA part of layer L+1: queued to the reader
  pool's I/O threads, so the disk works while layer L's experts compute. Where the union is at least 3/4 of the
  experts (a prefill, :func:`~.routing.routed_to_most`), layer L+1 is mapped whole instead (``ExpertsDir.stream``,
  what a prefill's forward does without a predictor: docs/memory.md), which reads faster than the pool's pieces. It
  only reads into the page cache: every output is the same with and without it.

A prediction that does not pay is not read: the predicted layer's :class:`~.prediction_gate.PredictionGate` switches
the reads off while the recall of its last predictions is under 1/2 (as many wrong experts read as right ones), still
predicting one forward in a few to measure it, and back on when it recovers.

A prediction is an optimisation: the first time one fails (the read ahead, the stream, a router the host could not
read), it is switched off for that layer with one :class:`NextLayerPrefetchWarning` naming the layers and the
reason; the forward goes on unchanged, and so do later ones, without it.

It runs only while layer L+1 asks for it (:attr:`torch_ktmoe.KTMoE.next_layer_prefetching`: by default
``"auto"``, while its file-backed experts do not fit in memory, the decision of ``prefetch="auto"``; ``True``), never
inside a compiled graph (``torch.compiler.is_compiling()``), and never for a hash-routed layer (DeepSeek-V4's first
layers: their experts follow the token ids, not the hidden state). Cost when on: one ``[T, H] x [H, E]`` product, a
top-k' and a ``unique`` per layer and forward (measured in docs/memory.md).

Recall. The predicted ids wait on layer L+1 (:class:`~.recall.PredictionRecall`); its next forward compares them
with the ids its router actually chose: recall = |predicted ∩ routed| / |routed|, summed over tokens (ids < 0 skipped),
shown by :meth:`torch_ktmoe.KTMoE.residency_stats` and :func:`torch_ktmoe.residency_report`.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import ops
from . import reads
from .routing import routed_to_most

__all__ = ["NextLayerPredictor", "router_refusal", "NextLayerPrefetchWarning", "warn_prefetch_off"]


class NextLayerPrefetchWarning(RuntimeWarning):
    """A next-layer prediction failed and was switched off for that layer; outputs are unchanged."""


def warn_prefetch_off(layer: Optional[int], target: int, error: BaseException, stacklevel: int = 3) -> str:
    """Warns once that ``layer``'s prediction of layer ``target`` is off because of ``error``; returns the reason."""
    reason = f"{type(error).__name__}: {error}"
    where = f"layer {layer}: " if layer is not None else ""
    warnings.warn(f"{where}next-layer prefetch of layer {target} switched off ({reason}); forwards go on without it",
                  NextLayerPrefetchWarning, stacklevel=stacklevel)
    return reason


def router_refusal(router: nn.Module) -> Optional[str]:
    """Why ``router``'s choice cannot be predicted from a hidden state, or None."""
    if hasattr(router, "tid2eid"):
        return "hash-routed: its experts follow the token ids, not the hidden state"
    weight = getattr(router, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.numel() == 0:
        if hasattr(router, "ktmoe_w_packed") or (hasattr(router, "w_packed") and hasattr(router, "out_features")):
            return None
        return f"{type(router).__name__} has no 2-D weight [E, H]"
    return None


class NextLayerPredictor:
    """Predicts the experts of ``target`` (layer L+1's :class:`~.layer_reads.LayerReads`, the ``next`` of layer L's;
    a KTMoE stands for its ``reads``) with ``router`` (layer L+1's router module) from layer L's hidden state and
    reads them ahead; see the module. ``k_prime``: experts predicted per token
    (default k, at most the router's rows). ``id_map`` [router rows] int64: the target's expert of each router
    row, -1 where it holds none (sglang's CPU slots; None: the same ids). ``layer_idx``: the layer it runs in
    (named in the warning when it fails). Called as ``predictor(hidden_states [..., H])``; returns nothing; a
    failure switches it off (:attr:`off`: why) with one :class:`NextLayerPrefetchWarning`."""

    def __init__(self, router: nn.Module, target, k_prime: Optional[int] = None,
                 id_map: Optional[torch.Tensor] = None, layer_idx: Optional[int] = None):
        target = getattr(target, "reads", target)
        reason = router_refusal(router)
        if reason is not None:
            raise ValueError(f"cannot predict layer {target.layer_idx} from {type(router).__name__}: {reason}")
        self.router, self.target, self.id_map, self.layer_idx = router, target, id_map, layer_idx
        self.off: Optional[str] = None  # why a failure switched it off
        k_prime = target.top_k if k_prime is None else int(k_prime)
        if k_prime < 1:
            raise ValueError(f"k_prime must be >= 1, got {k_prime}")
        rows = target.num_experts if id_map is None else id_map.numel()
        self.k_prime = min(k_prime, rows)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T, E]: the router's logits (its packed copy when pack_linears packed it)."""
        r = self.router
        packed = getattr(r, "ktmoe_w_packed", None)
        if packed is not None:  # a transformers router packed by hf.pack_router (it keeps .weight too)
            return ops.linear(x, packed, r.weight.shape[0], None)
        weight = getattr(r, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.numel() == 0:  # a KTLinear router: the module is the linear
            return r(x)
        bias = getattr(r, "bias", None)
        return F.linear(x.to(weight.dtype), weight, bias if isinstance(bias, torch.Tensor) else None)

    def choice(self, logits: torch.Tensor) -> torch.Tensor:
        """The scores the router takes its top-k of (see the module; no group limit)."""
        bias = getattr(self.router, "e_score_correction_bias", None)
        if not isinstance(bias, torch.Tensor):
            return logits  # softmax-then-top-k, top-k-then-softmax and raw logits keep the order
        score_fn = getattr(self.router, "score_fn", torch.sigmoid)
        return score_fn(logits.float()) + bias

    def predict(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [T, k'] the target's expert ids, best first (-1: a router row the target does not hold)."""
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        ids = torch.topk(self.choice(self.logits(x)), self.k_prime, dim=-1).indices
        return ids if self.id_map is None else self.id_map[ids]

    def __call__(self, hidden_states: torch.Tensor) -> None:
        target = self.target
        if (self.off is not None or torch.compiler.is_compiling() or not target.next_layer_prefetching
                or not target.gate.predicts_now()):
            return
        try:
            with torch.no_grad():
                predicted = self.predict(hidden_states)
                if target.gate.reading:  # (else a probe: its recall is measured, nothing read)
                    self._read_ahead(predicted)
        except Exception as e:  # noqa: BLE001 - an optimisation never fails the forward
            self.off = warn_prefetch_off(self.layer_idx, target.layer_idx, e)
            return
        target.recall.expect(predicted)

    def _read_ahead(self, predicted: torch.Tensor) -> None:
        """The predicted experts read into the page cache (a prefill's union: the layer mapped whole)."""
        experts = torch.unique(predicted)
        experts = experts[(experts >= 0) & (experts < self.target.num_experts)]  # LongCat's zero expert, ...
        target = self.target
        most = routed_to_most(target.num_experts, experts)
        if target.gguf is not None:  # a GGUF file's blocks where they lie: WILLNEED over their rows (no arena, no pool)
            if not most:  # (a prefill's layer faults in itself)
                target.gguf.advise(experts)
            return
        if most:  # a prefill's union: map layer L+1 whole
            directory = target.arenas.experts_dir
            if directory is not None:
                directory.stream(target.arenas, target.arenas.file_backed_bytes)
            return
        for w13, w2 in target.packed:
            reads.read_ahead_experts(w13, w2, experts)
