"""The disk's best read rate over given files, measured in the same run as the benchmark it is the roof of.

    python -m benchmarks.baselines.disk_roof FILE... [--max-gib 2] [--limit-mib N]

Four read patterns, each after the files' pages were dropped from the page cache (``POSIX_FADV_DONTNEED`` per
file by default: clean pages that no process maps go; a benchmark that is root may pass a global drop instead):

* ``buffered_1``: one buffered sequential stream of 1 MiB ``pread`` s (what page faults plus the kernel's
  read-ahead get at best);
* ``direct_1``: ``O_DIRECT``, one stream of 4 MiB requests (the device without the page cache; None where the
  file system refuses ``O_DIRECT``, e.g. tmpfs);
* ``buffered_8``: buffered 1 MiB ``pread`` s from 8 threads, each streaming its own eighth of the bytes (the
  queue depth a reader pool can keep);
* ``runs_8``: the same bytes cut into runs of ``run_bytes`` (a routed expert's packed rows: one contiguous run
  each) read in a shuffled order, buffered 1 MiB ``pread`` s from 8 threads, ``POSIX_FADV_RANDOM`` so that a run
  reads its bytes only: the best a decode can get, which reads whichever experts the router picks.

Each reads the same first ``max_bytes`` of the files (in the order given) and returns GB/s (1e9 bytes per
second); ``best`` is the highest. :func:`disk_rates` turns a run's bytes read and seconds into the figures the
benchmarks print beside it (achieved GB/s, % of ``best``, % of ``runs_8``). :func:`disk_busy_ms` reads the
device's busy time (``io_ticks``), so a benchmark can say for what share of its decode the disk had a request
in flight.

:func:`limited_rate` is the same ``buffered_8`` read by a child process inside a fresh memory cgroup of a
benchmark's limit, timed once the cgroup is full: every page read then first reclaims one (the reader's own
direct reclaim), which is what a decode under that limit pays too; :func:`disk_rates` gives a run's share of it
as well (``pct_of_limited``). On the measured host (2.9 GB of cache files, 1 GiB cgroup, three runs) it read
2.8-3.1 GB/s where the same reads without a limit got 2.0-3.6: the limit's reclaim does not cap the disk rate.
"""
from __future__ import annotations

import argparse
import mmap
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

MiB = 1 << 20
GB = 1e9
PATTERNS = ("buffered_1", "direct_1", "buffered_8", "runs_8")
RUN_BYTES = 2 * MiB  # runs_8's default run: about an expert's gate/up rows on the reference shapes

Range = Tuple[str, int, int]  # (path, offset, length)


def drop_file_pages(paths: Iterable[str]) -> None:
    """Drops the clean, unmapped page-cache pages of ``paths`` (``POSIX_FADV_DONTNEED``; nothing global)."""
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def byte_ranges(paths: Sequence[str], max_bytes: int) -> List[Range]:
    """The first ``max_bytes`` of the files, in order, as (path, offset, length)."""
    out, left = [], max_bytes
    for path in paths:
        size = min(os.path.getsize(path), left)
        if size > 0:
            out.append((path, 0, size))
            left -= size
        if left <= 0:
            break
    return out


