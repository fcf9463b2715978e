"""Warm-on-load: KTMoE(warm=...) and KTMoE.warm() bring evicted experts back; outputs unchanged."""
import gc
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_ktmoe
from torch_ktmoe import KTMoE, memory
from tests.conftest import random_experts, random_routing

E, K, H, I = 16, 4, 256, 512  # 16 experts x 3 x 256 x 512 bf16 = 12 MiB packed
MiB = 1 << 20


def _evict(layer):
    for a in layer.arenas:
        a.evict()
    assert layer.resident_bytes <= 0.05 * layer.packed_bytes


def _layer(tmp_path, **kwargs):
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


def test_warm_none_is_default_and_bad_mode_is_refused(tmp_path):
    layer = _layer(tmp_path)
    assert layer.warm_mode == "none" and all(a.prefault_status == "" for a in layer.arenas)
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
