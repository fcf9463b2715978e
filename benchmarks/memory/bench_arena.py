"""Weight arena: anonymous vs file-backed, with and without MADV_HUGEPAGE.

Run: python -m benchmarks.memory.bench_arena [--gib 1] [--slice-mib 16] [--repeats 3]

Per mode, for --gib GiB in slices of --slice-mib MiB: allocation time, first write
(the packing pass) GB/s, anonymous / file RSS growth (memory_report), read GB/s
of the resident slices, and FilePmdMapped (file pages mapped 2 MiB at a time).
Medians of repeats. (A cold read needs the pages evicted while mapped, which
drop_caches does not do; bench_memory.py measures cold starts in a new process.)
Prints a markdown table and writes benchmarks/results/bench_arena.json (--out).
"""
import argparse
import gc
import os
import statistics
import tempfile
import time

import torch

import torch_ktmoe
from benchmarks.cli import add_out_argument, write_result
from benchmarks.baselines.roofs import read_seconds
from torch_ktmoe import WeightArena

MiB = 1 << 20


def one_run(directory, hugepage, total, slice_bytes):
    gc.collect()
    r0 = torch_ktmoe.memory_report()
    arena = WeightArena(directory, "bench", hugepage=hugepage)
    t0 = time.perf_counter()
    slices = [arena.empty(slice_bytes) for _ in range(total // slice_bytes)]
    t_alloc = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i, s in enumerate(slices):
        s.fill_(i & 0xFF)
    t_write = time.perf_counter() - t0
    arena.writeback()
    r1 = torch_ktmoe.memory_report()
    read_seconds(slices, torch.get_num_threads())  # warm
    warm = min(read_seconds(slices, torch.get_num_threads()) for _ in range(3))
    pmd = torch_ktmoe.memory_report()["smaps"].get("FilePmdMapped", 0)
    row = {
        "alloc_ms": t_alloc * 1e3,
        "write_GBps": total / t_write / 1e9,
        "anon_rss_growth_MiB": (r1["anon_rss_bytes"] - r0["anon_rss_bytes"]) / MiB,
        "file_rss_growth_MiB": (r1["file_rss_bytes"] - r0["file_rss_bytes"]) / MiB,
        "read_GBps": total / warm / 1e9,
        "file_pmd_mapped_MiB": pmd / MiB,
        "fallbacks": arena.stats()["fallbacks"],
    }
    del slices, arena
    gc.collect()
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--slice-mib", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="directory for the files (default: a temp dir under the repo)")
    add_out_argument(ap, "bench_arena")
    args = ap.parse_args()
    total = int(args.gib * (1 << 30)) // (args.slice_mib * MiB) * (args.slice_mib * MiB)
    base = args.dir or tempfile.mkdtemp(prefix="ktmoe-bench-", dir=os.getcwd())
    modes = {"anonymous, MADV_HUGEPAGE": (None, True), "anonymous, no hugepage": (None, False),
             "file, MADV_HUGEPAGE": (base, True), "file, no hugepage": (base, False)}
    results = {}
    for name, (directory, huge) in modes.items():
        runs = [one_run(directory, huge, total, args.slice_mib * MiB) for _ in range(args.repeats)]
        results[name] = {k: (statistics.median(r[k] for r in runs) if runs[0][k] is not None else None)
                         for k in runs[0]}
    if args.dir is None:
        os.rmdir(base)
    cols = list(next(iter(results.values())))
    print(f"\n{total / MiB:.0f} MiB in {args.slice_mib} MiB slices, {torch.get_num_threads()} threads, "
          f"median of {args.repeats}\n")
    print("| mode | " + " | ".join(cols) + " |")
    print("|" + " --- |" * (len(cols) + 1))
    for name, row in results.items():
        print(f"| {name} | " + " | ".join("-" if row[c] is None else f"{row[c]:.1f}" for c in cols) + " |")
    write_result(args.out, {"bytes": total, "threads": torch.get_num_threads(), "results": results})


if __name__ == "__main__":
    main()