def split_ranges(ranges: List[Range], parts: int) -> List[List[Range]]:
    """``ranges`` cut into ``parts`` contiguous pieces of about equal bytes."""
    total = sum(n for _, _, n in ranges)
    share = -(-total // parts)
    pieces, piece, room = [], [], share
    for path, off, n in ranges:
        while n > 0:
            take = min(n, room)
            piece.append((path, off, take))
            off, n, room = off + take, n - take, room - take
            if room == 0:
                pieces.append(piece)
                piece, room = [], share
    if piece:
        pieces.append(piece)
    return pieces


def shuffled_runs(ranges: List[Range], run_bytes: int, seed: int = 0) -> List[Range]:
    """``ranges`` cut into runs of ``run_bytes`` (the last of each range shorter), in a seeded random order:
    every byte once."""
    if run_bytes <= 0:
        raise ValueError(f"run_bytes must be > 0, got {run_bytes}")
    runs = [(path, o, min(run_bytes, off + n - o)) for path, off, n in ranges for o in range(off, off + n, run_bytes)]
    random.Random(seed).shuffle(runs)
    return runs


def _read_ranges(ranges: List[Range], request: int, direct: bool, no_readahead: bool = False) -> int:
    """Reads ``ranges`` front to back in ``request``-byte preads (``no_readahead``: ``POSIX_FADV_RANDOM`` on
    each descriptor, so nothing past a range is read); the bytes read."""
    buf = mmap.mmap(-1, request)  # page-aligned: what O_DIRECT needs
    view, done = memoryview(buf), 0
    try:
        for path, off, n in ranges:
            fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
            try:
                if no_readahead:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                end = off + n
                if direct:  # O_DIRECT: aligned offsets and lengths
                    off -= off % 4096
                while off < end:
                    want = min(request, end - off)
                    if direct:
                        want = -(-want // 4096) * 4096
                    got = os.preadv(fd, [view[:want]], off)
                    if got <= 0:
                        break
                    done += min(got, end - off)
                    off += got
            finally:
                os.close(fd)
    finally:
        view.release()
        buf.close()
    return done


def _timed(fn: Callable[[], int]) -> Tuple[int, float]:
    t0 = time.perf_counter()
    n = fn()
    return n, time.perf_counter() - t0


def measure(ranges: List[Range], pattern: str, run_bytes: int = RUN_BYTES) -> Optional[float]:
    """GB/s of one pattern over ``ranges`` (page cache not dropped here); None when O_DIRECT is refused."""
    if pattern == "buffered_1":
        n, s = _timed(lambda: _read_ranges(ranges, MiB, False))
    elif pattern == "direct_1":
        try:
            n, s = _timed(lambda: _read_ranges(ranges, 4 * MiB, True))
        except OSError:  # EINVAL: the file system does not do O_DIRECT
            return None
    elif pattern == "buffered_8":
        pieces = split_ranges(ranges, 8)
        with ThreadPoolExecutor(len(pieces)) as pool:
            n, s = _timed(lambda: sum(pool.map(lambda p: _read_ranges(p, MiB, False), pieces)))
    elif pattern == "runs_8":
        runs = shuffled_runs(ranges, run_bytes)
        with ThreadPoolExecutor(8) as pool:
            n, s = _timed(lambda: sum(pool.map(lambda i: _read_ranges(runs[i::8], MiB, False, True), range(8))))
    else:
        raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
    return n / s / GB if s > 0 else None


def disk_roof(paths: Sequence[str], max_bytes: int = 2 << 30,
              drop: Optional[Callable[[Sequence[str]], None]] = None, run_bytes: int = RUN_BYTES) -> dict:
    """The patterns over the first ``max_bytes`` of ``paths``, each after ``drop(paths)`` (default
    :func:`drop_file_pages`; ``runs_8`` in runs of ``run_bytes``): ``{pattern: GB/s or None, "best": GB/s,
    "bytes": bytes read per pattern, "run_bytes": run_bytes}``."""
    paths = list(paths)
    if not paths:
        raise ValueError("disk_roof: no files given")
    drop = drop or drop_file_pages
    ranges = byte_ranges(paths, max_bytes)
    roof = {}
    for pattern in PATTERNS:
        drop(paths)
        roof[pattern] = measure(ranges, pattern, run_bytes)
    drop(paths)
    roof["best"] = max(v for v in roof.values() if v is not None)
    roof["bytes"] = sum(n for _, _, n in ranges)
    roof["run_bytes"] = run_bytes
    return roof


LIMITED_CHILD = r"""
import sys
from benchmarks.baselines.disk_roof import byte_ranges, measure, split_at
limit, max_bytes, pattern, paths = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
fill, timed = split_at(byte_ranges(paths, limit + max_bytes), limit)
measure(fill, "buffered_8")  # the cgroup fills up: from here on each page read reclaims one
print(measure(timed, pattern) if timed else None)
"""


def split_at(ranges: List[Range], first: int) -> Tuple[List[Range], List[Range]]:
    """``ranges`` cut after their first ``first`` bytes: (those, the rest)."""
    head, tail, left = [], [], first
    for path, off, n in ranges:
        take = min(n, max(left, 0))
        if take:
            head.append((path, off, take))
        if n > take:
            tail.append((path, off + take, n - take))
        left -= take
    return head, tail


def limited_rate(paths: Sequence[str], limit_bytes: int, max_bytes: int = 2 << 30, pattern: str = "buffered_8",
                 drop: Optional[Callable[[Sequence[str]], None]] = None) -> Optional[float]:
    """GB/s of ``pattern`` over ``max_bytes`` of ``paths`` read by a child process in a fresh memory cgroup of
    ``limit_bytes`` (no swap) after it read the ``limit_bytes`` before them untimed, the files' pages dropped
    first; None where the files hold no bytes past the limit, or no cgroup can be made (not root, no v1). The
    limit holds the reader process too (~20 MiB of a Python process, against a benchmark child's few hundred)."""
    from ktmoe_harness.memcg import memory_cgroup_available, run_in_memory_cgroup

    paths = list(paths)
    if not memory_cgroup_available() or sum(os.path.getsize(p) for p in paths) <= limit_bytes:
        return None
    (drop or drop_file_pages)(paths)
    res = run_in_memory_cgroup(f"ktmoe_disk_roof_{os.getpid()}", limit_bytes, LIMITED_CHILD,
                               [limit_bytes, max_bytes, pattern, *paths], timeout=1800)
    (drop or drop_file_pages)(paths)
    if res.returncode != 0:
        raise RuntimeError(f"limited_rate: the reader in the cgroup failed (rc {res.returncode}): {res.stderr[-800:]}")
    out = res.stdout.strip().splitlines()[-1]
    return None if out == "None" else float(out)


def disk_rates(read_bytes: float, seconds: float, roof: Optional[dict]) -> dict:
    """A run's achieved disk rate (``read_bytes`` over ``seconds``), its share of ``roof["best"]``, of
    ``roof["runs_8"]`` (runs in random order) and of ``roof["limited"]`` (the best under the run's memory limit,
    :func:`limited_rate`) where the roof has them."""
    rate = read_bytes / seconds / GB if seconds > 0 else None
    share = lambda key: 100 * rate / roof[key] if rate is not None and roof and roof.get(key) else None  # noqa: E731
    return dict(GBps=rate, pct_of_roof=share("best"), pct_of_runs=share("runs_8"), pct_of_limited=share("limited"))


def disk_busy_ms(path: str) -> Optional[int]:
    """Milliseconds the device (or partition) holding ``path`` has had at least one request in flight since boot
    (``io_ticks``, the 10th field of its /sys stat: every process's requests, not only this one's); None where
    no block device holds it (tmpfs, overlayfs: device major 0)."""
    dev = os.stat(path).st_dev
    stat = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat"
    if os.major(dev) == 0 or not os.path.exists(stat):
        return None
    with open(stat) as f:
        return int(f.read().split()[9])


def roof_line(roof: dict) -> str:
    """One line for a benchmark's output: the rates and the best (and the best under a limit, if any)."""
    runs = f" ({roof['run_bytes'] / MiB:.1f} MiB runs, random order)" if "run_bytes" in roof else ""
    parts = [(f"{p} {roof[p]:.2f}" if roof.get(p) is not None else f"{p} -") + (runs if p == "runs_8" else "")
             for p in PATTERNS]
    limited = (f"; buffered_8 under the {roof['limit_bytes'] / MiB:.0f} MiB limit, cgroup full, "
               f"{roof['limited']:.2f}") if roof.get("limited") else ""
    return (f"disk roof over {roof['bytes'] / GB:.2f} GB, page cache dropped before each (GB/s): "
            f"{', '.join(parts)}; best {roof['best']:.2f}{limited}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--max-gib", type=float, default=2.0, help="bytes read per pattern")
    ap.add_argument("--run-mib", type=float, default=RUN_BYTES / MiB, help="runs_8's run length")
    ap.add_argument("--limit-mib", type=int, default=0, help="also buffered_8 in a full memory cgroup of this size")
    args = ap.parse_args(argv)
    roof = disk_roof(args.files, int(args.max_gib * (1 << 30)), run_bytes=int(args.run_mib * MiB))
    if args.limit_mib:
        roof.update(limit_bytes=args.limit_mib * MiB,
                    limited=limited_rate(args.files, args.limit_mib * MiB, int(args.max_gib * (1 << 30))))
    print(roof_line(roof))
    return 0


if __name__ == "__main__":
    sys.exit(main())
