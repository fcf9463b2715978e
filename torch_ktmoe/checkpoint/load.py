"""The load recipe every host runs per experts block: map its valid cache files, else pack it expert by expert.

    ktm = load_experts(E, top_k, H, I, reader.experts(ids), source=checkpoint_fingerprint(path, salt),
                       key=block_name, mmap_experts_dir=DIR, weight_format="int4", layer_idx=L)

``source`` names the checkpoint (:func:`torch_ktmoe.checkpoint.checkpoint_fingerprint`: its files'
names, sizes, mtimes, safetensors headers and content samples, plus the host's salt) and ``key`` the
block within it; together they are the fingerprint the cache files are checked against, so a hit
reads nothing from the checkpoint.
``reader_experts(reader, ids, weight_format, group_size)`` is what a host hands it: an FP8
checkpoint's e4m3 bytes and scales as they are when the target is ``fp8``, an int4 checkpoint's
codes, scales and zero points as they are when it is ``int4_affine``, an MXFP4 checkpoint's e2m1 codes and
E8M0 scales as they are when it is ``mxfp4`` (only when asked for: its default is bf16), else dense weights;
``exact_format(reader)`` is the format a reader's experts are read into exactly (None: dense only).
"""
from __future__ import annotations

import os
from typing import Iterable, Optional

import torch

from .. import ops
from ..cache import layer_fingerprint
from ..paths import utf8_path
from ..layer import KTMoE
from .fp8 import BLOCK as FP8_GROUP

KERNEL_INPUT_DTYPES = (torch.bfloat16, torch.float32)  # packed as they are; fp16 goes through fp32
DENSE_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # the dtypes read as weight values


def make_ktmoe(num_experts: int, top_k: int, hidden_size: int, intermediate_size: int, *,
               mmap_experts_dir=None, **ktmoe_kwargs) -> KTMoE:
    """An empty KTMoE; ``mmap_experts_dir`` is created if missing (KTMoE itself would fall back to anonymous
    memory) and must be a UTF-8 path (:func:`utf8_path`)."""
    if mmap_experts_dir is not None:
        mmap_experts_dir = utf8_path(mmap_experts_dir, "mmap_experts_dir")
    if mmap_experts_dir:
        os.makedirs(mmap_experts_dir, exist_ok=True)
    return KTMoE(num_experts, top_k, hidden_size, intermediate_size, mmap_experts_dir=mmap_experts_dir,
                 **ktmoe_kwargs)


def as_kernel_input(t: torch.Tensor, dtype: Optional[torch.dtype] = None, name: str = "expert weights") -> torch.Tensor:
    """``t`` in ``dtype``; with None, bf16 / fp32 as they are and fp16 as fp32. Integer, bool and fp8
    tensors are refused (ValueError naming ``name`` and the dtype): their values are codes, not weights."""
    if t.dtype not in DENSE_INPUT_DTYPES:
        raise ValueError(f"{name}: dtype {t.dtype}; dense expert weights must be float32, bfloat16 or float16 "
                         "(quantized codes are not weights: an FP8 checkpoint needs its scales, see "
                         "torch_ktmoe.checkpoint.fp8)")
    if dtype is None:
        dtype = t.dtype if t.dtype in KERNEL_INPUT_DTYPES else torch.float32
    return t.to(dtype)


EXACT_FORMATS = {"fp8_experts": "fp8", "int4_experts": "int4_affine"}  # reader method -> the format it fills


def exact_format(reader) -> Optional[str]:
    """The weight format ``reader``'s experts are read into as they are (``"fp8"``, ``"int4_affine"``), or None."""
    return next((fmt for method, fmt in EXACT_FORMATS.items() if hasattr(reader, method)), None)


def exact_group_size(reader, weight_format: str, group_size: int = 0) -> int:
    """The ``group_size`` a KTMoE of ``weight_format`` gets for ``reader``'s experts: the checkpoint's group
    (``reader.group_size``) for ``int4_affine`` read exactly unless one is given, else ``group_size``."""
    if not group_size and weight_format == "int4_affine" and exact_format(reader) == "int4_affine":
        return reader.group_size
    return group_size


def reader_experts(reader, ids, weight_format: str, group_size: int = 0):
    """What :func:`load_experts` packs from ``reader``: its exact e4m3 experts with their scales per
    (row, k-group) (``fp8_experts``) when the target format is ``"fp8"``, its int4 codes with scales and
    zero points (``int4_experts``) when it is ``"int4_affine"``, its e2m1 codes with E8M0 scale bytes
    (``mxfp4_experts``) when it is ``"mxfp4"``, else its dense ``experts(ids)``."""
    if weight_format == "fp8" and hasattr(reader, "fp8_experts"):
        return reader.fp8_experts(ids, group_size or FP8_GROUP)
    if weight_format == "int4_affine" and hasattr(reader, "int4_experts"):
        return reader.int4_experts(ids, group_size or reader.group_size)
    if weight_format == "mxfp4" and hasattr(reader, "mxfp4_experts"):  # asked for: the default stays bf16
        return reader.mxfp4_experts(ids, group_size or 32)
    return reader.experts(ids)


@torch.no_grad()
def load_experts(num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 experts: Iterable[tuple[torch.Tensor, torch.Tensor]], *, source: str, key: str,
                 dtype: Optional[torch.dtype] = None, mmap_experts_dir=None, **ktmoe_kwargs) -> KTMoE:
    """A loaded KTMoE of one experts block.

    ``experts``: per slot ``0..num_experts-1``, ``(gate_up [2I, H], down [H, I])``, or
    ``(gate_up, down, gate_up_scale, down_scale)`` of an FP8 checkpoint (e4m3, see
    :func:`reader_experts`; packed exactly into ``weight_format="fp8"``), or ``(gate_up_codes,
    down_codes, gate_up_scale, down_scale, gate_up_zero, down_zero)`` of an int4 checkpoint (packed
    exactly into ``weight_format="int4_affine"``), or ``(gate_up_codes, down_codes, gate_up_scale,
    down_scale)`` of an MXFP4 checkpoint (uint8, packed exactly into ``"mxfp4"``); a lazy iterable
    (a reader's ``experts(ids)``), consumed only when the cache has no valid files for
    ``layer_fingerprint(source, key)``. ``dtype``: what the experts are handed to the packer in
    (see :func:`as_kernel_input`). ``ktmoe_kwargs`` (``weight_format``, ``layer_idx``, ``cache``,
    ``numa_parts``, ``activation``...) go to the KTMoE constructor.
    """
    ktm = make_ktmoe(num_experts, top_k, hidden_size, intermediate_size, mmap_experts_dir=mmap_experts_dir,
                     **ktmoe_kwargs)
    fingerprint = layer_fingerprint(source, key)
    if not ktm.try_load_cached(fingerprint):
        # a checkpoint's exact codes come with the companions of the format's row, in its order (scales, then
        # zero points), each of gate_up then down
        names = [n for n in ops.exact_names(ktm.weight_format) if not n.startswith("up_")]
        for slot, (gate_up, down, *companions) in enumerate(experts):
            if companions and len(companions) != len(names):
                raise ValueError(f"{key}: expert {slot} comes with {len(companions)} scale / zero point tensors, "
                                 f"weight_format={ktm.weight_format!r} takes {names or 'none (dense weights)'}")
            if companions:  # codes with their scales (and zero points): as they are
                ktm.load_expert(slot, gate_up, down, **dict(zip(names, companions)), fingerprint=fingerprint)
            else:
                ktm.load_expert(slot, as_kernel_input(gate_up, dtype), as_kernel_input(down, dtype),
                                fingerprint=fingerprint)
    return ktm
