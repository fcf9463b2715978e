"""The one tail of the Hugging Face loaders (``patch_model``, ``from_pretrained``: safetensors, GGUF, a packed
directory): after the experts, the config marked, the fast defaults (:mod:`.fast_defaults`), the next-layer links
and prefetch (:mod:`.next_layer`), freed heap back to the OS, and the report kept on the model."""
from __future__ import annotations

import torch.nn as nn

from ..memory import release_free_heap
from .fast_defaults import apply_defaults
from .next_layer import attach_next_layer_prefetch
from .vocabulary import PatchReport

__all__ = ["finish_load", "mark_config"]


def finish_load(model: nn.Module, report: PatchReport, *, pack_linears: bool, decode_attention: bool) -> nn.Module:
    """The loaders' common end (see the module); returns ``model``, its ``ktmoe_report`` set to ``report``."""
    if not report.refused:
        mark_config(model)
    apply_defaults(model, report, pack_linears=pack_linears, decode_attention=decode_attention)
    report.next_layer_predicted, report.next_layer_left = attach_next_layer_prefetch(model)
    release_free_heap()  # the dense staging buffers (or the dense experts freed) and the packed linears' weights
    model.ktmoe_report = report
    return model


def mark_config(model: nn.Module) -> None:
    # Report "ktmoe" from model.get_experts_implementation(); KTMoEExperts itself does not dispatch on it.
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_experts_implementation_internal"):
            cfg._experts_implementation_internal = "ktmoe"
