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
* the experts implementation ``"ktmoe"`` (:mod:`.implementation`):
  ``model.set_experts_implementation("ktmoe")`` packs each experts module into a KTMoE
  on its first call and then releases its dense parameters (``keep_dense`` keeps them,
  so the model can switch back, at the cost of both copies).

Either way ``state_dict()`` (so ``save_pretrained``) unpacks the experts again under the
replaced module's keys: bf16 exactly, int8 / int4 dequantized with a warning, fp32 / fp16 experts as
their bf16-rounded values with a warning.

gpt-oss (``GptOssExperts``) stores its experts transposed, with gate/up interleaved and
with biases, and gates with a clamped SwiGLU: :mod:`.experts_layout` maps that layout to
KTMoE's (``activation="swiglu_oai"``, biases kept as the adapter's own parameters, under
the replaced module's keys). Every other experts class is refused with a reason
(:func:`unsupported_reason`).
"""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn as nn

from ..unpack import unpack_experts
from .experts_layout import SILU_CONCATENATED, ExpertsLayout, flags_layout, gpt_oss_layout
from .gate_activations import GATE_ACTIVATION_CLASSES, gate_activation

__all__ = [
    "KTMoEExperts",
    "SUPPORTED_EXPERTS_CLASSES",
    "UnsupportedExpertsError",
    "unsupported_reason",
    "looks_like_experts",
    "experts_dims",
    "dense_experts",
    "unpacking_disabled",
    "unpacking_enabled",
    "layout_of",
    "pack_dense_experts",
    "sync_biases",
]

# Experts classes of transformers 5.x validated against the KTMoE semantics (fused [E,2I,H]
# gate_up_proj with gate rows first, [E,H,I] down_proj, no bias, SiLU; gpt-oss in its own layout,
# experts_layout.py): each generates the same greedy tokens as its unpatched model on a tiny random
# config (tests/test_hf.py for the first five, tests/test_hf_families.py for the others).
SUPPORTED_EXPERTS_CLASSES = frozenset(
    {
        "MixtralExperts", "Qwen2MoeExperts", "Qwen3MoeExperts", "OlmoeExperts", "DeepseekV3Experts",
        "AfmoeExperts", "AXK1Experts", "AXK2Experts", "BailingHybridExperts", "BeamExperts", "Cohere2MoeExperts",
        "DeepseekOcr2TextExperts", "DeepseekV2Experts", "DeepseekV32Experts", "DeepseekV4Experts", "Dots1Experts",
        "Dots3NoteExperts", "Ernie4_5_MoeExperts", "Ernie4_5_VLMoeMoeExperts", "ExaoneMoeExperts", "FlexOlmoExperts",
        "FlintExperts", "Glm4MoeExperts", "Glm4MoeLiteExperts", "Glm4vMoeTextExperts", "Glm5NextTextExperts",
        "GlmMoeDsaExperts", "GraniteMoeExperts", "GraniteMoeHybridExperts", "GraniteMoeSharedExperts",
        "GraniteMoeSWAExperts", "HunYuanMoEV1Experts", "HYV3Experts", "HYV4Experts", "HYV4VLExperts", "Inkling2Experts",
        "Inkling2LoopExperts", "InklingExperts", "JambaExperts", "KimiLinearExperts", "Kolibri1_1Experts",
        "Kolibri1Experts", "LagunaExperts", "LaraMiniExperts", "Lfm2MoeExperts", "LongcatFlashExperts", "MellumExperts",
        "MiMoV2FlashExperts", "MiniCPM5MoeExperts", "MiniMaxExperts", "MiniMaxM2Experts", "MiniMaxM3VLExperts",
        "Mistral4Experts", "MistralLarge4TextExperts", "PhimoeExperts", "Qwen3_5MoeExperts", "Qwen3NextExperts",
        "Qwen3OmniMoeTalkerTextExperts", "Qwen3OmniMoeThinkerTextExperts", "Qwen3VLMoeTextExperts",
        "Qwen4ExpTextExperts", "SolarOpenExperts", "Step3p7Experts", "UnlimitedOcrTextExperts", "ZayaExperts",
        "GptOssExperts",  # transposed, interleaved, biased, clamped SwiGLU (experts_layout.py)
    }
)


class UnsupportedExpertsError(TypeError):
    """An experts block KTMoE cannot replace exactly."""


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
    """nn.SiLU, transformers' SiLUActivation, or the function torch.nn.functional.silu itself."""
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation" or act is torch.nn.functional.silu


def _is_gpt_oss(cls) -> bool:
    return cls.__name__ == "GptOssExperts" and cls.__module__.startswith("transformers.models.gpt_oss.")


def layout_of(module: nn.Module) -> ExpertsLayout:
    """How ``module`` stores its dense experts and which activation it gates with (a class of
    :data:`GATE_ACTIVATION_CLASSES` whose gate fails its probe: SiLU, and unsupported_reason says so)."""
    if _is_gpt_oss(type(module)):
        return gpt_oss_layout(module)
    if type(module).__name__ in GATE_ACTIVATION_CLASSES:
        found, _ = gate_activation(module)
        if found is not None:
            return flags_layout(module, *found)
    return flags_layout(module)


