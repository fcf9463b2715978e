"""A transformers router's logits through ktmoe's bf16 gemm (``pack_router``; ``pack_linears`` calls it).

transformers 5's MoE routers (``*TopKRouter``) are not ``nn.Linear``: they hold ``weight`` [E, H] and call
``F.linear(hidden_states, self.weight)`` inside their own ``forward``. At decode that is torch's bf16 GEMV:
~0.2 ms a layer for a 0.5 MB weight, where ktmoe's gemm reads it in ~0.03 ms.

A router whose ``forward`` has *the same source* as one of the reference routers below (transformers
copies one router into many families: Qwen2/3-MoE, OLMoE, FlexOlmo, Qwen3-Next, Qwen3-Omni, ...) gets
the matching forward here: the same selection, with the logits from ``ktmoe::linear`` over a packed
copy of the weight. ``tests/test_packed_router.py`` checks each against its reference class. The
router keeps its module and its ``weight`` parameter (``state_dict`` unchanged); loading a state dict
into it packs the new weight again. Any other router is left as it is.

    hidden [..., H] -> (logits [T, E] in hidden's dtype, scores [T, top_k] in logits' dtype, indices [T, top_k])
"""
from __future__ import annotations

import functools
import importlib
import inspect

import torch
import torch.nn as nn

from .. import ops
from .vocabulary import DENSE_DTYPES

__all__ = ["pack_router", "is_packed_router", "router_refusal", "REFERENCE_ROUTERS"]


def _softmax_topk(self, hidden_states, always_normalise: bool):
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = ops.linear(hidden_states, self.ktmoe_w_packed, self.num_experts, None)
    router_probs = torch.softmax(router_logits, dtype=torch.float, dim=-1)
    router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
    if always_normalise or self.norm_topk_prob:
        router_top_value = router_top_value / router_top_value.sum(dim=-1, keepdim=True)
    return router_logits, router_top_value.to(router_logits.dtype), router_indices


def _softmax_topk_by_flag(self, hidden_states):  # Qwen3MoeTopKRouter
    return _softmax_topk(self, hidden_states, False)


def _softmax_topk_normalised(self, hidden_states):  # Qwen3_5MoeTopKRouter
    return _softmax_topk(self, hidden_states, True)


# (transformers module, class): the forward computing the same thing with packed logits
REFERENCE_ROUTERS = {
    ("transformers.models.qwen3_moe.modeling_qwen3_moe", "Qwen3MoeTopKRouter"): _softmax_topk_by_flag,
    ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "Qwen3_5MoeTopKRouter"): _softmax_topk_normalised,
}


@functools.cache
def _reference_sources() -> dict[str, object]:
    """{reference forward's source: our forward}, for the reference routers this transformers has."""
    sources = {}
    for (module, name), forward in REFERENCE_ROUTERS.items():
        try:
            sources[inspect.getsource(getattr(importlib.import_module(module), name).forward)] = forward
        except (ImportError, AttributeError, OSError, TypeError):
            continue
    return sources


@functools.cache
def _packed_forward(cls: type):
    """Our forward for router class ``cls`` (its forward's source is a reference router's), or None."""
    try:
        return _reference_sources().get(inspect.getsource(cls.forward))
    except (OSError, TypeError, AttributeError):
        return None


def router_refusal(router: nn.Module) -> str | None:
    """Why ``router``'s logits cannot run packed, or None."""
    weight = getattr(router, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return "no 2-D weight"
    if weight.device.type != "cpu" or weight.dtype not in DENSE_DTYPES:
        return f"weight {weight.dtype} on {weight.device} (packs fp32 / bf16 / fp16 on the CPU)"
    if _packed_forward(type(router)) is None:
        return f"its forward is none of the reference routers' ({', '.join(n for _, n in REFERENCE_ROUTERS)})"
    return None


def is_packed_router(router: nn.Module) -> bool:
    """Whether :func:`pack_router` has packed ``router``."""
    return isinstance(getattr(router, "forward", None), _PackedForward)


def _repack_after_load(router: nn.Module, incompatible_keys) -> None:
    router.ktmoe_w_packed = ops.pack_linear(router.weight.detach())


class _PackedForward:
    """``router.forward``: our forward bound to the router (an object, not a bound method, so that pickling
    the router keeps it: a bound method pickles as a lookup of its function's name on the router)."""

    def __init__(self, router: nn.Module, forward):
        self.router, self.forward = router, forward

    def __call__(self, hidden_states):
        return self.forward(self.router, hidden_states)


def pack_router(router: nn.Module) -> None:
    """Make ``router`` compute its logits with ``ktmoe::linear`` (see the module docstring). Raises
    ValueError naming the reason (:func:`router_refusal`) for a router it cannot pack; a packed router stays
    as it is."""
    if is_packed_router(router):
        return
    reason = router_refusal(router)
    if reason is not None:
        raise ValueError(f"cannot pack the router {type(router).__name__}: {reason}")
    router.register_buffer("ktmoe_w_packed", ops.pack_linear(router.weight.detach()), persistent=False)
    router.register_load_state_dict_post_hook(_repack_after_load)
    router.forward = _PackedForward(router, _packed_forward(type(router)))
