"""Hugging Face transformers 5.x drop-in: run a model's routed experts with KTMoE.

Entry points:

``patch_model(model, *, mmap_experts_dir=None, weight_format="bf16", pack_linears=True, ...) -> PatchReport``
    Finds every experts block of a loaded model, packs its weights into a
    :class:`torch_ktmoe.KTMoE` (``layer_idx`` = decoder layer index), puts a
    :class:`KTMoEExperts` in its place and frees the dense ``gate_up_proj``/``down_proj``
    parameters (:mod:`.patch`).

``from_pretrained(path, *, mmap_experts_dir=None, weight_format="bf16", dtype=None, pack_linears=True, ...)``
    Builds the model with transformers, swapping the experts modules for empty
    ``KTMoEExperts`` before any weight loads, and streams each layer's experts out of the
    safetensors shards into KTMoE, one expert at a time (:mod:`.streaming`).

    Both then, by default, run ``pack_linears`` (bf16 models) and ``use_decode_attention``
    (models on ``"sdpa"``) where these keep the outputs within the model dtype's rounding
    (``pack_linears=False`` / ``decode_attention=False`` turn them off); the report says what
    was applied and why not (:mod:`.fast_defaults`).

``save_packed(model, DIR)`` / ``from_pretrained(DIR)``
    A packed model directory: config, non-expert safetensors and the packed experts as
    cache files, loaded without the source checkpoint (:mod:`.packed_dir`).

``pack_linears(model, *, min_bytes=64 KiB, tied=False, routers=True, dtypes=(fp32, bf16, fp16)) -> PackedLinears``
    Replaces the dense ``nn.Linear`` layers outside the experts (attention projections, shared experts,
    lm_head) by :class:`torch_ktmoe.linear.KTLinear`: the same bf16 gemm as the experts (:mod:`.dense_linears`);
    a tied lm_head stays an ``nn.Linear`` that follows its embedding unless ``tied=True``.

``compile_decode(model, *, max_cache_len=1024, backend="inductor") -> CompiledDecode``
    Makes ``model.generate`` prefill eagerly and run each decode step compiled on the CPU with
    ``fullgraph=True`` over a static KV cache: one graph for every token and prompt (:mod:`.compiled`).

``attach_next_layer_prefetch(model, *, k_prime=None, source="experts") -> (predicted, left)``
    Each MoE layer predicts the next MoE layer's experts with that layer's router and reads them ahead while it
    computes (while the experts do not fit in memory; ``patch_model`` / ``from_pretrained`` call it;
    :mod:`.next_layer`).

``use_decode_attention(model) -> bool``
    Switches a model on ``"sdpa"`` attention to ``"ktmoe_decode"``: single-token decode as grouped fp32
    matmuls over the key/value heads, everything else SDPA (:mod:`.decode_attention`; compile_decode does it).
    Importing this package registers ``"ktmoe_decode"`` with transformers.

experts implementation ``"ktmoe"``
    Importing this package registers ``"ktmoe"`` in transformers' ``ExpertsInterface``, so
    ``model.set_experts_implementation("ktmoe")`` and
    ``AutoModelForCausalLM.from_pretrained(..., experts_implementation="ktmoe")`` work
    (:mod:`.implementation`; options: :func:`configure_experts_implementation` or the
    ``KTMOE_WEIGHT_FORMAT`` / ``KTMOE_MMAP_EXPERTS_DIR`` / ``KTMOE_CACHE`` / ``KTMOE_KEEP_DENSE``
    environment variables).

Supported experts classes: :data:`SUPPORTED_EXPERTS_CLASSES`, each validated against its
unpatched model; gpt-oss's transposed, interleaved, biased layout with its clamped SwiGLU is
mapped by :mod:`.experts_layout`. Every other experts block is refused with
:class:`UnsupportedExpertsError` naming the class and the reason (:func:`unsupported_reason`;
``strict=False`` leaves them dense and lists them in the report).

A patched model's ``state_dict()``/``save_pretrained`` write the experts back as dense
tensors under the replaced class's keys (bf16 exact; int8/int4 dequantized, with a
warning), ``copy.deepcopy`` shares the packed experts, and a backward raises
:class:`torch_ktmoe.ops.InferenceOnlyError`. ``KTMoEExperts`` does not dispatch on
``config._experts_implementation`` (patching sets it to ``"ktmoe"`` so
``model.get_experts_implementation()`` tells the truth; switching it afterwards changes nothing).
"""

from .compiled import CompiledDecode, CompileDecodeError, compile_decode
from .decode_attention import register as register_decode_attention
from .decode_attention import use_decode_attention
from .dense_linears import PackedLinears, pack_linears
from .experts import (
    SUPPORTED_EXPERTS_CLASSES,
    KTMoEExperts,
    UnsupportedExpertsError,
    dense_experts,
    experts_dims,
    layout_of,
    unsupported_reason,
)
from .experts_layout import ExpertsLayout
from .implementation import (
    ENV_OPTIONS,
    configure_experts_implementation,
    implementation_options,
    register_experts_implementation,
)
from .next_layer import attach_next_layer_prefetch
from .packed_dir import PackedDirError, save_packed
from .patch import find_experts_blocks, patch_model
from .streaming import from_pretrained
from .vocabulary import ExpertsBlock, PatchReport, RefusedBlock

__all__ = [
    "patch_model",
    "from_pretrained",
    "compile_decode",
    "pack_linears",
    "use_decode_attention",
    "attach_next_layer_prefetch",
    "PackedLinears",
    "CompiledDecode",
    "CompileDecodeError",
    "save_packed",
    "find_experts_blocks",
    "PatchReport",
    "RefusedBlock",
    "ExpertsBlock",
    "UnsupportedExpertsError",
    "SUPPORTED_EXPERTS_CLASSES",
    "KTMoEExperts",
    "ExpertsLayout",
    "unsupported_reason",
    "layout_of",
    "experts_dims",
    "dense_experts",
    "PackedDirError",
    "register_experts_implementation",
    "configure_experts_implementation",
    "implementation_options",
    "ENV_OPTIONS",
]

register_experts_implementation("ktmoe")
register_decode_attention()  # "ktmoe_decode": so that a model switched to it also runs where it is unpickled
