"""Loads the compiled extension (torch_ktmoe._C), or says how to build it."""
import torch  # noqa: F401  (loads libtorch before the extension)

try:
    from . import _C  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only on a broken install
    raise ImportError(
        "torch_ktmoe: the native extension torch_ktmoe._C is not built or does not match the "
        f"installed torch {torch.__version__} ({exc}). Build it in the repository with "
        "`make build` (or `python setup.py build_ext --inplace`), or install with "
        "`pip install --no-build-isolation .` — it needs torch==2.13.*."
    ) from exc
