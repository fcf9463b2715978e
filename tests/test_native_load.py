"""torch_ktmoe._native: the build-time torch version is recorded and checked before _C is imported.

The end-to-end case (the in-tree build imported under another torch) is in
tests/integration/test_sglang.py, where a second torch is installed.
"""
import pytest
import torch

from torch_ktmoe import _native


def test_torch_version_check_names_both_versions():
    built = _native.built_torch_version()
    assert built is not None and built.split("+")[0] == torch.__version__.split("+")[0]
    _native.check_torch_version("2.13.0+cpu", "2.13.0")  # local suffixes share the ABI
    _native.check_torch_version(None, "2.14.1")  # unknown (older build): the import itself decides
    with pytest.raises(ImportError, match=r"built against torch 2\.13\.0, but torch 2\.14\.1\+cu130 is running"):
        _native.check_torch_version("2.13.0", "2.14.1+cu130")
