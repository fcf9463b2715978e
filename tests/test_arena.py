"""WeightArena: anonymous vs file-backed memory, fallbacks, lifetime, threads, memory limits."""
import gc
import os
import resource
import shutil
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest
import torch

import torch_ktmoe
from torch_ktmoe import ArenaFallbackWarning, WeightArena
from tests.cgroup_utils import needs_memory_cgroup, run_in_memory_cgroup

MiB = 1 << 20


def fill_pattern(t: torch.Tensor, seed: int) -> None:
    """Writes a position- and seed-dependent pattern into a uint8 tensor."""
    t.copy_((torch.arange(t.numel(), dtype=torch.int64) * 7 + seed).to(torch.uint8).view(t.shape))


def pattern_ok(t: torch.Tensor, seed: int) -> bool:
    expect = (torch.arange(t.numel(), dtype=torch.int64) * 7 + seed).to(torch.uint8)
    return torch.equal(t.reshape(-1), expect)


def open_fds():
    return set(os.listdir("/proc/self/fd"))


def arena_fds(directory):
    """Descriptors of this process that point into directory."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory)):
            out.append(target)
    return out


# ---------------------------------------------------------------- modes
@pytest.mark.parametrize("file_backed", [False, True])
def test_bytes_round_trip_and_alignment(tmp_path, file_backed):
    arena = WeightArena(tmp_path if file_backed else None, "rt")
    tensors = [arena.empty(n) for n in (1, 100, 3 * MiB + 5, 64, 2 * MiB)]
    for i, t in enumerate(tensors):
        fill_pattern(t, i)
        align = 2 * MiB if file_backed else 64
        assert t.data_ptr() % align == 0
    for i, t in enumerate(tensors):
        assert pattern_ok(t, i)
    s = arena.stats()
    assert s["allocations"] == 5 and s["fallbacks"] == 0
    total = sum(t.numel() for t in tensors)
    assert (s["file_backed_bytes"], s["anon_bytes"]) == ((total, 0) if file_backed else (0, total))
    assert arena.file_mode == file_backed


def test_anonymous_mode_creates_no_file(tmp_path):
    before = open_fds()
    arena = WeightArena(None, "anon")
    t = arena.empty(4 * MiB)
    fill_pattern(t, 1)
    assert open_fds() == before
    assert not arena.file_mode and arena.file_bytes == 0


def test_file_mode_leaves_no_name_behind(tmp_path):
    arena = WeightArena(tmp_path, "nameless")
    t = arena.empty(3 * MiB)
    fill_pattern(t, 3)
    assert os.listdir(tmp_path) == []                       # unlinked at once
    assert len(arena_fds(tmp_path)) == 1                    # but open
    assert arena.file_bytes == 4 * MiB                      # 2 MiB rounded
    del arena, t
    gc.collect()
    assert arena_fds(tmp_path) == []


def test_file_backed_pages_are_shared_file_mappings(tmp_path):
    arena = WeightArena(tmp_path, "maps")
    t = arena.empty(2 * MiB)
    fill_pattern(t, 0)
    start = t.data_ptr()
    with open("/proc/self/maps") as f:
        rows = [r for r in f if int(r.split("-")[0], 16) == start]
    assert rows, "slice not found in /proc/self/maps"
    perms, path = rows[0].split()[1], rows[0].split(maxsplit=5)[-1]
    assert perms.startswith("rw") and perms[3] == "s"       # MAP_SHARED
    assert str(tmp_path) in path


# ---------------------------------------------------------------- fallbacks
def _expect_fallback(arena, match):
    with pytest.warns(ArenaFallbackWarning, match=match):
        t = arena.empty(MiB)
    fill_pattern(t, 5)
    assert pattern_ok(t, 5)
    s = arena.stats()
    assert s["fallbacks"] == 1 and s["file_backed_bytes"] == 0 and s["anon_bytes"] == MiB
    assert len(s["fallback_reasons"]) == 1 and "anonymous" in s["fallback_reasons"][0]
    with warnings.catch_warnings():  # warns once per arena
        warnings.simplefilter("error")
        arena.empty(64)
    assert arena.stats()["fallbacks"] == 2
    return s["fallback_reasons"][0]


def test_fallback_missing_directory(tmp_path):
    reason = _expect_fallback(WeightArena(tmp_path / "nope", "x"), "No such file or directory")
    assert "nope" in reason
    assert torch_ktmoe.memory_report()["arena_fallbacks"] >= 1


def test_fallback_not_a_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    _expect_fallback(WeightArena(tmp_path / "file", "x"), "not a directory")


def test_fallback_unwritable_directory(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() != 0:
        d.chmod(0o500)
    elif shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(d)]).returncode != 0:
        pytest.skip("running as root and cannot make the directory immutable (chattr +i)")
    try:
        _expect_fallback(WeightArena(d, "x"), "cannot create a file")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(d)])
        d.chmod(0o700)


def test_fallback_tmpfs_directory():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm on this host")
    fs = subprocess.run(["stat", "-f", "-c", "%T", "/dev/shm"], capture_output=True, text=True).stdout.strip()
    if fs not in ("tmpfs", "ramfs"):
        pytest.skip(f"/dev/shm is {fs}, not tmpfs")
    _expect_fallback(WeightArena("/dev/shm", "x"), "tmpfs")


@pytest.mark.parametrize("name", ["", "a/b", "..", "x" * 201])
def test_fallback_invalid_name(tmp_path, name):
    _expect_fallback(WeightArena(tmp_path, name), "invalid arena name")
    assert os.listdir(tmp_path) == []


def test_fallback_no_space(tmp_path):
    """A file-size limit stands in for a full disk: fallocate fails, no SIGBUS, no loss."""
    code = textwrap.dedent(f"""
        import resource, signal, warnings, torch, torch_ktmoe
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        arena = torch_ktmoe.WeightArena({str(tmp_path)!r}, "full")
        first = arena.empty(2 << 20)            # fits under the limit
        first.fill_(7)
        resource.setrlimit(resource.RLIMIT_FSIZE, (3 << 20, 3 << 20))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            second = arena.empty(2 << 20)       # would need 4 MiB of file
        second.fill_(9)
        s = arena.stats()
        assert s["fallbacks"] == 1 and s["file_backed_bytes"] == 2 << 20, s
        assert "fallocate" in s["fallback_reasons"][0], s
        assert w and "fallocate" in str(w[0].message)
        assert int(first.sum()) == 7 * (2 << 20) and int(second.sum()) == 9 * (2 << 20)
        print("OK", s["fallback_reasons"][0])
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OK" in res.stdout and ("too large" in res.stdout or "space" in res.stdout)


