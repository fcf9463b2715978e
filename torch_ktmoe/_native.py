"""Loads the compiled extension (torch_ktmoe._C), or says how to build it.

The extension is compiled against one torch (its C++ ABI); the build writes that
version next to the module (``_C.torch-version``, see setup.py). It is compared
with the running torch *before* ``_C`` is imported, so a mismatch is a clear
message instead of an undefined-symbol traceback.
"""
import os

import torch

TORCH_VERSION_FILE = "_C.torch-version"
_REBUILD = ("Rebuild it against this torch: `make build` in the repository (or "
            "`python setup.py build_ext --inplace`), or `pip install --no-build-isolation .` "
            "in this environment.")


def _base(version: str) -> str:
    return version.split("+", 1)[0]  # "2.14.1+cu130" -> "2.14.1": local builds share the C++ ABI


def built_torch_version():
    """The torch version the extension was built against, or None when unknown."""
    try:
        with open(os.path.join(os.path.dirname(__file__), TORCH_VERSION_FILE)) as f:
            return f.read().strip() or None
    except OSError:
        return None


def check_torch_version(built, running: str) -> None:
    """Raises ImportError when ``built`` (a version string or None) differs from ``running``."""
    if built is not None and _base(built) != _base(running):
        raise ImportError(
            f"torch_ktmoe: the native extension was built against torch {built}, but torch {running} "
            f"is running; a C++ extension only loads into the torch it was compiled with. {_REBUILD}"
        )


check_torch_version(built_torch_version(), torch.__version__)

try:
    from . import _C  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only on a broken install
    raise ImportError(
        "torch_ktmoe: the native extension torch_ktmoe._C is not built or does not match the "
        f"installed torch {torch.__version__} ({exc}). {_REBUILD}"
    ) from exc
