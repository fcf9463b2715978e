"""torch_ktmoe: fast CPU Mixture-of-Experts kernels with file-backed expert weights.

* ``torch.ops.ktmoe.moe_forward`` / ``torch.ops.ktmoe.pack_experts`` — the ops;
* :class:`KTMoE` — an ``nn.Module`` over packed experts (``mmap_experts_dir=``
  keeps them in reclaimable ``MAP_SHARED`` files);
* :func:`memory_report` — anonymous vs file RSS and arena statistics;
* :func:`residency_report` — per layer, routed experts in RAM vs read from disk, bytes read per token;
* ``torch_ktmoe.hf`` — the Hugging Face drop-in (imported on demand).
"""
from ._native import _C
from . import ops  # noqa: F401  (registers the fake kernels)
from .arena import ArenaFallbackWarning, WeightArena
from .isa import active_isa, available_isas, isa_scope, set_isa
from .layer import KTMoE
from .memory import memory_report
from .residency import residency_report

__version__ = "0.1.0"

__all__ = ["KTMoE", "WeightArena", "ArenaFallbackWarning", "memory_report", "residency_report", "set_isa", "isa_scope", "active_isa",
           "available_isas", "__version__"]

_LAZY_SUBMODULES = ("hf",)  # imported on first attribute access: hf imports transformers


def __getattr__(name):  # PEP 562
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)  # also binds it as an attribute of this module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))
