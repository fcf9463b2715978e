"""KTMoE in place of a Hugging Face transformers 5.x experts block.

[NOTE] How transformers 5.x runs the experts of an MoE layer
------------------------------------------------------------
Every MoE block (``MixtralSparseMoeBlock``, ``Qwen2MoeSparseMoeBlock``,
``Qwen3MoeSparseMoeBlock``, ``OlmoeSparseMoeBlock``, ``DeepseekV3MoE``) owns a
router (``.gate``) and an experts module (``.experts``) and calls::

    hidden = self.experts(hidden_states_2d, top_k_index, top_k_weights)   # [T,H], [T,k] int64, [T,k] -> [T,H]

The experts module (``MixtralExperts``, ``Qwen2MoeExperts``, ``Qwen3MoeExperts``,
``OlmoeExperts``, ``DeepseekV3Experts``) holds two 3-D parameters,
``gate_up_proj [E, 2I, H]`` (gate rows, then up rows) and ``down_proj [E, H, I]``,
and computes ``sum_j w[t,j] * down_e(act(gate_e(x)) * up_e(x))`` -- exactly the
KTMoE forward when ``act`` is SiLU. The class is wrapped by
``@use_experts_implementation``, whose ``forward`` looks up
``config._experts_implementation`` in ``transformers.integrations.moe.ExpertsInterface``
(``"eager"``, ``"batched_mm"``, ``"grouped_mm"`` -- the default on CPU --, ...)
and calls ``fn(experts_module, hidden_states, top_k_index, top_k_weights)``.
Routing (softmax/sigmoid, grouped top-k, normalisation, scaling), shared experts
and ``shared_expert_gate`` stay in the MoE block and are not touched here.

Two ways in:

* :class:`KTMoEExperts` replaces the experts module (``torch_ktmoe.hf.patch_model``
  / ``torch_ktmoe.hf.from_pretrained``); the dense parameters are dropped.
* the experts implementation ``"ktmoe"`` (:func:`register_experts_implementation`):
  ``model.set_experts_implementation("ktmoe")`` keeps the dense parameters and packs
  each experts module into a KTMoE on its first call (a switchable, memory-hungry
  path: dense + packed copies both live).

gpt-oss (``GptOssExperts``) is refused: its gate/up columns are interleaved, its
experts have biases and its activation is a clamped SwiGLU
(``(clamp(up)+1) * g*sigmoid(1.702 g)``, ``g = clamp(gate, max=7)``), none of
which the KTMoE kernels compute.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn as nn

__all__ = [
    "KTMoEExperts",
    "SUPPORTED_EXPERTS_CLASSES",
    "UnsupportedExpertsError",
    "unsupported_reason",
    "looks_like_experts",
    "experts_dims",
    "ktmoe_experts_forward",
    "register_experts_implementation",
    "configure_experts_implementation",
]

# Experts classes of transformers 5.x validated against the KTMoE semantics
# (fused [E,2I,H] gate_up_proj with gate rows first, [E,H,I] down_proj, no bias, SiLU).
SUPPORTED_EXPERTS_CLASSES = frozenset(
    {"MixtralExperts", "Qwen2MoeExperts", "Qwen3MoeExperts", "OlmoeExperts", "DeepseekV3Experts"}
)

_KNOWN_REFUSALS = {
    "GptOssExperts": (
        "gpt-oss experts store gate/up interleaved and transposed ([E, H, 2I], gate=cols 0::2, up=cols 1::2), "
        "add per-expert biases and use a clamped SwiGLU ((clamp(up,-7,7)+1) * g*sigmoid(1.702*g), "
        "g=clamp(gate,max=7)); KTMoE computes down(silu(gate)*up) without biases, so it cannot run them exactly"
    ),
}


class UnsupportedExpertsError(TypeError):
    """An experts block KTMoE cannot replace exactly."""


def _ktmoe_cls():
    import torch_ktmoe

    return torch_ktmoe.KTMoE


def looks_like_experts(name: str, module: nn.Module) -> bool:
    """True for anything that is (or appears to be) the experts block of an MoE layer."""
    if isinstance(module, KTMoEExperts):
        return False
    if hasattr(module, "is_concatenated") and hasattr(module, "has_gate"):  # @use_experts_implementation
        return True
    if isinstance(getattr(module, "gate_up_proj", None), torch.Tensor) and getattr(module, "gate_up_proj").dim() == 3:
        return True
    if type(module).__name__.endswith("Experts"):
        return True
    # legacy layout: an nn.ModuleList of per-expert MLPs called "experts"
    return isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] == "experts"


def _is_silu(act) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


def experts_dims(module: nn.Module) -> tuple[int, int, int]:
    """(num_experts, hidden_size, intermediate_size) from the parameter shapes (meta tensors are fine)."""
    E, two_i, H = module.gate_up_proj.shape
    return int(E), int(H), int(two_i) // 2


def unsupported_reason(module: nn.Module) -> str | None:
    """None if ``module`` can be replaced by KTMoE exactly, else a sentence saying why not."""
    cls = type(module)
    name = cls.__name__
    if name in _KNOWN_REFUSALS:
        return _KNOWN_REFUSALS[name]
    if name not in SUPPORTED_EXPERTS_CLASSES or not cls.__module__.startswith("transformers.models."):
        return (
            f"{cls.__module__}.{name} is not one of the experts classes validated for KTMoE "
            f"({', '.join(sorted(SUPPORTED_EXPERTS_CLASSES))} from transformers.models)"
        )
    gu, dn = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(gu, torch.Tensor) or not isinstance(dn, torch.Tensor) or gu.dim() != 3 or dn.dim() != 3:
        return f"{name} has no 3-D gate_up_proj/down_proj parameters (quantized or otherwise modified module?)"
    E, two_i, H = gu.shape
    if two_i % 2 or tuple(dn.shape) != (E, H, two_i // 2):
        return f"{name}: unexpected shapes gate_up_proj {tuple(gu.shape)}, down_proj {tuple(dn.shape)}"
    flags = {
        "has_gate": True,
        "is_concatenated": True,
        "is_transposed": False,
        "has_bias": False,
        "has_post_expert_norm": False,
    }
    for flag, want in flags.items():
        if getattr(module, flag, want) != want:
            return f"{name}: {flag}={getattr(module, flag)!r}, KTMoE needs {want!r}"
    if getattr(module, "gate_up_proj_bias", None) is not None or getattr(module, "down_proj_bias", None) is not None:
        return f"{name} has expert biases"
    if not _is_silu(getattr(module, "act_fn", None)):
        return f"{name}: activation {type(getattr(module, 'act_fn', None)).__name__} is not SiLU"
    apply_gate = getattr(cls, "_apply_gate", None)  # the decorator installs _default_apply_gate
    if apply_gate is not None and getattr(apply_gate, "__name__", "") != "_default_apply_gate":
        return f"{name} overrides _apply_gate (custom gating)"
    top_k = getattr(getattr(module, "config", None), "num_experts_per_tok", None)
    if not isinstance(top_k, int) or top_k < 1:
        return f"{name}: cannot read num_experts_per_tok from its config"
    return None


class KTMoEExperts(nn.Module):
    """Replaces a transformers experts module; same call signature and semantics.

    ``forward(hidden_states [T,H], top_k_index [T,k] int, top_k_weights [T,k]) -> [T,H]``
    in the dtype of ``hidden_states``. Routing weights are handed to KTMoE in fp32
    (the eager reference multiplies in the promoted dtype, which is fp32 for the
    Mixtral and DeepSeek-V3 routers anyway).

    ``ktmoe`` is ``None`` while :func:`torch_ktmoe.hf.from_pretrained` is still
    streaming weights; calling it then raises.
    """

    def __init__(
        self,
        ktmoe: nn.Module | None,
        *,
        num_experts: int,
        hidden_dim: int,
        intermediate_dim: int,
        top_k: int,
        layer_idx: int,
        replaced_class: str,
    ):
        super().__init__()
        self.num_experts = num_experts
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.top_k = top_k
        self.layer_idx = layer_idx
        self.replaced_class = replaced_class
        self.ktmoe = ktmoe

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        if self.ktmoe is None:
            raise RuntimeError(f"KTMoEExperts (layer {self.layer_idx}): expert weights were never loaded")
        return self.ktmoe(hidden_states, top_k_index, top_k_weights.to(torch.float32))

    def extra_repr(self) -> str:
        return (
            f"replaces={self.replaced_class}, layer_idx={self.layer_idx}, num_experts={self.num_experts}, "
            f"top_k={self.top_k}, hidden_dim={self.hidden_dim}, intermediate_dim={self.intermediate_dim}"
        )


# ---------------------------------------------------------------------------------------------
# experts implementation "ktmoe"
# ---------------------------------------------------------------------------------------------

_IMPL_OPTIONS: dict = {"weight_format": "bf16", "mmap_experts_dir": None}
_IMPL_LAYER_IDS = itertools.count()


def configure_experts_implementation(*, weight_format: str = "bf16", mmap_experts_dir=None, **ktmoe_kwargs) -> None:
    """KTMoE constructor options used by the ``"ktmoe"`` experts implementation for modules packed from now on."""
    _IMPL_OPTIONS.clear()
    _IMPL_OPTIONS.update(weight_format=weight_format, mmap_experts_dir=mmap_experts_dir, **ktmoe_kwargs)


@dataclass
class _Packed:
    ktmoe: nn.Module


@torch.compiler.disable
@torch.no_grad()
def _pack_experts_module(module: nn.Module) -> nn.Module:
    reason = unsupported_reason(module)
    if reason is not None:
        raise UnsupportedExpertsError(f'experts_implementation="ktmoe": {reason}')
    E, H, I = experts_dims(module)
    ktm = _ktmoe_cls()(E, module.config.num_experts_per_tok, H, I, layer_idx=next(_IMPL_LAYER_IDS), **_IMPL_OPTIONS)
    ktm.load_weights(module.gate_up_proj.detach(), module.down_proj.detach())
    # kept in __dict__, not as a submodule: not in state_dict(), not touched by .to()/save_pretrained
    module.__dict__["_ktmoe_packed"] = _Packed(ktm)
    return ktm


def ktmoe_experts_forward(
    self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """``ExpertsInterface`` entry ``"ktmoe"``: packs ``self``'s dense weights on the first call, then runs KTMoE.

    The dense parameters stay (so the model can switch back to ``"eager"``/``"grouped_mm"``);
    the packed copy is not refreshed if they change afterwards -- delete
    ``module.__dict__["_ktmoe_packed"]`` to repack.
    """
    packed = self.__dict__.get("_ktmoe_packed")
    ktm = packed.ktmoe if packed is not None else _pack_experts_module(self)
    return ktm(hidden_states, top_k_index, top_k_weights.to(torch.float32))


def register_experts_implementation(name: str = "ktmoe") -> None:
    """Register ``name`` in transformers' ``ExpertsInterface`` (idempotent)."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(name, ktmoe_experts_forward)
