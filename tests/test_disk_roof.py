"""benchmarks.baselines.disk_roof: the byte ranges each pattern reads, and the best rate under a memory limit."""
import os

import pytest

from benchmarks.baselines import disk_roof
from tests.cgroup_utils import needs_memory_cgroup

MiB = 1 << 20


def test_split_at_cuts_inside_a_range_and_keeps_every_byte():
    ranges = [("a", 0, 10), ("b", 0, 7), ("c", 5, 3)]
    head, tail = disk_roof.split_at(ranges, 13)
    assert head == [("a", 0, 10), ("b", 0, 3)]
    assert tail == [("b", 3, 4), ("c", 5, 3)]
    assert disk_roof.split_at(ranges, 0) == ([], ranges)
    assert disk_roof.split_at(ranges, 100) == (ranges, [])


def test_disk_rates_share_of_each_roof():
    r = disk_roof.disk_rates(2e9, 2.0, {"best": 2.0, "runs_8": 1.6, "limited": 1.25})
    assert r == {"GBps": 1.0, "pct_of_roof": 50.0, "pct_of_runs": 62.5, "pct_of_limited": 80.0}
    r = disk_roof.disk_rates(2e9, 2.0, {"best": 2.0})
    assert r["pct_of_limited"] is None and r["pct_of_runs"] is None


def test_shuffled_runs_hold_every_byte_once_in_another_order():
    ranges = [("a", 0, 10 * MiB), ("b", 4096, 5 * MiB + 123)]
    runs = disk_roof.shuffled_runs(ranges, 2 * MiB)
    covered = {p: sorted((o, n) for q, o, n in runs if q == p) for p in "ab"}
    assert covered["a"] == [(o, 2 * MiB) for o in range(0, 10 * MiB, 2 * MiB)]
    assert covered["b"] == [(4096, 2 * MiB), (4096 + 2 * MiB, 2 * MiB), (4096 + 4 * MiB, MiB + 123)]
    assert runs != sorted(runs) and runs == disk_roof.shuffled_runs(ranges, 2 * MiB)  # shuffled, seeded
    with pytest.raises(ValueError, match="run_bytes must be > 0"):
        disk_roof.shuffled_runs(ranges, 0)


def test_runs_pattern_reads_exactly_the_bytes_of_the_runs(tmp_path):
    paths = _files(tmp_path, [3 * MiB + 5, 2 * MiB])
    ranges = disk_roof.byte_ranges(paths, 4 * MiB)
    runs = disk_roof.shuffled_runs(ranges, MiB // 2)
    assert disk_roof._read_ranges(runs, MiB, False, True) == 4 * MiB
    assert disk_roof.measure(ranges, "runs_8", MiB // 2) > 0
    roof = disk_roof.disk_roof(paths, 4 * MiB, run_bytes=MiB)
    assert set(disk_roof.PATTERNS) <= set(roof) and roof["run_bytes"] == MiB
    assert "runs_8" in disk_roof.roof_line(roof) and "1.0 MiB runs" in disk_roof.roof_line(roof)


def test_disk_busy_ms_of_a_block_device_and_of_none(tmp_path):
    busy = disk_roof.disk_busy_ms(str(tmp_path))
    assert busy is None or (isinstance(busy, int) and busy >= 0)  # None: tmp_path on tmpfs or overlayfs
    if os.path.isdir("/dev/shm"):  # tmpfs: no block device behind it
        assert disk_roof.disk_busy_ms("/dev/shm") is None


def _files(tmp_path, sizes):
    paths = []
    for i, size in enumerate(sizes):
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom(size))
        paths.append(str(p))
    return paths


@needs_memory_cgroup
def test_limited_rate_reads_past_the_limit_in_a_cgroup(tmp_path):
    paths = _files(tmp_path, [48 * MiB, 48 * MiB])  # the limit holds the reader process too (~20 MiB)
    rate = disk_roof.limited_rate(paths, 64 * MiB, max_bytes=16 * MiB)
    assert rate is not None and rate > 0
    # files no larger than the limit: nothing past it to time
    assert disk_roof.limited_rate(paths[:1], 64 * MiB) is None
    line = disk_roof.roof_line({"buffered_1": 1.0, "direct_1": None, "buffered_8": 2.0, "best": 2.0,
                                "bytes": 8 * MiB, "limited": rate, "limit_bytes": 64 * MiB})
    assert "under the 64 MiB limit" in line


@needs_memory_cgroup
def test_limited_rate_says_why_its_reader_failed(tmp_path):
    paths = _files(tmp_path, [80 * MiB])
    with pytest.raises(RuntimeError, match="pattern must be one of"):
        disk_roof.limited_rate(paths, 64 * MiB, max_bytes=8 * MiB, pattern="sideways")
