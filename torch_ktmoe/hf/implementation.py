"""The experts implementation ``"ktmoe"`` of transformers' ``ExpertsInterface``.

``model.set_experts_implementation("ktmoe")`` (or ``from_pretrained(...,
experts_implementation="ktmoe")``) runs every experts module through
:func:`ktmoe_experts_forward`: on its first call the module's dense experts are packed into a
KTMoE kept in the module's ``__dict__``, then its dense parameters are released
(``keep_dense`` keeps them). Options: :func:`configure_experts_implementation` or the
``KTMOE_*`` environment variables (:data:`ENV_OPTIONS`). ``torch_ktmoe.hf`` registers the
name on import.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import torch
import torch.nn as nn

from ..checkpoint import make_ktmoe
from ..memory import release_free_heap
from .experts import (
    UnsupportedExpertsError,
    dense_experts,
    experts_dims,
    layout_of,
    pack_dense_experts,
    sync_biases,
    unpacking_enabled,
    unsupported_reason,
)

__all__ = [
    "ENV_OPTIONS",
    "configure_experts_implementation",
    "implementation_options",
    "ktmoe_experts_forward",
    "register_experts_implementation",
]

_IMPL_OPTIONS: dict = {}  # set by configure_experts_implementation; else the KTMOE_* environment variables
_IMPL_LAYER_IDS = itertools.count()
ENV_OPTIONS = {  # environment variable -> KTMoE option, for the "ktmoe" experts implementation
    "KTMOE_WEIGHT_FORMAT": "weight_format",
    "KTMOE_MMAP_EXPERTS_DIR": "mmap_experts_dir",
    "KTMOE_CACHE": "cache",
    "KTMOE_KEEP_DENSE": "keep_dense",
}


def configure_experts_implementation(*, weight_format: str = "bf16", mmap_experts_dir=None, keep_dense: bool = False,
                                     **ktmoe_kwargs) -> None:
    """KTMoE options of the ``"ktmoe"`` experts implementation, for modules packed from now on.

    Overrides the environment variables (``KTMOE_WEIGHT_FORMAT``, ``KTMOE_MMAP_EXPERTS_DIR``,
    ``KTMOE_CACHE``, ``KTMOE_KEEP_DENSE=1``). ``keep_dense=True`` keeps the dense parameters
    after packing (so the model can switch back to ``"eager"``), at the cost of both copies.
    """
    _IMPL_OPTIONS.clear()
    _IMPL_OPTIONS.update(weight_format=weight_format, mmap_experts_dir=mmap_experts_dir, keep_dense=keep_dense,
                         **ktmoe_kwargs)


def implementation_options() -> dict:
    """The options the next ``"ktmoe"`` packing uses: configure_experts_implementation's, else the environment's."""
    if _IMPL_OPTIONS:
        return dict(_IMPL_OPTIONS)
    opts = {"weight_format": "bf16", "mmap_experts_dir": None, "keep_dense": False}
    for var, key in ENV_OPTIONS.items():
        value = os.environ.get(var)
        if value:
            opts[key] = value.strip().lower() in ("1", "true", "yes") if key == "keep_dense" else value
    return opts


@dataclass
class _Packed:
    ktmoe: nn.Module
    implementation: str = "ktmoe"  # the name it was packed under (config._experts_implementation)


def _freed_state_dict_hook(module, state_dict, prefix, local_metadata):
    # the dense parameters were released after packing: state_dict / save_pretrained unpack them again
    packed = module.__dict__.get("_ktmoe_packed")
    if unpacking_enabled() and packed is not None and module.gate_up_proj.numel() == 0:
        gate_up, down = layout_of(module).join(*dense_experts(packed.ktmoe, module.gate_up_proj.dtype))
        state_dict[prefix + "gate_up_proj"] = gate_up
        state_dict[prefix + "down_proj"] = down


def _released_experts_guard(module, args):
    # a forward pre-hook of a module whose dense experts were released: any other implementation would read
    # the empty parameters (transformers' eager / batched_mm / grouped_mm end in an IndexError)
    packed = getattr(module.__dict__.get("_ktmoe_packed"), "implementation", "ktmoe")
    current = module.config._experts_implementation
    if current != packed and module.gate_up_proj.numel() == 0:
        raise RuntimeError(
            f"{type(module).__name__}: experts_implementation={current!r} needs the dense experts, which "
            f"experts_implementation={packed!r} released after packing them (keep_dense=False); to switch back, "
            f"pack with keep_dense=True (configure_experts_implementation(keep_dense=True) or KTMOE_KEEP_DENSE=1) "
            f"or reload the model")


@torch.compiler.disable
@torch.no_grad()
def _pack_experts_module(module: nn.Module) -> nn.Module:
    reason = unsupported_reason(module)
    if reason is not None:
        raise UnsupportedExpertsError(f'experts_implementation="ktmoe": {reason}')
    E, H, I = experts_dims(module)
    opts = implementation_options()
    keep_dense = opts.pop("keep_dense")
    layout = layout_of(module)
    ktm = make_ktmoe(E, module.config.num_experts_per_tok, H, I, layer_idx=next(_IMPL_LAYER_IDS),
                     **layout.ktmoe_kwargs(), **opts)
    pack_dense_experts(ktm, layout, module.gate_up_proj.detach(), module.down_proj.detach())
    # kept in __dict__, not as a submodule: not in state_dict(), not touched by .to()/save_pretrained
    module.__dict__["_ktmoe_packed"] = _Packed(ktm, module.config._experts_implementation)
    if not keep_dense:  # the packed copy replaces the dense one; state_dict() unpacks on demand
        for p in (module.gate_up_proj, module.down_proj):
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        module.register_state_dict_post_hook(_freed_state_dict_hook)
        module.register_forward_pre_hook(_released_experts_guard)
        release_free_heap()
    return ktm


def ktmoe_experts_forward(
    self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """``ExpertsInterface`` entry ``"ktmoe"``: packs ``self``'s dense weights on the first call, then runs KTMoE.

    After packing, the dense parameters are released (their ``.data`` becomes empty;
    ``state_dict()``/``save_pretrained`` unpack the experts again), so the model ends
    with one, packed copy of its experts. Options: :func:`configure_experts_implementation`
    or the ``KTMOE_*`` environment variables (:data:`ENV_OPTIONS`); with
    ``keep_dense`` the dense parameters stay (the model can switch back to
    ``"eager"``/``"grouped_mm"``) and the packed copy is not refreshed if they change
    -- delete ``module.__dict__["_ktmoe_packed"]`` to repack. Without it, switching back
    raises a RuntimeError that says so (instead of transformers' IndexError on the empty
    parameters).
    """
    packed = self.__dict__.get("_ktmoe_packed")
    if packed is None and self.gate_up_proj.numel() == 0:
        raise RuntimeError(f"{type(self).__name__}: its dense experts were released and it has no packed copy")
    ktm = packed.ktmoe if packed is not None else _pack_experts_module(self)
    if getattr(self, "has_bias", False):  # the biases stay the module's own (small) parameters
        sync_biases(ktm, layout_of(self), self.gate_up_proj_bias, self.down_proj_bias)
    return ktm(hidden_states, top_k_index, top_k_weights)


def register_experts_implementation(name: str = "ktmoe") -> None:
    """Register ``name`` in transformers' ``ExpertsInterface`` (idempotent)."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(name, ktmoe_experts_forward)
