"""ISA selection of the kernels: ``auto`` picks the best the CPU runs.

The environment variable ``KTMOE_ISA=generic|avx2|avx2_vnni|avx512|amx`` sets the initial
choice (``auto``, the default, picks ``amx`` where the CPU has it, then ``avx512``, ``avx2_vnni``,
``avx2``, ``generic``); :func:`set_isa` changes it at run time for the whole process;
:func:`isa_scope` chooses one for the calls of the current thread only. Asking
for an ISA the CPU lacks raises a ``RuntimeError`` listing what is available.
"""
import contextlib

from ._native import _C


def set_isa(name: str) -> None:
    """Use ``generic``, ``avx2``, ``avx2_vnni``, ``avx512``, ``amx`` or ``auto`` for every later op call of the process."""
    _C.set_isa(name)


@contextlib.contextmanager
def isa_scope(name: str):
    """Run the op calls of this thread inside the ``with`` block on ISA ``name``.

    Other threads and the process default (:func:`set_isa`) are untouched; scopes nest,
    and the thread's previous choice is restored on exit (also on an exception)."""
    previous = _C.set_thread_isa(name)
    try:
        yield name
    finally:
        _C.set_thread_isa(previous)


def active_isa() -> str:
    """The ISA the next op call of this thread runs on."""
    return _C.active_isa()


def available_isas() -> list:
    """ISAs this CPU and build can run: generic, avx2, avx2_vnni, avx512, amx (worst to best)."""
    return list(_C.available_isas())
