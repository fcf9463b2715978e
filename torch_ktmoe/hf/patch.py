"""Find the experts blocks of a loaded transformers model and replace them by KTMoE (``patch_model``).

Routers, shared experts (Qwen2-MoE ``shared_expert`` + ``shared_expert_gate``, DeepSeek-V3
``shared_experts``) and dense MLP layers (DeepSeek-V3 ``first_k_dense_replace``) stay as they are.
The discovery and bookkeeping here (:func:`find_experts_blocks`, :class:`PatchReport`) serve
``from_pretrained`` too.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from ..checkpoint import make_ktmoe
from .experts import (
    KTMoEExperts,
    UnsupportedExpertsError,
    experts_dims,
    layout_of,
    looks_like_experts,
    pack_dense_experts,
    unsupported_reason,
)

if TYPE_CHECKING:
    from .dense_linears import PackedLinears

__all__ = ["patch_model", "find_experts_blocks", "PatchReport", "RefusedBlock", "ExpertsBlock"]


@dataclass
class ExpertsBlock:
    name: str  # dotted module path, e.g. "model.layers.3.mlp.experts"
    module: nn.Module
    layer_idx: int
    class_name: str


@dataclass
class RefusedBlock:
    name: str
    class_name: str
    reason: str


@dataclass
class PatchReport:
    """What ``patch_model`` / ``from_pretrained`` did: the experts blocks replaced (the byte counts are the
    experts'), then the defaults of :mod:`.fast_defaults`: ``linears`` (``pack_linears``' report, None when the
    dense linears were left to torch), ``decode_attention`` (attention switched to ``"ktmoe_decode"``) and
    ``defaults_left`` (``"pack_linears"`` / ``"decode_attention"`` -> why that default was not applied); the
    layers whose experts the previous MoE layer predicts and reads ahead (``next_layer_predicted``, :mod:`.next_layer`)
    and why the others are not (``next_layer_left``; the first MoE layer has no previous one)."""

    layers_patched: list[int] = field(default_factory=list)  # layer_idx of each replaced experts block
    module_names: list[str] = field(default_factory=list)
    replaced_classes: dict[str, int] = field(default_factory=dict)  # class name -> count
    packed_bytes: int = 0  # sum of KTMoE.packed_bytes
    file_backed_bytes: int = 0  # sum of KTMoE.file_backed_bytes
    dense_bytes_freed: int = 0  # bytes of the dense expert parameters dropped (0 for from_pretrained)
    refused: list[RefusedBlock] = field(default_factory=list)
    linears: PackedLinears | None = None
    decode_attention: bool = False
    defaults_left: dict[str, str] = field(default_factory=dict)
    next_layer_predicted: list[int] = field(default_factory=list)  # layer_idx of each layer predicted (next_layer.py)
    next_layer_left: dict[int, str] = field(default_factory=dict)  # layer_idx -> why it is not predicted

    @property
    def num_layers(self) -> int:
        return len(self.layers_patched)


_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def find_experts_blocks(model: nn.Module) -> tuple[list[ExpertsBlock], list[RefusedBlock]]:
    """Supported and refused experts blocks of ``model``, in module order."""
    found: list[ExpertsBlock] = []
    refused: list[RefusedBlock] = []
    used: set[int] = set()
    skip_prefixes: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(p) for p in skip_prefixes):
            continue
        if not looks_like_experts(name, module):
            continue
        skip_prefixes.append(name + ".")
        cls_name = type(module).__name__
        reason = (
            f"{cls_name} is a list of per-expert modules, not a fused transformers 5 experts module"
            if isinstance(module, nn.ModuleList)
            else unsupported_reason(module)
        )
        if reason is not None:
            refused.append(RefusedBlock(name, cls_name, reason))
            continue
        matches = _LAYER_RE.findall(name)
        idx = int(matches[-1]) if matches else None
        if idx is None or idx in used:
            idx = max(used, default=-1) + 1
        used.add(idx)
        found.append(ExpertsBlock(name, module, idx, cls_name))
    return found, refused


def refusal_error(model: nn.Module, refused: list[RefusedBlock]) -> UnsupportedExpertsError:
    lines = "\n".join(f"  {r.name}: {r.class_name}: {r.reason}" for r in refused)
    return UnsupportedExpertsError(
        f"torch_ktmoe cannot replace {len(refused)} experts block(s) of {type(model).__name__}:\n{lines}\n"
        "(pass strict=False to patch the supported blocks and leave these dense)"
    )


def set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attr, new)

DENSE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of ``model``'s first floating-point parameter (fp32 if it has none)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)

COMPANION_MARKERS = ("scale", "zero", "qweight", "qzeros", "packed", "g_idx", "_blocks")


def check_dense_dtype(block: ExpertsBlock, pname: str) -> None:
    """ValueError naming ``block.pname``, its dtype and the block's quantization companions unless it is
    fp32 / bf16 / fp16 (integer or fp8 tensors are codes; packing them as numbers would be silently wrong)."""
    t = getattr(block.module, pname)
    if t.dtype in DENSE_DTYPES:
        return
    found = [n for n, _ in [*block.module.named_parameters(), *block.module.named_buffers()]
             if any(m in n for m in COMPANION_MARKERS)]
    raise ValueError(f"{block.name}.{pname}: dtype {t.dtype}; patch_model packs fp32 / bf16 / fp16 experts (an FP8 "
                     f"checkpoint loads through torch_ktmoe.hf.from_pretrained); companion tensors found: "
                     f"{found or 'none'}")


def adapter_for(block: ExpertsBlock, ktmoe) -> KTMoEExperts:
    E, H, I = experts_dims(block.module)
    layout = layout_of(block.module)
    dtype = block.module.gate_up_proj.dtype
    adapter = KTMoEExperts(
        ktmoe,
        num_experts=E,
        hidden_dim=H,
        intermediate_dim=I,
        top_k=int(block.module.config.num_experts_per_tok),
        layer_idx=block.layer_idx,
        replaced_class=block.class_name,
        layout=layout,
        dtype=dtype,
    )
    if layout.biases:  # the replaced module's values (meta while from_pretrained builds the model)
        for name in ("gate_up_proj_bias", "down_proj_bias"):
            src = getattr(block.module, name)
            if src.is_meta:
                setattr(adapter, name, nn.Parameter(torch.empty_like(src, device="meta"), requires_grad=False))
            else:
                getattr(adapter, name).data.copy_(src.detach())
    adapter.dense_dtype = dtype
    return adapter


def mark_config(model: nn.Module) -> None:
    # Report "ktmoe" from model.get_experts_implementation(); KTMoEExperts itself does not dispatch on it.
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_experts_implementation_internal"):
            cfg._experts_implementation_internal = "ktmoe"

# ---------------------------------------------------------------------------------------------
# patch_model
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def patch_model(
    model: nn.Module,
    *,
    mmap_experts_dir: str | os.PathLike | None = None,
    weight_format: str = "bf16",
    strict: bool = True,
    free_dense: bool = True,
    progress: bool = False,
    cache: str | None = None,
    pack_linears: bool = True,
    decode_attention: bool = True,
    **ktmoe_kwargs,
) -> PatchReport:
    """Replace every experts block of a loaded transformers model by KTMoE, in place.

    ``ktmoe_kwargs`` (``numa_parts=``, ``group_size=``) go to the ``KTMoE`` constructor,
    and so does ``cache`` (``"reuse"``, ``"rebuild"``, ``"off"``; see :mod:`torch_ktmoe.cache`:
    with a valid cache, a layer maps its packed experts instead of packing them; the
    fingerprint is a hash of the dense weights).
    With ``free_dense`` the replaced ``gate_up_proj``/``down_proj`` Parameters get an
    empty ``.data``, so their memory is released even if something else still holds
    the Parameter objects. Raises :class:`UnsupportedExpertsError` (naming the class)
    for unsupported blocks unless ``strict=False``.

    Then, by default, the dense linears outside the experts run packed (``pack_linears=False``: torch's)
    and one-token decode attention as grouped matmuls (``decode_attention=False``: transformers' SDPA),
    each where it keeps the outputs within the model dtype's rounding (:mod:`.fast_defaults`: bf16
    models pack, fp32 / fp16 ones keep torch's linears). The report says what was applied and why not;
    it is also stored as ``model.ktmoe_report``.

    With ``next_layer_prefetch="auto"`` (a KTMoE option like ``prefetch``; the default) each MoE layer
    predicts the next one's experts with that layer's router and reads them ahead while it computes, while the
    experts do not fit in memory; ``True`` always, ``False`` never (:mod:`.next_layer`).
    """
    from .fast_defaults import apply_defaults, check_switches  # it imports this module

    check_switches(pack_linears=pack_linears, decode_attention=decode_attention)
    blocks, refused = find_experts_blocks(model)
    if refused and strict:
        raise refusal_error(model, refused)
    if not blocks and not refused:
        raise ValueError(f"{type(model).__name__}: no Mixture-of-Experts experts block found")
    for b in blocks:
        for pname in ("gate_up_proj", "down_proj"):
            if getattr(b.module, pname).is_meta:
                raise ValueError(
                    f"{b.name}.{pname} is on the meta device; load the weights first "
                    "(or use torch_ktmoe.hf.from_pretrained)"
                )
            check_dense_dtype(b, pname)
    report = PatchReport(refused=list(refused))
    if cache is not None:
        ktmoe_kwargs["cache"] = cache
    it = blocks
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(blocks, desc="ktmoe: packing experts", unit="layer")
    for b in it:
        E, H, I = experts_dims(b.module)
        top_k = int(b.module.config.num_experts_per_tok)
        layout = layout_of(b.module)
        ktm = make_ktmoe(E, top_k, H, I, mmap_experts_dir=mmap_experts_dir, weight_format=weight_format,
                         layer_idx=b.layer_idx, **{**layout.ktmoe_kwargs(), **ktmoe_kwargs})
        pack_dense_experts(ktm, layout, b.module.gate_up_proj.detach(), b.module.down_proj.detach())
        set_submodule(model, b.name, adapter_for(b, ktm))
        dense = sum(p.numel() * p.element_size() for p in b.module.parameters(recurse=True))
        if free_dense:
            for p in b.module.parameters(recurse=True):
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        account(report, b, ktm, dense)
        b.module = None  # drop our reference to the old module
    if not refused:
        mark_config(model)
    apply_defaults(model, report, pack_linears=pack_linears, decode_attention=decode_attention)
    attach_next_layer(model, report)
    model.ktmoe_report = report
    return report


def attach_next_layer(model: nn.Module, report: PatchReport) -> None:
    """Next-layer prefetch through the patched layers (:mod:`.next_layer`), recorded in ``report``."""
    from .next_layer import attach_next_layer_prefetch

    report.next_layer_predicted, report.next_layer_left = attach_next_layer_prefetch(model)


def account(report: PatchReport, b: ExpertsBlock, ktm, dense_bytes: int) -> None:
    report.layers_patched.append(b.layer_idx)
    report.module_names.append(b.name)
    report.replaced_classes[b.class_name] = report.replaced_classes.get(b.class_name, 0) + 1
    report.packed_bytes += int(ktm.packed_bytes)
    report.file_backed_bytes += int(ktm.file_backed_bytes)
    report.dense_bytes_freed += dense_bytes
