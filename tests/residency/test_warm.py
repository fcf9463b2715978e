"""Warm-on-load: KTMoE(warm=...) and KTMoE.warm() bring evicted experts back; outputs unchanged."""
import gc
import hashlib
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_ktmoe
from torch_ktmoe import KTMoE, WeightArena, memory
from torch_ktmoe._native import _C
from tests.helpers import random_experts, random_routing

E, K, H, I = 16, 4, 256, 512  # 16 experts x 3 x 256 x 512 bf16 = 12 MiB packed
MiB = 1 << 20


def _evict(layer):
    for a in layer.arenas:
        a.evict()
    assert layer.resident_bytes <= 0.05 * layer.packed_bytes


def _layer(tmp_path, **kwargs):
    kwargs.setdefault("warm", "none")  # these tests warm by hand (warm="auto": test_warm_auto.py)
    layer = KTMoE(E, K, H, I, mmap_experts_dir=tmp_path, numa_parts=2, **kwargs)
    layer.load_weights(*random_experts(E, H, I, dtype=torch.bfloat16))
    return layer


@pytest.mark.parametrize("wait", [True, False])
def test_warm_after_evict_restores_residency_and_outputs(tmp_path, wait):
    layer = _layer(tmp_path)
    x = torch.randn(5, H, dtype=torch.bfloat16)
    ids, w = random_routing(5, E, K)
    before = layer(x, ids, w)
    _evict(layer)
    faults = torch_ktmoe.memory_report()["major_faults"]
    assert layer.warm(wait=wait) is True
    if not wait:
        layer.join_warm()
    assert layer.resident_bytes >= 0.99 * layer.packed_bytes
    assert all(a.prefault_status in ("populate_read", "willneed") for a in layer.arenas)
    assert torch_ktmoe.memory_report()["major_faults"] >= faults
    faults = torch_ktmoe.memory_report()["major_faults"]
    assert torch.equal(layer(x, ids, w), before)
    assert torch_ktmoe.memory_report()["major_faults"] == faults  # warm: nothing left to fault in


@pytest.mark.parametrize("mode", ["blocking", "background"])
def test_warm_argument(tmp_path, mode):
    layer = _layer(tmp_path, warm=mode)
    layer.join_warm()
    assert all(a.prefault_status == "populate_read" for a in layer.arenas)  # Linux >= 5.14 here
    assert layer.resident_bytes >= 0.99 * layer.packed_bytes


def test_warm_none_reads_nothing_and_bad_mode_is_refused(tmp_path):
    layer = _layer(tmp_path)
    assert layer.warm_mode == "none" and all(a.prefault_status == "" for a in layer.arenas)
    assert layer.model_warm is None
    with pytest.raises(ValueError, match="warm must be one of"):
        KTMoE(E, K, H, I, warm="eager")


def test_anonymous_warm_is_a_no_op():
    layer = KTMoE(E, K, H, I, warm="blocking")
    layer.load_weights(*random_experts(E, H, I))
    assert layer.warm() is True and layer.resident_bytes == layer.packed_bytes


