"""The load recipe every host runs per experts block: map its valid cache files, else pack it expert by expert.

    ktm = load_experts(E, top_k, H, I, reader.experts(ids), source=checkpoint_fingerprint(path, salt),
                       key=block_name, mmap_experts_dir=DIR, weight_format="int4", layer_idx=L)

``source`` names the checkpoint (:func:`torch_ktmoe.checkpoint.checkpoint_fingerprint`: its files'
names, sizes, mtimes, safetensors headers and content samples, plus the host's salt) and ``key`` the
block within it; together they are the fingerprint the cache files are checked against, so a hit
reads nothing from the checkpoint.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional

import torch

from ..cache import layer_fingerprint
from ..paths import utf8_path
from ..layer import KTMoE

KERNEL_INPUT_DTYPES = (torch.bfloat16, torch.float32)  # packed as they are; anything else goes through fp32


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


def as_kernel_input(t: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``t`` in ``dtype``; with None, bf16 / fp32 as they are and anything else as fp32."""
    if dtype is None:
        dtype = t.dtype if t.dtype in KERNEL_INPUT_DTYPES else torch.float32
    return t.to(dtype)


@torch.no_grad()
def load_experts(num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 experts: Iterable[tuple[torch.Tensor, torch.Tensor]], *, source: str, key: str,
                 dtype: Optional[torch.dtype] = None, mmap_experts_dir=None, **ktmoe_kwargs) -> KTMoE:
    """A loaded KTMoE of one experts block.

    ``experts``: per slot ``0..num_experts-1``, ``(gate_up [2I, H], down [H, I])``; a lazy iterable
    (a reader's ``experts(ids)``), consumed only when the cache has no valid files for
    ``layer_fingerprint(source, key)``. ``dtype``: what the experts are handed to the packer in
    (see :func:`as_kernel_input`). ``ktmoe_kwargs`` (``weight_format``, ``layer_idx``, ``cache``,
    ``numa_parts``, ``activation``...) go to the KTMoE constructor.
    """
    ktm = make_ktmoe(num_experts, top_k, hidden_size, intermediate_size, mmap_experts_dir=mmap_experts_dir,
                     **ktmoe_kwargs)
    fingerprint = layer_fingerprint(source, key)
    if not ktm.try_load_cached(fingerprint):
        for slot, (gate_up, down) in enumerate(experts):
            ktm.load_expert(slot, as_kernel_input(gate_up, dtype), as_kernel_input(down, dtype),
                            fingerprint=fingerprint)
    return ktm
