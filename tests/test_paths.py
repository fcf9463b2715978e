"""Paths that are not UTF-8 get an error naming them at the first Python boundary, never a pybind TypeError."""
import os

import pytest

from torch_ktmoe import KTMoE, WeightArena
from torch_ktmoe.paths import utf8_path

BAD = os.fsdecode(b"/tmp/ktmoe-\xff-dir")  # a surrogate-escaped str, as os.listdir returns for such a name


def test_utf8_path_accepts_str_bytes_and_pathlike(tmp_path):
    assert utf8_path(tmp_path, "d") == str(tmp_path)
    assert utf8_path(os.fsencode(tmp_path), "d") == str(tmp_path)


@pytest.mark.parametrize("make", [
    lambda: KTMoE(4, 2, 32, 32, mmap_experts_dir=BAD),
    lambda: WeightArena(BAD, "layer0000.part0"),
], ids=["KTMoE", "WeightArena"])
def test_non_utf8_directory_is_refused_by_name(make):
    with pytest.raises(ValueError, match=r"not a valid UTF-8 path.*0xff"):
        make()
