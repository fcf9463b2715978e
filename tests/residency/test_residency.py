"""Residency and fault statistics: resident_bytes (mincore), evict, major faults, memory_report."""
import gc

import torch

import torch_ktmoe
from torch_ktmoe import WeightArena

MiB = 1 << 20
SIZE = 32 * MiB


def _filled(arena, size=SIZE):
    t = arena.empty(size)
    t.view(torch.int32).copy_(torch.arange(size // 4, dtype=torch.int32))
    return t


def _intact(t):
    return torch.equal(t.view(torch.int32), torch.arange(t.numel() // 4, dtype=torch.int32))


def test_anonymous_allocations_count_as_resident():
    arena = WeightArena(None, "res-anon")
    t = arena.empty(3 * MiB + 5)
    t.fill_(3)
    assert arena.resident_bytes() == t.numel()
    arena.evict()  # a no-op: nothing to drop
    arena.prefault()
    assert arena.resident_bytes() == t.numel() and int(t.sum()) == 3 * t.numel()


def test_evict_drops_pages_and_reading_refaults_them(tmp_path):
    arena = WeightArena(tmp_path, "res-file")
    t = _filled(arena)
    assert arena.resident_bytes() >= SIZE  # just written: in the page cache
    arena.evict()
    after_evict = arena.resident_bytes()
    assert after_evict <= 0.05 * SIZE, after_evict
    majflt = torch_ktmoe.memory_report()["major_faults"]
    assert _intact(t)  # reads it back from disk
    r = torch_ktmoe.memory_report()
    assert r["major_faults"] > majflt
    assert arena.resident_bytes() >= 0.95 * SIZE


def test_memory_report_residency_and_per_layer(tmp_path):
    gc.collect()
    r0 = torch_ktmoe.memory_report()
    file_arena, anon_arena = WeightArena(tmp_path, "res-report-file"), WeightArena(None, "res-report-anon")
    t, u = _filled(file_arena), _filled(anon_arena, 4 * MiB)
    r1 = torch_ktmoe.memory_report(per_layer=True)
    assert r1["arena_resident_bytes"] - r0["arena_resident_bytes"] >= SIZE + 4 * MiB
    for key in ("arena_resident_bytes", "major_faults", "minor_faults"):
        assert isinstance(r1[key], int) and r1[key] >= 0
    assert "per_layer" not in r0
    rows = {row["name"]: row for row in r1["per_layer"]}
    f, a = rows["res-report-file"], rows["res-report-anon"]
    assert (f["dir"], f["file_backed_bytes"], f["anon_bytes"]) == (str(tmp_path), SIZE, 0)
    assert f["resident_bytes"] >= SIZE
    assert (a["dir"], a["file_backed_bytes"], a["resident_bytes"]) == ("", 0, 4 * MiB)
    file_arena.evict()
    r2 = torch_ktmoe.memory_report(per_layer=True)
    assert r1["arena_resident_bytes"] - r2["arena_resident_bytes"] >= 0.95 * SIZE
    del file_arena, anon_arena, t, u
    gc.collect()
    names = {row["name"] for row in torch_ktmoe.memory_report(per_layer=True)["per_layer"]}
    assert not names & {"res-report-file", "res-report-anon"}  # dead arenas leave the report
