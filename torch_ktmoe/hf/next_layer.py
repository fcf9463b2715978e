"""Next-layer prefetch in a patched transformers model (``attach_next_layer_prefetch``; the loaders call it).

It wires the model's next-layer links: each MoE layer's :class:`~torch_ktmoe.residency.layer_reads.LayerReads` gets
the next MoE layer's in module order as its ``next`` (dense layers in between are skipped; the last MoE layer has
none), which a prefill's streaming of the next layer follows too. Each MoE layer L with a next MoE layer L' gets a
forward pre-hook that hands a hidden state of layer L to a
:class:`torch_ktmoe.residency.predictor.NextLayerPredictor` of L' (L''s router, found beside its experts: the block's
``gate`` / ``router``, else its one child with an [E, H] weight). ``source``:

* ``"experts"`` (default): the hidden state entering L's experts (the post-attention norm's output that L's own
  router saw), on the :class:`~torch_ktmoe.hf.KTMoEExperts` adapter of L; the reads start before L's experts run;
* ``"layer"``: L's decoder-layer input (the residual stream before L's attention), on the decoder layer
  ``...layers.N`` holding the adapter; the reads start one attention earlier, from a state one attention and one
  norm further from what L' routes on.

A failed prediction switches itself off for L with one warning, never failing or changing a forward
(:class:`~torch_ktmoe.residency.predictor.NextLayerPredictor`). The predictor runs only while L''s KTMoE asks for it (``next_layer_prefetch``: ``"auto"``, the default, while its
file-backed experts do not fit in memory, ``True`` always, ``False`` never). Attaching again replaces the hooks. Returns ``(predicted, left)``: the
``layer_idx`` of each layer whose experts are predicted, and ``{layer_idx: why not}`` for the others but the first.
"""
from __future__ import annotations

import re

import torch
import torch.nn as nn

from ..linear import KTLinear
from ..residency.predictor import NextLayerPredictor, router_refusal
from .experts import KTMoEExperts

__all__ = ["attach_next_layer_prefetch", "find_router", "SOURCES"]

SOURCES = ("experts", "layer")
_LAYER = re.compile(r"^(.*(?:^|\.)layers\.\d+)(?:\.|$)")


def _router_rows(child: nn.Module) -> int | None:
    if isinstance(child, KTLinear):
        return child.out_features
    weight = getattr(child, "weight", None)
    return weight.shape[0] if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None


def find_router(model: nn.Module, adapter_name: str, num_experts: int) -> tuple[nn.Module | None, str]:
    """The router beside the experts ``adapter_name`` (its parent's ``gate`` / ``router``, else the one child with
    E or E + 1 output rows), or (None, why not)."""
    parent_name, _, own = adapter_name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    for attr in ("gate", "router"):
        child = getattr(parent, attr, None)
        if isinstance(child, nn.Module) and _router_rows(child) in (num_experts, num_experts + 1):
            return child, ""
    found = [c for n, c in parent.named_children() if n != own and _router_rows(c) in (num_experts, num_experts + 1)]
    if len(found) == 1:
        return found[0], ""
    return None, f"{len(found)} children of {parent_name or 'the model'} look like its router"


class _PredictHook:
    """A forward pre-hook handing the module's hidden state (first argument or ``hidden_states=``) to a predictor."""

    def __init__(self, predictor: NextLayerPredictor):
        self.predictor = predictor

    def __call__(self, module, args, kwargs):
        x = args[0] if args else kwargs.get("hidden_states")
        if isinstance(x, torch.Tensor):
            self.predictor(x)
        return None


def _source_module(model: nn.Module, adapter_name: str, source: str) -> tuple[nn.Module | None, str]:
    if source == "experts":
        return model.get_submodule(adapter_name), ""
    match = _LAYER.match(adapter_name)
    if match is None:
        return None, f"{adapter_name} is not inside a decoder layer (...layers.N)"
    return model.get_submodule(match.group(1)), ""


def attach_next_layer_prefetch(model: nn.Module, *, k_prime: int | None = None,
                               source: str = "experts") -> tuple[list[int], dict[int, str]]:
    """Wire next-layer prefetch through ``model``'s patched MoE layers (see the module). ``k_prime``: experts
    predicted per token (default k of the predicted layer)."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    for m in model.modules():  # attaching again replaces the hooks
        for key in [k for k, h in m._forward_pre_hooks.items() if isinstance(h, _PredictHook)]:
            del m._forward_pre_hooks[key]
            m._forward_pre_hooks_with_kwargs.pop(key, None)
    adapters = [(n, m) for n, m in model.named_modules() if isinstance(m, KTMoEExperts) and m.ktmoe is not None]
    for (_, adapter), following in zip(adapters, [m for _, m in adapters[1:]] + [None]):
        adapter.ktmoe.reads.link(following.ktmoe.reads if following is not None else None)
    predicted, left = [], {}
    for (name, adapter), (next_name, following) in zip(adapters, adapters[1:]):
        target = following.ktmoe
        reason = "next_layer_prefetch=False" if target.next_layer_prefetch_mode is False else ""
        router = None
        if not reason:
            router, reason = find_router(model, next_name, target.num_experts)
        if not reason:
            reason = router_refusal(router) or ""
        module = None
        if not reason:
            module, reason = _source_module(model, name, source)
        if reason:
            left[following.layer_idx] = reason
            continue
        hook = _PredictHook(NextLayerPredictor(router, adapter.ktmoe.reads.next, k_prime,
                                               layer_idx=adapter.ktmoe.layer_idx))
        module.register_forward_pre_hook(hook, with_kwargs=True)
        predicted.append(following.layer_idx)
    return predicted, left