def test_warm_skips_when_experts_do_not_fit(tmp_path, monkeypatch):
    layer = _layer(tmp_path)
    _evict(layer)
    monkeypatch.setattr(memory, "memory_headroom_bytes", lambda: layer.packed_bytes // 2)
    with pytest.warns(ResourceWarning, match="would evict"):
        assert layer.warm() is False
    assert layer.resident_bytes <= 0.05 * layer.packed_bytes


def test_memory_headroom_is_bounded_by_meminfo():
    with open("/proc/meminfo") as f:
        available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    headroom = memory.memory_headroom_bytes()
    assert 0 < headroom <= available * 1.1


def test_background_warm_never_blocks_teardown(tmp_path):
    """Dropping a layer (or exiting) while its background warm runs neither hangs nor crashes."""
    code = textwrap.dedent(f"""
        import gc, torch, torch_ktmoe
        arena = torch_ktmoe.WeightArena({str(tmp_path)!r}, "bg")
        t = arena.empty(256 << 20); t.fill_(1); arena.evict()
        arena.prefault(wait=False)
        del t, arena; gc.collect()               # destructor stops and joins the thread
        again = torch_ktmoe.WeightArena({str(tmp_path)!r}, "bg2")
        u = again.empty(256 << 20); u.fill_(2); again.evict()
        again.prefault(wait=False)                # still running at exit
        print("OK")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": ":".join(sys.path), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0 and "OK" in res.stdout, res.stdout + res.stderr
    gc.collect()


def _file_digest(path):
    with open(path, "rb") as f:
        return hashlib.blake2b(f.read(), digest_size=20).hexdigest()


@pytest.mark.parametrize("state", ["evicted", "cached_unmapped", "half_cached"])
def test_warm_from_each_residency_state_keeps_outputs_and_the_cache_file(tmp_path, state):
    """warm() reads what is missing (read()), reads what is cached, maps it all; bytes and outputs unchanged.

    evicted: nothing in the page cache; cached_unmapped: all of it in the page cache but
    not mapped here (as another process, or a cache check, leaves it); half_cached: every
    other MiB in the page cache.
    """
    layer = KTMoE(E, K, H, I, mmap_experts_dir=tmp_path, numa_parts=1, warm="none")
    layer.load_weights(*random_experts(E, H, I, dtype=torch.bfloat16))
    x = torch.randn(3, H, dtype=torch.bfloat16)
    ids, w = random_routing(3, E, K)
    before, fingerprint = layer(x, ids, w), layer.cache_fingerprint
    path = os.path.join(tmp_path, "layer0000.part0.ktmoe")
    digest = _file_digest(path)
    del layer
    gc.collect()
    layer = KTMoE(E, K, H, I, mmap_experts_dir=tmp_path, numa_parts=1, warm="none")
    assert layer.try_load_cached(fingerprint)
    _evict(layer)
    if state == "cached_unmapped":
        assert _C.WeightArena.read_file_through_cache(path) == os.path.getsize(path)
    elif state == "half_cached":
        with open(path, "rb") as f:
            for off in range(0, os.path.getsize(path), 2 * MiB):
                f.seek(off)
                f.read(MiB)
    assert layer.warm() is True
    assert all(a.prefault_status == "populate_read" for a in layer.arenas)
    assert layer.resident_bytes >= 0.99 * layer.packed_bytes
    faults = torch_ktmoe.memory_report()["major_faults"]
    assert torch.equal(layer(x, ids, w), before)
    assert torch_ktmoe.memory_report()["major_faults"] == faults  # warm left nothing to fault in
    del layer
    gc.collect()
    assert _file_digest(path) == digest  # warm only reads


def test_warm_keeps_a_page_written_in_this_process(tmp_path):
    """A page of a kept cache file written here (a private copy) keeps the write through warm()."""
    layer = _layer(tmp_path)
    path = os.path.join(tmp_path, "layer0000.part0.ktmoe")
    digest = _file_digest(path)
    layer.w13_0[0, 4096:4100] = 7  # past the expert's header: a private copy of that page
    assert layer.warm() is True
    assert bool((layer.w13_0[0, 4096:4100] == 7).all())
    assert _file_digest(path) == digest


def test_read_file_through_cache(tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(3 * MiB + 123))
    digest = _file_digest(data)
    fd = os.open(data, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    assert _C.WeightArena.read_file_through_cache(str(data)) == 3 * MiB + 123
    assert _file_digest(data) == digest
    os.symlink(data, tmp_path / "link.bin")
    with pytest.raises(RuntimeError):
        _C.WeightArena.read_file_through_cache(str(tmp_path / "link.bin"))  # no symlink followed
    with pytest.raises(RuntimeError):
        _C.WeightArena.read_file_through_cache(str(tmp_path / "missing.bin"))
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(RuntimeError):
        _C.WeightArena.read_file_through_cache(str(tmp_path / "fifo"))  # never blocks on a FIFO


def test_read_first_maps_the_same_experts(tmp_path):
    """load_or_build(read_first_max_bytes=) reads the kept file first; same tensors, file unchanged."""
    layer = KTMoE(E, K, H, I, mmap_experts_dir=tmp_path, numa_parts=1, warm="none")
    layer.load_weights(*random_experts(E, H, I, dtype=torch.bfloat16))
    key = layer._cache_key(0, layer.cache_fingerprint)
    path = os.path.join(tmp_path, "layer0000.part0.ktmoe")
    digest = _file_digest(path)
    _evict(layer)
    arena = WeightArena(tmp_path, "layer0000.part0", persistent=True)
    w13, w2, hit, reason = arena.load_or_build(key, "reuse", read_first_max_bytes=1 << 40)
    assert hit and reason == "valid" and arena.resident_bytes() >= 0.99 * arena.stats()["file_backed_bytes"]
    assert torch.equal(w13, layer.w13_0) and torch.equal(w2, layer.w2_0)
    missing = WeightArena(tmp_path, "layer0009.part0", persistent=True)
    assert missing.load_or_build(key, "reuse", read_first_max_bytes=1 << 40)[3] == "missing"  # no other answer
    del w13, w2, arena, layer
    gc.collect()
    assert _file_digest(path) == digest



def test_stop_prefault_stops_a_background_read_and_the_next_prefault_runs(tmp_path):
    arena = WeightArena(tmp_path, "stop")
    t = arena.empty(256 * MiB)
    t.fill_(5)
    arena.evict()
    arena.prefault(wait=False)
    arena.stop_prefault()  # returns within one 64 MiB step
    assert arena.prefault_status in ("error: stopped", "populate_read")
    assert arena.prefault_done_bytes <= 256 * MiB
    arena.prefault(wait=True)  # the stop is not sticky
    assert arena.prefault_status == "populate_read" and arena.prefault_done_bytes == 256 * MiB
    assert arena.resident_bytes() >= 0.99 * 256 * MiB
