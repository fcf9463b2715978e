"""The Hugging Face wing's shared vocabulary: what its loaders, the patch and the defaults all speak of, defined once
here and imported from here (this module imports nothing of the wing).

* :class:`ExpertsBlock`, :class:`RefusedBlock`: an experts block found in a model, replaced or refused;
* :class:`PatchReport`, :func:`account`: what ``patch_model`` / ``from_pretrained`` did;
* :func:`set_submodule`, :func:`model_dtype`: a module put in place, a model's dtype;
* :data:`DENSE_DTYPES`: the torch dtypes packed as numbers; :data:`COMPANION_MARKERS` (the checkpoint readers'): the
  name fragments of quantization companions, named when a block of another dtype is refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..checkpoint.dense import COMPANION_MARKERS

__all__ = ["ExpertsBlock", "RefusedBlock", "PatchReport", "account", "set_submodule", "model_dtype", "DENSE_DTYPES",
           "COMPANION_MARKERS"]


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
    linears: PackedLinears | None = None  # (dense_linears.PackedLinears; not imported: it imports this module)
    decode_attention: bool = False
    defaults_left: dict[str, str] = field(default_factory=dict)
    next_layer_predicted: list[int] = field(default_factory=list)  # layer_idx of each layer predicted (next_layer.py)
    next_layer_left: dict[int, str] = field(default_factory=dict)  # layer_idx -> why it is not predicted

    @property
    def num_layers(self) -> int:
        return len(self.layers_patched)


def account(report: PatchReport, b: ExpertsBlock, ktm, dense_bytes: int) -> None:
    """Records in ``report`` that block ``b`` became the KTMoE ``ktm`` (``dense_bytes`` of dense experts dropped)."""
    report.layers_patched.append(b.layer_idx)
    report.module_names.append(b.name)
    report.replaced_classes[b.class_name] = report.replaced_classes.get(b.class_name, 0) + 1
    report.packed_bytes += int(ktm.packed_bytes)
    report.file_backed_bytes += int(ktm.file_backed_bytes)
    report.dense_bytes_freed += dense_bytes


def set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    """Puts ``new`` at the dotted module path ``name`` of ``model``."""
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attr, new)


DENSE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of ``model``'s first floating-point parameter (fp32 if it has none)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
