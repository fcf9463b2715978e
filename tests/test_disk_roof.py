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


def test_disk_rates_share_of_both_roofs():
    r = disk_roof.disk_rates(2e9, 2.0, {"best": 2.0, "limited": 1.25})
    assert r == {"GBps": 1.0, "pct_of_roof": 50.0, "pct_of_limited": 80.0}
    assert disk_roof.disk_rates(2e9, 2.0, {"best": 2.0})["pct_of_limited"] is None


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
