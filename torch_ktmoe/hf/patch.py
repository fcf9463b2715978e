"""Find the experts blocks of a loaded transformers model and replace them by KTMoE (``patch_model``).

Routers, shared experts (Qwen2-MoE ``shared_expert`` + ``shared_expert_gate``, DeepSeek-V3
``shared_experts``) and dense MLP layers (DeepSeek-V3 ``first_k_dense_replace``) stay as they are.
The discovery here (:func:`find_experts_blocks`, :func:`adapter_for`) serves ``from_pretrained`` too; the words both
speak (:class:`PatchReport`, ...) are :mod:`.vocabulary`'s, and both end in :func:`.finish.finish_load`.
"""

from __future__ import annotations

import os
import re

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
from .fast_defaults import check_switches
from .finish import finish_load
from .vocabulary import (COMPANION_MARKERS, DENSE_DTYPES, ExpertsBlock, PatchReport, RefusedBlock, account,
                         set_submodule)

__all__ = ["patch_model", "find_experts_blocks"]


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
    finish_load(model, report, pack_linears=pack_linears, decode_attention=decode_attention)
    return report