# ---------------------------------------------------------------- lifetime, leaks, threads
def test_no_leaked_mappings_or_descriptors(tmp_path):
    def count_maps():
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    def cycle(i):
        arena = WeightArena(tmp_path if i % 2 else None, f"c{i}")
        for n in (MiB, 3 * MiB, 100):
            fill_pattern(arena.empty(n), i)

    cycle(0), cycle(1)  # warm up allocator pools
    gc.collect()
    maps, fds = count_maps(), open_fds()
    for i in range(100):  # a leak per cycle shows as 50+ mappings or descriptors
        cycle(i)
    gc.collect()
    assert open_fds() == fds
    assert count_maps() <= maps + 2  # allow the allocator a stray mapping, never one per cycle
    assert arena_fds(tmp_path) == []


@pytest.mark.parametrize("file_backed", [False, True])
def test_tensors_outlive_the_arena_object(tmp_path, file_backed):
    arena = WeightArena(tmp_path if file_backed else None, "outlive")
    a, b = arena.empty(3 * MiB), arena.empty(5000)
    fill_pattern(a, 11), fill_pattern(b, 12)
    view = a[MiB:]
    before = torch_ktmoe.memory_report()["arenas"]
    del arena, a
    gc.collect()
    assert pattern_ok(b, 12)
    assert torch.equal(view, (torch.arange(MiB, 3 * MiB, dtype=torch.int64) * 7 + 11).to(torch.uint8))
    assert torch_ktmoe.memory_report()["arenas"] == before  # still alive through the tensors
    del b, view
    gc.collect()
    assert torch_ktmoe.memory_report()["arenas"] == before - 1
    assert arena_fds(tmp_path) == []


