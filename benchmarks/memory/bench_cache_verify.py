"""Cost of each cache verification level: load of a valid cache file with verify="header" vs "full".

Run: python -m benchmarks.memory.bench_cache_verify [--experts 64 --hidden 2048 --intermediate 768 --repeats 7]

Builds one layer's cache file (int8, warm page cache), then loads it again and again,
alternating the levels (A/B), in this process: each load maps the file, checks every
expert's packed header, and with "full" also the checksum of every data byte. Prints
per level the median and min load time, the cache bytes, GB/s (bytes / time), and,
measured in the same run, the read roof (benchmarks/baselines/roofs.py: streaming read, widest loads) for scale.
Writes benchmarks/results/bench_cache_verify.json (--out).
"""
import argparse
import os
import statistics
import tempfile
import time

import torch

from benchmarks.cli import add_out_argument, add_shape_arguments, write_result
from benchmarks.baselines.roofs import read_roof_gbps
from torch_ktmoe import KTMoE


def main():
    ap = argparse.ArgumentParser()
    add_shape_arguments(ap, experts=64)
    ap.add_argument("--repeats", type=int, default=7)
    add_out_argument(ap, "bench_cache_verify")
    args = ap.parse_args()
    E, H, I = args.experts, args.hidden, args.intermediate
    g = torch.Generator().manual_seed(0)
    gate_up = torch.randn(E, 2 * I, H, generator=g, dtype=torch.bfloat16)
    down = torch.randn(E, H, I, generator=g, dtype=torch.bfloat16)
    with tempfile.TemporaryDirectory(dir=os.environ.get("KTMOE_BENCH_DIR", "/var/tmp")) as d:
        kw = dict(weight_format="int8", mmap_experts_dir=d, numa_parts=1)
        KTMoE(E, 8, H, I, **kw).load_weights(gate_up, down, fingerprint="bench")
        nbytes = sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if n.endswith(".ktmoe"))
        times = {"header": [], "full": []}
        for _ in range(args.repeats):
            for level in ("header", "full"):
                m = KTMoE(E, 8, H, I, verify=level, **kw)
                t0 = time.perf_counter()
                assert m.try_load_cached("bench"), m.cache_events
                times[level].append(time.perf_counter() - t0)
                del m
        roof = read_roof_gbps(torch.get_num_threads(), 1 << 30, 3)
    rows = {}
    print(f"int8 layer E={E} H={H} I={I}: {nbytes / 2**20:.0f} MiB cache file, warm page cache, "
          f"{torch.get_num_threads()} threads, {args.repeats} loads per level (alternating)\n")
    print("| verify | median load | min load | GB/s (median) | GB/s (best) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for level, ts in times.items():
        med, best = statistics.median(ts), min(ts)
        rows[level] = {"median_s": med, "min_s": best, "gbps_median": nbytes / med / 1e9, "gbps_best": nbytes / best / 1e9}
        print(f"| {level} | {med * 1e3:.1f} ms | {best * 1e3:.1f} ms | {nbytes / med / 1e9:.1f} | {nbytes / best / 1e9:.1f} |")
    print(f"\nread roof (streaming read, same run): {roof:.1f} GB/s; full / header load time: "
          f"{rows['full']['median_s'] / rows['header']['median_s']:.1f}x")
    write_result(args.out, {"bytes": nbytes, "levels": rows, "read_roof_gbps": roof,
                            "threads": torch.get_num_threads()})


if __name__ == "__main__":
    main()