def experts_dims(module: nn.Module) -> tuple[int, int, int]:
    """(num_experts, hidden_size, intermediate_size) from the parameter shapes (meta tensors are fine)."""
    return layout_of(module).dims(module.gate_up_proj)


def pack_dense_experts(ktm, layout: ExpertsLayout, gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
                       fingerprint: str | None = None) -> None:
    """Pack dense experts stored in ``layout`` into ``ktm`` (views, no dense copy of the layer)."""
    if layout.transposed or layout.interleaved:
        gate, up = layout.split_gate_up(gate_up_proj)
        ktm.load_weights_separate(gate, up, layout.down(down_proj), fingerprint=fingerprint)
    else:
        ktm.load_weights(gate_up_proj, down_proj, fingerprint=fingerprint)


def sync_biases(ktm, layout: ExpertsLayout, gate_up_proj_bias: torch.Tensor, down_proj_bias: torch.Tensor) -> None:
    """Hand the module's bias parameters to ``ktm`` when they are new or were changed in place."""
    key = (id(gate_up_proj_bias), gate_up_proj_bias._version, id(down_proj_bias), down_proj_bias._version)
    if ktm.__dict__.get("_bias_source") != key:
        ktm.set_biases(layout.gate_up_bias(gate_up_proj_bias.detach()), down_proj_bias.detach())
        ktm.__dict__["_bias_source"] = key


def unsupported_reason(module: nn.Module) -> str | None:
    """None if ``module`` can be replaced by KTMoE exactly, else a sentence saying why not.

    Structural reasons (layout, bias, activation, gating) come first; a class that has
    KTMoE's layout but is not in :data:`SUPPORTED_EXPERTS_CLASSES` is refused as not
    validated (no generation test against its unpatched model yet).
    """
    cls = type(module)
    name = cls.__name__
    gpt_oss = _is_gpt_oss(cls)
    gu, dn = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(gu, torch.Tensor) or not isinstance(dn, torch.Tensor) or gu.dim() != 3 or dn.dim() != 3:
        return f"{name} has no 3-D gate_up_proj/down_proj parameters (per-expert modules, quantized or otherwise modified)"
    flags = {"has_gate": True, "has_post_expert_norm": False}
    if not gpt_oss:  # the storage variants validated so far are gpt-oss's alone
        flags.update(is_concatenated=True, is_transposed=False, has_bias=False)
    for flag, want in flags.items():
        if getattr(module, flag, want) != want:
            return f"{name}: {flag}={getattr(module, flag)!r}, KTMoE needs {want!r}"
    layout = layout_of(module)
    E, H, I = layout.dims(gu)
    shapes = layout.shapes(E, H, I)
    if (gu.shape[2] if layout.transposed else gu.shape[1]) % 2:
        return f"{name}: gate_up_proj {tuple(gu.shape)} has an odd gate/up dimension"
    for pname, shape in shapes.items():
        t = getattr(module, pname, None)
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else None
            return (f"{name}: {pname} is {got}, expected {shape} for its layout "
                    f"(transposed={layout.transposed}, interleaved={layout.interleaved})")
    if not layout.biases and (getattr(module, "gate_up_proj_bias", None) is not None
                              or getattr(module, "down_proj_bias", None) is not None):
        return f"{name} has expert biases but does not declare has_bias"
    if gpt_oss:
        alpha, limit = getattr(module, "alpha", None), getattr(module, "limit", None)
        if not all(isinstance(v, (int, float)) and v == v and abs(v) != float("inf") for v in (alpha, limit)) or limit <= 0:
            return f"{name}: swiglu alpha={alpha!r} / limit={limit!r} are not finite numbers with limit > 0"
    else:
        apply_gate = getattr(cls, "_apply_gate", None)  # the decorator installs _default_apply_gate
        if name in GATE_ACTIVATION_CLASSES:  # its own gate, a row of the activation table: checked on a probe
            _, reason = gate_activation(module)
            if reason:
                return reason
        elif apply_gate is not None and getattr(apply_gate, "__name__", "") != "_default_apply_gate":
            return f"{name} overrides _apply_gate (its own gated activation, not SiLU(gate) * up)"
        else:
            act = getattr(module, "act_fn", None)
            if not _is_silu(act):
                return f"{name}: activation {getattr(act, '__name__', type(act).__name__)} is not SiLU"
    if name not in SUPPORTED_EXPERTS_CLASSES or not cls.__module__.startswith("transformers.models."):
        return (
            f"{cls.__module__}.{name} has KTMoE's layout but is not one of the experts classes validated "
            "against their unpatched model (torch_ktmoe.hf.SUPPORTED_EXPERTS_CLASSES)"
        )
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

    ``layout`` is the replaced class's storage (:mod:`.experts_layout`). With biases
    (gpt-oss) the adapter owns ``gate_up_proj_bias`` [E, 2I] / ``down_proj_bias`` [E, H]
    as parameters under the replaced module's names, so checkpoints load into them and
    ``state_dict`` writes them; they are handed to KTMoE (fp32) whenever they change.
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
        layout: ExpertsLayout = SILU_CONCATENATED,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.layout = layout
        if layout.biases:
            self.gate_up_proj_bias = nn.Parameter(torch.zeros(num_experts, 2 * intermediate_dim, dtype=dtype),
                                                  requires_grad=False)
            self.down_proj_bias = nn.Parameter(torch.zeros(num_experts, hidden_dim, dtype=dtype), requires_grad=False)
        self.num_experts = num_experts
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.top_k = top_k
        self.layer_idx = layer_idx
        self.replaced_class = replaced_class
        self.dense_dtype: torch.dtype | None = None  # dtype of the replaced parameters (state_dict writes it)
        self.ktmoe = ktmoe
        self.register_state_dict_post_hook(_dense_state_dict_hook)

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        if self.ktmoe is None:
            raise RuntimeError(f"KTMoEExperts (layer {self.layer_idx}): expert weights were never loaded")
        if self.layout.biases:
            sync_biases(self.ktmoe, self.layout, self.gate_up_proj_bias, self.down_proj_bias)
        return self.ktmoe(hidden_states, top_k_index, top_k_weights)  # the op widens bf16/fp16 weights itself

    def extra_repr(self) -> str:
        return (
            f"replaces={self.replaced_class}, layer_idx={self.layer_idx}, num_experts={self.num_experts}, "
            f"top_k={self.top_k}, hidden_dim={self.hidden_dim}, intermediate_dim={self.intermediate_dim}"
        )


