"""ISA selection of the kernels: ``auto`` picks the best the CPU runs.

The environment variable ``KTMOE_ISA=generic|avx2|avx512`` sets the initial
choice; :func:`set_isa` changes it at run time. Asking for an ISA the CPU lacks
raises a ``RuntimeError`` listing what is available.
"""
from ._native import _C


def set_isa(name: str) -> None:
    """Use ``generic``, ``avx2``, ``avx512`` or ``auto`` for every later op call."""
    _C.set_isa(name)


def active_isa() -> str:
    return _C.active_isa()


def available_isas() -> list:
    """ISAs this CPU and build can run, best last."""
    return list(_C.available_isas())
