"""Run a transformers model's dense ``nn.Linear`` layers through ktmoe's bf16 gemm (``pack_linears``).

Around the experts, a decode token multiplies one row of activations by every attention projection,
shared-expert MLP and the lm_head: torch's bf16 GEMV reads those weights at a fraction of the memory's
read roof, ktmoe's packed bf16 gemm close to it. ``pack_linears(model)`` replaces each such
``nn.Linear`` by a :class:`torch_ktmoe.linear.KTLinear` (the weight rounded to bf16 and packed; the
dense weight dropped with the module).

Left alone: anything inside an experts block (``patch_model``'s business), subclasses of ``nn.Linear``
(quantized layers, ``nn.MultiheadAttention``'s ``out_proj``: their owners may read ``.weight``), layers
whose weight is not fp32 / bf16 / fp16 on the CPU (offloaded layers), layers below ``min_bytes``. Routers
that are not ``nn.Linear`` (transformers 5's ``*TopKRouter`` modules) keep their module and their own
forward, with its one ``F.linear`` on a packed copy of the weight (:mod:`.packed_router`; ``routers=False``
leaves them). A layer whose weight is tied to an
``nn.Embedding`` (a tied lm_head) stays an ``nn.Linear`` sharing the embedding's tensor (``skipped`` says so), so it
follows its embedding through transformers' ``resize_token_embeddings`` and ``set_input_embeddings`` +
``tie_weights``; ``tied=True`` packs it anyway, as a copy that does not follow (extra memory, reported apart, and
those two APIs then need the model unpacked). Works with
``compile_decode``: ``ktmoe::linear`` is a custom op with a fake kernel, its output shape is static.
``state_dict()`` / ``save_packed`` write each replaced layer as a dense ``weight`` (``KTLinear``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..linear import KTLinear
from .experts import KTMoEExperts, looks_like_experts
from .packed_router import is_packed_router, pack_router, router_refusal
from .vocabulary import DENSE_DTYPES, set_submodule

__all__ = ["pack_linears", "PackedLinears", "DEFAULT_MIN_BYTES"]

DEFAULT_MIN_BYTES = 64 << 10  # dense weight bytes below which a layer stays an nn.Linear
SHORT_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass
class PackedLinears:
    """What ``pack_linears`` did: the layers replaced, their packed bytes, the dense bytes released (not
    counting tied weights, which their embedding keeps), and each layer left alone with the reason."""

    module_names: list[str] = field(default_factory=list)
    packed_bytes: int = 0
    dense_bytes_freed: int = 0
    tied: list[str] = field(default_factory=list)  # replaced layers whose dense weight an embedding keeps
    routers: list[str] = field(default_factory=list)  # routers whose logits run packed (weight kept)
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why

    @property
    def replaced(self) -> int:
        return len(self.module_names)


def _dtype_refusal(weight: torch.Tensor, dtypes: tuple[torch.dtype, ...]) -> str | None:
    if weight.dtype in dtypes:
        return None
    return f"weight dtype {weight.dtype} (packs {' / '.join(SHORT_NAMES[d] for d in dtypes)})"


def _skip_reason(linear: nn.Linear, min_bytes: int, tied: bool, is_tied: bool,
                 dtypes: tuple[torch.dtype, ...]) -> str | None:
    if type(linear) is not nn.Linear:  # e.g. nn.MultiheadAttention's out_proj, whose weight its owner reads
        return f"{type(linear).__name__} is a subclass of nn.Linear (its owner may read .weight)"
    weight = linear.weight
    reason = _dtype_refusal(weight, dtypes)
    if reason is not None:
        return reason
    if weight.device.type != "cpu":
        return f"weight on {weight.device} (ktmoe runs on the CPU)"
    nbytes = weight.numel() * weight.element_size()
    if nbytes < min_bytes:
        return f"{nbytes} weight bytes < min_bytes {min_bytes}"
    if is_tied and not tied:
        return ("weight tied to an embedding: stays nn.Linear sharing it, so it follows the embedding "
                "(resize_token_embeddings, set_input_embeddings + tie_weights); tied=True packs a copy")
    return None


def _is_router(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (type(module).__name__.lower().endswith("router") and not isinstance(module, (nn.Linear, nn.Embedding))
            and isinstance(weight, torch.Tensor) and weight.dim() == 2)


def _router_skip_reason(router: nn.Module, min_bytes: int, dtypes: tuple[torch.dtype, ...]) -> str | None:
    nbytes = router.weight.numel() * router.weight.element_size()
    if nbytes < min_bytes:
        return f"{nbytes} weight bytes < min_bytes {min_bytes}"
    return _dtype_refusal(router.weight, dtypes) or router_refusal(router)


def _check_dtypes(dtypes) -> tuple[torch.dtype, ...]:
    dtypes = tuple(dtypes)
    if not dtypes or any(d not in DENSE_DTYPES for d in dtypes):
        raise ValueError(f"dtypes must be a non-empty selection of {DENSE_DTYPES}, got {dtypes!r}")
    return dtypes


def pack_linears(model: nn.Module, *, min_bytes: int = DEFAULT_MIN_BYTES, tied: bool = False,
                 routers: bool = True, dtypes=DENSE_DTYPES) -> PackedLinears:
    """Replace ``model``'s dense ``nn.Linear`` layers outside its experts blocks by :class:`KTLinear`.

    ``min_bytes``: layers with fewer dense weight bytes stay ``nn.Linear`` (0: pack all). ``tied``: also pack
    layers whose weight an ``nn.Embedding`` shares (default False: they follow their embedding; True: a packed
    copy that does not, while the embedding keeps the tensor: memory grows by the copy).
    ``routers``: also run the routers' logits packed (the router keeps its module, forward and weight).
    ``dtypes``: the weight dtypes packed (a layer of another dtype is skipped; ``patch_model`` and
    ``from_pretrained`` pack bf16 only). Layers and routers already packed stay as they are: a second call
    changes nothing and reports none of them. Outputs change by the rounding of weights and activations to
    bf16 (products summed in fp32), as the experts' ``"bf16"`` format. Returns a :class:`PackedLinears`.
    Call it after ``patch_model`` / ``from_pretrained`` and before ``compile_decode``'s first ``generate``.
    """
    if not isinstance(min_bytes, int) or min_bytes < 0:
        raise ValueError(f"min_bytes must be a non-negative int, got {min_bytes!r}")
    dtypes = _check_dtypes(dtypes)
    embedding_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    report = PackedLinears()
    experts_prefixes: list[str] = []
    targets: list[tuple[str, nn.Linear]] = []
    router_targets: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if any(name.startswith(p) for p in experts_prefixes):
            continue
        if isinstance(module, KTMoEExperts) or looks_like_experts(name, module):
            experts_prefixes.append(name + ".")
            continue
        if isinstance(module, nn.Linear):
            targets.append((name, module))
        elif routers and _is_router(module) and not is_packed_router(module):
            router_targets.append((name, module))
    for name, linear in targets:
        is_tied = id(linear.weight) in embedding_weights
        reason = _skip_reason(linear, min_bytes, tied, is_tied, dtypes)
        if reason is not None:
            report.skipped[name] = reason
            continue
        packed = KTLinear.from_linear(linear)
        set_submodule(model, name, packed)
        report.module_names.append(name)
        report.packed_bytes += packed.packed_bytes
        if is_tied:
            report.tied.append(name)
        else:
            report.dense_bytes_freed += linear.weight.numel() * linear.weight.element_size()
    for name, router in router_targets:
        reason = _router_skip_reason(router, min_bytes, dtypes)
        if reason is not None:
            report.skipped[name] = reason
            continue
        pack_router(router)
        report.routers.append(name)
        report.packed_bytes += router.ktmoe_w_packed.numel()
    return report