# ---------------------------------------------------------------------------------------------
# state_dict / save_pretrained: the dense weights, unpacked on demand
# ---------------------------------------------------------------------------------------------


def _lossy_unpack(fmt: str, dtype: torch.dtype | None) -> str | None:
    """What unpacked experts of format ``fmt``, written as ``dtype``, are instead of the weights that were
    packed; None when they are those weights (bf16 written as bf16)."""
    if fmt != "bf16":
        return f"{fmt} experts as dense weights: they are the dequantized {fmt} values"
    if dtype is not None and dtype != torch.bfloat16:
        return (f"bf16 experts as {dtype} weights: the {dtype} experts were rounded to bf16 when packed, "
                "these are the rounded values")
    return None


def dense_experts(ktmoe, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate_up_proj [E, 2I, H], down_proj [E, H, I]) of a loaded KTMoE, unpacked.

    bf16 experts come back exactly; int8 / int4 are dequantized (what the kernels
    multiply, not the original weights) with a warning; GGUF experts as their blocks' exact values. ``dtype`` casts the result; a
    ``dtype`` other than bf16 warns too (fp32 / fp16 experts were rounded to bf16 when packed).
    """
    if ktmoe.gguf is not None:  # the GGUF blocks' exact values, fp32
        gate_up, down = ktmoe.gguf.dense()
        lossy = None if dtype in (None, torch.float32) else f"GGUF experts as {dtype} weights: rounded from their exact values"
    else:
        gate_up, down, fmt = unpack_experts(ktmoe.packed_tensors())
        lossy = _lossy_unpack(fmt, dtype)
    if lossy is not None:
        warnings.warn(
            f"torch_ktmoe: writing {lossy}, not the original checkpoint's (a reload computes what the patched "
            "model computed)",
            UserWarning,
            stacklevel=3,
        )
    if dtype is not None:
        gate_up, down = gate_up.to(dtype), down.to(dtype)
    return gate_up, down


_UNPACK = {"enabled": True}


def unpacking_enabled() -> bool:
    """False within :func:`unpacking_disabled`: state_dict() leaves packed experts out."""
    return _UNPACK["enabled"]


@contextlib.contextmanager
def unpacking_disabled():
    """Within it, state_dict() of patched modules leaves the experts out (hf.save_packed: non-expert weights)."""
    before = _UNPACK["enabled"]
    _UNPACK["enabled"] = False
    try:
        yield
    finally:
        _UNPACK["enabled"] = before


def _dense_state_dict_hook(module, state_dict, prefix, local_metadata):
    # save_pretrained / state_dict() of a patched model: the replaced block's own keys, so the checkpoint
    # reloads into the unpatched class (bf16 exact; int8/int4 dequantized, fp32/fp16 bf16-rounded: with a warning).
    ktm = module.ktmoe
    if not unpacking_enabled() or ktm is None or not ktm.loaded:  # from_pretrained still loading: no expert keys yet
        return
    gate_up, down = module.layout.join(*dense_experts(ktm, module.dense_dtype))
    state_dict[prefix + "gate_up_proj"] = gate_up
    state_dict[prefix + "down_proj"] = down
