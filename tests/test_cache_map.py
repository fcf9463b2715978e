"""The read-only cache policy, cache="map": a directory of packed files received as a model is only read.

No lock file, no cleanup of temp files, nothing created, written or deleted, also in a directory of
another user or one without write permission; a missing or invalid file is a miss naming the file."""
import hashlib
import os

import pytest
import torch

from tests.helpers import random_experts, random_routing
from torch_ktmoe import KTMoE

E, H, I, K = 4, 64, 96, 2
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown a directory to another user")


def layer(directory, layer_idx=0, **kwargs):
    return KTMoE(E, K, H, I, weight_format="int8", mmap_experts_dir=directory, numa_parts=2, layer_idx=layer_idx,
                 **kwargs)


def run(m):
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(0))
    return m(x, *random_routing(5, E, K))


def snapshot(directory) -> dict:
    """Every entry of the directory (and the directory itself): type, mode, owner, size, mtime, content hash."""
    out = {}
    for path in [directory, *(os.path.join(directory, n) for n in os.listdir(directory))]:
        st = os.lstat(path)
        digest = None
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as f:
                digest = hashlib.blake2b(f.read(), digest_size=16).hexdigest()
        out[os.path.basename(path)] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, digest)
    return out


@pytest.fixture
def packed(tmp_path):
    """A directory holding layer 0's kept files only (no lock files), a leftover temp file, and the reference."""
    d = tmp_path / "model"
    d.mkdir()
    m = layer(d)
    m.load_weights(*random_experts(E, H, I), fingerprint="model-v1")
    for name in os.listdir(d):
        if name.endswith(".lock"):
            os.unlink(d / name)
    (d / "layer0000.part0.ktmoe.tmp.999999").write_bytes(b"not ours to clean")
    return d, run(m)


def test_map_only_reads(packed):
    d, ref = packed
    before = snapshot(d)
    m = layer(d, cache="map")
    assert m.try_load_cached("model-v1") and m.cache_hit
    assert torch.equal(run(m), ref) and all(a.read_only for a in m.arenas)
    del m
    assert snapshot(d) == before


@pytest.mark.parametrize("owner", ["read_only_mode", pytest.param("other_uid", marks=root_only)])
def test_map_in_a_directory_we_cannot_or_must_not_write(packed, owner):
    d, ref = packed
    if owner == "other_uid":
        for path in [d, *(d / n for n in os.listdir(d))]:
            os.chown(path, 65534, 65534)
    os.chmod(d, 0o555)
    try:
        before = snapshot(d)
        m = layer(d, cache="map", cache_trust_others=owner == "other_uid")
        assert m.try_load_cached("model-v1") and torch.equal(run(m), ref)
        if owner == "other_uid":  # without trust: refused, and still nothing created
            refused = layer(d, cache="map")
            assert not refused.try_load_cached("model-v1")
            assert "untrusted: directory" in refused.cache_events[0]["reason"]
        assert snapshot(d) == before
    finally:
        os.chmod(d, 0o755)


def test_map_miss_names_the_file_and_never_packs(packed):
    d, _ = packed
    before = snapshot(d)
    missing = layer(d, layer_idx=7, cache="map")
    assert not missing.try_load_cached("model-v1")
    reason = missing.cache_events[0]["reason"]
    assert str(d / "layer0007.part0.ktmoe") in reason and reason.endswith("missing"), reason
    stale = layer(d, cache="map")
    assert not stale.try_load_cached("model-v2")
    assert "layer0000.part0.ktmoe" in stale.cache_events[0]["reason"] and "stale" in stale.cache_events[0]["reason"]
    with pytest.raises(ValueError, match="cache='map' only maps kept files"):
        stale.load_weights(*random_experts(E, H, I))
    assert snapshot(d) == before