def test_concurrent_alloc(tmp_path):
    arena = WeightArena(tmp_path, "threads")
    results, errors = {}, []

    def worker(w):
        try:
            mine = []
            for i in range(10):
                t = arena.empty(MiB + 4096 * (w + i))
                fill_pattern(t, w * 16 + i)
                mine.append(t)
            results[w] = mine
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    spans = []
    for w, mine in results.items():
        for i, t in enumerate(mine):
            assert pattern_ok(t, w * 16 + i)
            spans.append((t.data_ptr(), t.data_ptr() + t.numel()))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "slices overlap"
    s = arena.stats()
    assert s["allocations"] == 80 and s["fallbacks"] == 0
    assert arena.file_bytes == 80 * 2 * MiB


# ---------------------------------------------------------------- memory report
def test_memory_report_puts_file_backed_bytes_under_file_rss(tmp_path):
    size = 256 * MiB
    r0 = torch_ktmoe.memory_report()
    arena = WeightArena(tmp_path, "rss")
    t = arena.empty(size)
    t.fill_(1)
    arena.writeback()
    r1 = torch_ktmoe.memory_report()
    assert r1["file_rss_bytes"] - r0["file_rss_bytes"] >= 0.9 * size
    assert r1["anon_rss_bytes"] - r0["anon_rss_bytes"] < 0.1 * size
    assert r1["arena_file_backed_bytes"] - r0["arena_file_backed_bytes"] == size
    anon = WeightArena(None, "rss-anon")
    u = anon.empty(size)
    u.fill_(1)
    r2 = torch_ktmoe.memory_report()
    assert r2["anon_rss_bytes"] - r1["anon_rss_bytes"] >= 0.9 * size
    assert r2["arena_anon_bytes"] - r1["arena_anon_bytes"] == size
    for key in ("anon_rss_bytes", "file_rss_bytes", "swap_bytes", "arenas", "arena_allocations",
                "arena_file_backed_bytes", "arena_anon_bytes", "arena_fallbacks"):
        assert isinstance(r2[key], int)
    del t, u


# ---------------------------------------------------------------- the point of it all
@needs_memory_cgroup
def test_file_backed_arena_survives_a_memory_limit_that_kills_anonymous(tmp_path):
    limit, slices, slice_bytes = 384 * MiB, 24, 32 * MiB   # 768 MiB of weights = 2x the limit
    code = textwrap.dedent(f"""
        import sys, torch, torch_ktmoe
        torch.set_num_threads(1)
        directory = sys.argv[1] if len(sys.argv) > 1 else {str(tmp_path)!r}
        arena = torch_ktmoe.WeightArena(directory if "{{mode}}" == "file" else None, "limit")
        parts = []
        for i in range({slices}):
            t = arena.empty({slice_bytes})
            t.view(torch.int64).copy_(torch.arange({slice_bytes} // 8) * 31 + i)
            arena.writeback()  # turn the slice into clean, reclaimable page cache
            parts.append(t)
        for i, t in enumerate(parts):
            assert torch.equal(t.view(torch.int64), torch.arange({slice_bytes} // 8) * 31 + i), i
        print("COMPLETED", arena.stats()["file_backed_bytes"], arena.stats()["fallbacks"])
    """)
    file_res = run_in_memory_cgroup("ktmoe_test_file", limit, code.replace("{mode}", "file"))
    assert file_res.returncode == 0, file_res.stdout + file_res.stderr
    assert f"COMPLETED {slices * slice_bytes} 0" in file_res.stdout
    anon_res = run_in_memory_cgroup("ktmoe_test_anon", limit, code.replace("{mode}", "anon"))
    assert anon_res.returncode == -9 and "COMPLETED" not in anon_res.stdout, (
        f"anonymous arena was expected to be OOM-killed: rc={anon_res.returncode} {anon_res.stdout}")
