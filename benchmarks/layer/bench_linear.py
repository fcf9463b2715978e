"""One dense decode projection: torch's bf16 ``F.linear`` against ``KTLinear`` (ktmoe's packed bf16 gemm).

    python -m benchmarks.layer.bench_linear [--rows 1] [--in-features 2048] [--out-features 4096] [--threads 2]
                                      [--repeats 200]

x [rows, in] bf16 times W [out, in] bf16 (an attention projection of a Qwen3-30B-A3B-sized model: one decode
token). The two run alternately, one call each per round, so that other processes' load falls on both alike;
each call is timed alone. Printed: min and median microseconds per call and the weight read rate they imply
(W's bf16 bytes / time; GB/s), the ratio of the medians, and the machine's load (``uptime``): on a shared
host these are indications, re-measure on a quiet one.
"""
import argparse
import os
import statistics
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1, help="rows of x (tokens)")
    ap.add_argument("--in-features", type=int, default=2048)
    ap.add_argument("--out-features", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=200, help="alternating rounds (after 10 warm-up rounds)")
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F

    from torch_ktmoe.linear import KTLinear

    torch.set_num_threads(args.threads)
    dense = torch.nn.Linear(args.in_features, args.out_features, bias=False, dtype=torch.bfloat16)
    packed = KTLinear.from_linear(dense)
    x = torch.randn(args.rows, args.in_features, dtype=torch.bfloat16)
    calls = {"F.linear": lambda: F.linear(x, dense.weight), "KTLinear": lambda: packed(x)}
    times = {name: [] for name in calls}
    with torch.inference_mode():
        for rnd in range(10 + args.repeats):
            for name, call in calls.items():
                t0 = time.perf_counter()
                call()
                dt = time.perf_counter() - t0
                if rnd >= 10:
                    times[name].append(dt)
    weight_bytes = dense.weight.numel() * 2
    print(f"x [{args.rows}, {args.in_features}] x W [{args.out_features}, {args.in_features}] bf16 "
          f"({weight_bytes / 2**20:.1f} MiB of weights), {args.threads} threads, {args.repeats} alternating rounds; "
          f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"{'':<10} {'min us':>8} {'median us':>10} {'GB/s (min)':>11} {'GB/s (median)':>14}")
    for name, ts in times.items():
        lo, med = min(ts), statistics.median(ts)
        print(f"{name:<10} {lo * 1e6:>8.1f} {med * 1e6:>10.1f} {weight_bytes / lo / 1e9:>11.2f} "
              f"{weight_bytes / med / 1e9:>14.2f}")
    ratio = statistics.median(times["F.linear"]) / statistics.median(times["KTLinear"])
    print(f"KTLinear / F.linear speed (medians): {ratio:.2f}x")


if __name__ == "__main__":
    main()
