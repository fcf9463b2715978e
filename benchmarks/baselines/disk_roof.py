"""The disk's best read rate over given files, measured in the same run as the benchmark it is the roof of.

    python -m benchmarks.baselines.disk_roof FILE... [--max-gib 2]

Three read patterns, each after the files' pages were dropped from the page cache (``POSIX_FADV_DONTNEED`` per
file by default: clean pages that no process maps go; a benchmark that is root may pass a global drop instead):

* ``buffered_1``: one buffered sequential stream of 1 MiB ``pread`` s (what page faults plus the kernel's
  read-ahead get at best);
* ``direct_1``: ``O_DIRECT``, one stream of 4 MiB requests (the device without the page cache; None where the
  file system refuses ``O_DIRECT``, e.g. tmpfs);
* ``buffered_8``: buffered 1 MiB ``pread`` s from 8 threads, each streaming its own eighth of the bytes (the
  queue depth a reader pool can keep).

Each reads the same first ``max_bytes`` of the files (in the order given) and returns GB/s (1e9 bytes per
second); ``best`` is the highest. :func:`disk_rates` turns a run's bytes read and seconds into the figures the
benchmarks print beside it (achieved GB/s, % of ``best``).
"""
from __future__ import annotations

import argparse
import mmap
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

MiB = 1 << 20
GB = 1e9
PATTERNS = ("buffered_1", "direct_1", "buffered_8")

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


def _read_ranges(ranges: List[Range], request: int, direct: bool) -> int:
    """Reads ``ranges`` front to back in ``request``-byte preads; the bytes read."""
    buf = mmap.mmap(-1, request)  # page-aligned: what O_DIRECT needs
    view, done = memoryview(buf), 0
    try:
        for path, off, n in ranges:
            fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
            try:
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


def measure(ranges: List[Range], pattern: str) -> Optional[float]:
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
    else:
        raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
    return n / s / GB if s > 0 else None


def disk_roof(paths: Sequence[str], max_bytes: int = 2 << 30,
              drop: Optional[Callable[[Sequence[str]], None]] = None) -> dict:
    """The three patterns over the first ``max_bytes`` of ``paths``, each after ``drop(paths)`` (default
    :func:`drop_file_pages`): ``{pattern: GB/s or None, "best": GB/s, "bytes": bytes read per pattern}``."""
    paths = list(paths)
    if not paths:
        raise ValueError("disk_roof: no files given")
    drop = drop or drop_file_pages
    ranges = byte_ranges(paths, max_bytes)
    roof = {}
    for pattern in PATTERNS:
        drop(paths)
        roof[pattern] = measure(ranges, pattern)
    drop(paths)
    roof["best"] = max(v for v in roof.values() if v is not None)
    roof["bytes"] = sum(n for _, _, n in ranges)
    return roof


def disk_rates(read_bytes: float, seconds: float, roof: Optional[dict]) -> dict:
    """A run's achieved disk rate (``read_bytes`` over ``seconds``) and its share of ``roof["best"]``."""
    rate = read_bytes / seconds / GB if seconds > 0 else None
    best = roof.get("best") if roof else None
    return dict(GBps=rate, pct_of_roof=100 * rate / best if rate is not None and best else None)


def roof_line(roof: dict) -> str:
    """One line for a benchmark's output: the three rates and the best."""
    parts = [f"{p} {roof[p]:.2f}" if roof.get(p) is not None else f"{p} -" for p in PATTERNS]
    return (f"disk roof over {roof['bytes'] / GB:.2f} GB, page cache dropped before each (GB/s): "
            f"{', '.join(parts)}; best {roof['best']:.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--max-gib", type=float, default=2.0, help="bytes read per pattern")
    args = ap.parse_args(argv)
    print(roof_line(disk_roof(args.files, int(args.max_gib * (1 << 30)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
