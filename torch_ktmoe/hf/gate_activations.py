"""Which row of the gated activation table an experts class's ``_apply_gate`` computes.

[NOTE] Gated activations of transformers' experts classes
---------------------------------------------------------
``@use_experts_implementation`` calls ``module._apply_gate(gate_up [N, 2I]) -> [N, I]`` between the
projections; the default is ``act_fn(gate) * up``. Newer families override it:

============================================  ====================  ==========================================
classes                                       row                   parameters, read from the module
============================================  ====================  ==========================================
DeepseekV4Experts                             ``silu_clamp``        limit = ``limit``
Glm5NextTextExperts, HYV4Experts, HYV4VL...   ``silu_clamp``        limit = ``swiglu_limit``
Step3p7Experts, BailingHybridExperts          ``silu_clamp_after``  limit = ``limit`` (per layer; None: ``silu``)
MiniMaxM3VLExperts                            ``swiglu_oai``        alpha = ``swiglu_alpha``, limit = ``swiglu_limit``
Inkling2Experts, Inkling2LoopExperts          ``swiglu_softcap``    the softcaps of ``act_fn``
BeamExperts                                   ``silu``              (computed in fp32, as the kernels do)
============================================  ====================  ==========================================

The table names the row; :func:`gate_activation` then checks it against the module itself: its
``_apply_gate`` runs on a fixed fp32 probe (values past the limits and caps) and must agree with
:func:`torch_ktmoe.reference.gated_activation` of the row, so a release that changes a class's gate
is refused, not run wrong. The probe needs no weights (meta modules work) and is fp32 on the CPU under any
default dtype (transformers' ``local_torch_dtype`` while a model is built) or device context (``torch.device("meta")``).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn

from ..ops import GATED_ACTIVATIONS, activation_params
from ..reference import gated_activation

__all__ = ["gate_activation", "GATE_ACTIVATION_CLASSES"]


def _silu_clamp(limit_attr: str):
    return lambda m: ("silu_clamp", {"limit": getattr(m, limit_attr)})


def _silu_clamp_after(m):  # a per-layer limit, None where the config disables it
    return ("silu", {}) if m.limit is None else ("silu_clamp_after", {"limit": m.limit})


def _softcapped(m):
    return "swiglu_softcap", {"gate_softcap": m.act_fn.gate_softcap.softcap, "up_softcap": m.act_fn.up_softcap.softcap}


# experts class -> (module -> (row name, its parameters by name))
GATE_ACTIVATION_CLASSES: dict[str, Callable[[nn.Module], tuple[str, dict]]] = {
    "DeepseekV4Experts": _silu_clamp("limit"),
    "Glm5NextTextExperts": _silu_clamp("swiglu_limit"),
    "HYV4Experts": _silu_clamp("swiglu_limit"),
    "HYV4VLExperts": _silu_clamp("swiglu_limit"),
    "Step3p7Experts": _silu_clamp_after,
    "BailingHybridExperts": _silu_clamp_after,
    "MiniMaxM3VLExperts": lambda m: ("swiglu_oai", {"alpha": m.swiglu_alpha, "limit": m.swiglu_limit}),
    "Inkling2Experts": _softcapped,
    "Inkling2LoopExperts": _softcapped,
    "BeamExperts": lambda m: ("silu", {}),
}

_PROBE_COLUMNS = 64


def _probe(scale: float) -> torch.Tensor:
    """gate_up [64, 128] fp32 on the CPU (whatever torch's default dtype and device): a grid over ±3·scale in the
    gate half, Gaussian·2·scale in the up half."""
    fp32 = dict(dtype=torch.float32, device="cpu")
    gen = torch.Generator().manual_seed(0)
    grid = torch.linspace(-3 * scale, 3 * scale, _PROBE_COLUMNS, **fp32).expand(_PROBE_COLUMNS, -1)
    gate = grid + torch.randn(_PROBE_COLUMNS, _PROBE_COLUMNS, generator=gen, **fp32) * 0.1 * scale
    up = torch.randn(_PROBE_COLUMNS, _PROBE_COLUMNS, generator=gen, **fp32) * 2 * scale
    return torch.cat([gate, up], -1)


def gate_activation(module: nn.Module) -> tuple[Optional[tuple[str, dict]], Optional[str]]:
    """((row, parameters by name), None) for a class of :data:`GATE_ACTIVATION_CLASSES` whose
    ``_apply_gate`` computes that row, else (None, the reason)."""
    name = type(module).__name__
    try:
        activation, params = GATE_ACTIVATION_CLASSES[name](module)
        values = activation_params(activation, {k: float(v) for k, v in params.items()})
    except (AttributeError, TypeError, ValueError) as e:
        return None, f"{name}: cannot read its gated activation's parameters ({e})"
    named = dict(zip(GATED_ACTIVATIONS[activation]["params"], values))
    scale = max([abs(v) for v in values] + [4.0])
    gate_up = _probe(scale)
    with torch.no_grad(), torch.device("cpu"):  # inside a meta-device context too: what the gate makes is CPU
        try:
            got = module._apply_gate(gate_up).float()
        except Exception as e:  # noqa: BLE001 - any failure means we cannot vouch for it
            return None, f"{name}: its _apply_gate failed on a probe ({type(e).__name__}: {e})"
        want = gated_activation(*gate_up.chunk(2, -1), activation, named)
    if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-5 * scale * scale):
        diff = (got - want).abs().max().item() if got.shape == want.shape else f"shape {tuple(got.shape)}"
        return None, (f"{name} overrides _apply_gate with a gated activation that is not {activation} "
                      f"{named} (max difference on a probe: {diff})")
    return (activation, named), None
