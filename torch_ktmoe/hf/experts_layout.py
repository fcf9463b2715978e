"""How a transformers experts module stores its dense experts, and the mapping to and from KTMoE's.

[NOTE] Layouts
--------------
KTMoE packs ``gate [E, I, H]``, ``up [E, I, H]`` and ``down [E, H, I]`` (rows are output
features) and, optionally, ``gate_up_bias [E, 2I]`` (gate, then up) and ``down_bias [E, H]``.
transformers 5.x experts classes describe their own storage with the flags of
``@use_experts_implementation`` (set on every instance):

* ``is_transposed``: ``gate_up_proj [E, H, 2I]`` / ``down_proj [E, I, H]`` (inputs first)
  instead of ``[E, 2I, H]`` / ``[E, H, I]``;
* ``is_concatenated=False``: gate and up alternate along 2I (gate = ``0::2``, up = ``1::2``)
  instead of all gate rows first;
* ``has_bias``: ``gate_up_proj_bias [E, 2I]`` (same order along 2I) and ``down_proj_bias [E, H]``.

The first two are a :class:`torch_ktmoe.checkpoint.FusedLayout` (checkpoints store fused
tensors the same way); :class:`ExpertsLayout` adds the biases and the activation.
gpt-oss (``GptOssExperts``) is transposed, interleaved and biased, and its ``_apply_gate`` is a
clamped SwiGLU (KTMoE's ``activation="swiglu_oai"`` with the module's ``alpha`` / ``limit``); other
classes' gates are rows of the same table (:mod:`.gate_activations`).
:class:`ExpertsLayout` turns either layout into KTMoE's with views (packing reads strided
tensors) and back (``state_dict`` / ``save_pretrained`` write the class's own layout).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checkpoint import FusedLayout


@dataclass(frozen=True)
class ExpertsLayout(FusedLayout):
    biases: bool = False  # gate_up_proj_bias [E, 2I], down_proj_bias [E, H]
    activation: str = "silu"  # KTMoE's activation=
    activation_params: tuple[tuple[str, float], ...] = ()  # KTMoE's activation_params=, as (name, value) pairs

    def ktmoe_kwargs(self) -> dict:
        """The KTMoE constructor arguments of this activation."""
        if self.activation == "silu":
            return {}
        return dict(activation=self.activation, activation_params=dict(self.activation_params))

    def shapes(self, E: int, H: int, I: int) -> dict[str, tuple[int, ...]]:
        """The dense parameters' shapes in this layout."""
        out = super().shapes(E, H, I)
        if self.biases:
            out.update(gate_up_proj_bias=(E, 2 * I), down_proj_bias=(E, H))
        return out

    def gate_up_bias(self, gate_up_proj_bias: torch.Tensor) -> torch.Tensor:
        """gate_up_proj_bias [E, 2I] in this layout's order -> [E, 2I] gate then up (a copy)."""
        if not self.interleaved:
            return gate_up_proj_bias
        return torch.cat([gate_up_proj_bias[..., 0::2], gate_up_proj_bias[..., 1::2]], -1)


SILU_CONCATENATED = ExpertsLayout()


def gpt_oss_layout(module) -> ExpertsLayout:
    """gpt-oss: transposed, interleaved, biased, clamped SwiGLU with the module's constants."""
    return ExpertsLayout(transposed=True, interleaved=True, biases=True, activation="swiglu_oai",
                         activation_params=(("alpha", float(module.alpha)), ("limit", float(module.limit))))


def flags_layout(module, activation: str = "silu", params: dict | None = None) -> ExpertsLayout:
    """The storage flags of a ``@use_experts_implementation`` module, with its gated activation."""
    return ExpertsLayout(transposed=bool(getattr(module, "is_transposed", False)),
                         interleaved=not getattr(module, "is_concatenated", True),
                         biases=bool(getattr(module, "has_bias", False)), activation=activation,
                         activation_params=tuple((params or {}).items()))
