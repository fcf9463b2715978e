"""sglang drop-in: the CPU experts of sglang's KTransformers path (``--kt-weight-path``) on torch_ktmoe.

* :class:`KTMoEWrapper` — kt-kernel's wrapper contract, as sglang 0.5.23's
  ``KTEPWrapperMethod`` drives it (:mod:`.wrapper`);
* :mod:`.plugin` — the ``sglang.srt.plugins`` entry point that installs it and adds
  ``--kt-mmap-experts-dir``;
* ``python -m torch_ktmoe.sglang <sglang serve args> [--kt-mmap-experts-dir DIR]`` —
  the same without the entry point (:mod:`.__main__`).

Importing this package does not import sglang.
"""
from .wrapper import METHOD_FORMATS, MMAP_DIR_ENV, KTMoEWrapper, weight_format_of

__all__ = ["KTMoEWrapper", "METHOD_FORMATS", "MMAP_DIR_ENV", "weight_format_of"]
