"""Reads with depth: one buffered stream vs the reader pool, and decode of a bigger-than-RAM stack.

Run (root, cgroup v1): python -m benchmarks.memory.bench_reader_pool [--layers 24] [--limit-mib 1024] [--rounds 2]

Builds (once, in --dir, outside any cgroup) a stack of file-backed int8 KTMoE layers kept as cache files
(default 24 layers x 32 experts, H=2048, I=512: ~2.3 GiB), then, each with the files' page cache dropped
first (WeightArena.evict: MADV_DONTNEED + POSIX_FADV_DONTNEED):
  (a) reads every file through one buffered stream (pread, 1 MiB, Python), GB/s;
  (b) queues every file whole to the reader pool with 1, 4 and 8 threads, GB/s (bytes / wall time);
  (c) decodes --tokens tokens through the stack (random top-k routing, 2 torch threads) in a child process
      inside a --limit-mib memory cgroup that cannot hold it, alternated --rounds times: moe_forward's
      prefetch (MADV_WILLNEED from the compute thread right before each layer), the same rows queued to the
      reader pool (8 threads) right before each layer, and WILLNEED plus the next layer's routed rows queued
      to the pool one layer ahead (exact routes: a next-layer predictor's best case): tok/s, bytes read
      from disk per token (/proc/self/io read_bytes) and the disk rate while decoding.
Say the host's load beside the numbers (another process on the cores slows the compute-issued reads).
"""
import argparse
import json
import os
import time

import torch

from ktmoe_harness.memcg import run_in_memory_cgroup

GB = 1e9
MiB = 1 << 20

STACK = r"""
import torch
from torch_ktmoe import KTMoE

def stack(directory, layers, experts, top_k, hidden, inter, prefetch, warm="none"):
    out = []
    for i in range(layers):
        g = torch.Generator().manual_seed(1000 + i)  # the same weights every time: the kept files are reused
        gate_up = torch.randn(experts, 2 * inter, hidden, generator=g, dtype=torch.bfloat16) * 0.05
        down = torch.randn(experts, hidden, inter, generator=g, dtype=torch.bfloat16) * 0.05
        layer = KTMoE(experts, top_k, hidden, inter, weight_format="int8", mmap_experts_dir=directory, layer_idx=i,
                      numa_parts=1, prefetch=prefetch, warm=warm)
        layer.load_weights(gate_up, down)
        del gate_up, down
        out.append(layer)
    return out
"""

CHILD = STACK + r"""
import json, sys, time
from torch_ktmoe.residency import reads as expert_reads
directory, layers, experts, top_k, hidden, inter, tokens, mode, out = sys.argv[1:]
layers, experts, top_k, hidden, inter, tokens = map(int, (layers, experts, top_k, hidden, inter, tokens))
torch.set_num_threads(2)
# willneed: moe_forward(prefetch=True), MADV_WILLNEED from the compute thread right before the layer;
# pool: the same rows queued to the reader pool right before the layer (prefetch=False);
# ahead: willneed for the layer, and the next layer's routed rows queued to the pool one layer ahead
#        (the exact routes: the best a next-layer predictor can do)
model = stack(directory, layers, experts, top_k, hidden, inter, prefetch=mode != "pool")
packed = [layer.packed_tensors()[0] for layer in model]
for layer in model:
    for a in layer.arenas:
        a.evict()
def io_read():
    return int([l for l in open("/proc/self/io") if l.startswith("read_bytes")][0].split()[1])
g = torch.Generator().manual_seed(7)
x = torch.randn(1, hidden, generator=g).bfloat16()
routes = [[torch.randperm(experts, generator=g)[:top_k].view(1, top_k) for _ in model] for _ in range(tokens)]
w = torch.full((1, top_k), 1.0 / top_k)
r0, t0, p0 = io_read(), time.perf_counter(), expert_reads.reader_pool_stats()
order = [(t, i) for t in range(tokens) for i in range(len(model))]
if mode == "ahead":
    expert_reads.read_ahead_experts(*packed[0], routes[0][0])
for n, (t, i) in enumerate(order):
    if i == 0:
        h = x
    if mode == "pool":
        expert_reads.read_ahead_experts(*packed[i], routes[t][i])
    if mode == "ahead" and n + 1 < len(order):
        nt, ni = order[n + 1]
        expert_reads.read_ahead_experts(*packed[ni], routes[nt][ni])
    h = h + model[i](h, routes[t][i], w)
    h = h / h.float().norm().clamp_min(1e-3).to(h.dtype) * 40
dt, read = time.perf_counter() - t0, io_read() - r0
p1 = expert_reads.reader_pool_stats()
json.dump({"tok_s": tokens / dt, "bytes_per_token": read / tokens, "disk_gb_s": read / dt / 1e9,
           "pool_bytes": p1["bytes_read"] - p0["bytes_read"], "pool_errors": p1["errors"] - p0["errors"],
           "checksum": float(h.float().sum())}, open(out, "w"))
"""


def drop(model):
    for layer in model:
        for a in layer.arenas:
            a.evict()


def one_stream(paths) -> float:
    total, t0 = 0, time.perf_counter()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            off = 0
            while True:
                n = len(os.pread(fd, MiB, off))
                if n == 0:
                    break
                off += n
        finally:
            os.close(fd)
        total += off
    return total / (time.perf_counter() - t0) / GB


def pool(model, threads) -> float:
    from torch_ktmoe.residency import reads as expert_reads
    from torch_ktmoe._native import _C
    expert_reads.set_reader_threads(threads)
    arenas = [a for layer in model for a in layer.arenas if a.file_mode]
    b0, t0 = expert_reads.reader_pool_stats()["bytes_read"], time.perf_counter()
    for a in arenas:
        _C.reader_pool_read_file(a, 0, a.file_bytes)
    while True:
        s = expert_reads.reader_pool_stats()
        if s["queued_now"] == 0 and s["in_flight_now"] == 0:
            break
        time.sleep(0.002)
    assert s["errors"] == 0, s["last_error"]
    return (s["bytes_read"] - b0) / (time.perf_counter() - t0) / GB


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/var/tmp/ktmoe-bench-reader-pool")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--limit-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip-decode", action="store_true")
    args = ap.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    shape = [args.layers, args.experts, args.top_k, args.hidden, args.intermediate]
    namespace = {}
    exec(STACK, namespace)
    t0 = time.perf_counter()
    model = namespace["stack"](args.dir, *shape, prefetch=False)
    total = sum(a.file_bytes for layer in model for a in layer.arenas if a.file_mode)
    print(f"stack: {args.layers} layers, {total / GB:.2f} GB of kept files in {args.dir} "
          f"({time.perf_counter() - t0:.0f} s); load {os.getloadavg()[0]:.2f}", flush=True)
    paths = [os.path.join(args.dir, f) for f in sorted(os.listdir(args.dir)) if f.endswith(".ktmoe")]
    drop(model)
    print(f"(a) one buffered stream:   {one_stream(paths):.2f} GB/s  (load {os.getloadavg()[0]:.2f})", flush=True)
    for threads in (1, 4, 8):
        drop(model)
        print(f"(b) reader pool, {threads} threads: {pool(model, threads):.2f} GB/s  "
              f"(load {os.getloadavg()[0]:.2f})", flush=True)
    del model
    if args.skip_decode:
        return 0
    for r in range(args.rounds):
        for name, mode in (("WILLNEED before a layer", "willneed"), ("pool before a layer", "pool"),
                           ("WILLNEED + pool 1 layer ahead", "ahead")):
            out = os.path.join(args.dir, "decode.json")
            load = os.getloadavg()[0]
            res = run_in_memory_cgroup(f"ktmoe_bench_reader_pool_{os.getpid()}_{r}_{mode}", args.limit_mib * MiB,
                                       CHILD, [args.dir, *shape, args.tokens, mode, out], timeout=1800)
            if res.returncode != 0:
                print(f"(c) {name}: failed rc={res.returncode}: {res.stderr[-800:]}", flush=True)
                continue
            d = json.load(open(out))
            print(f"(c) round {r} {name:30s}: {d['tok_s']:.2f} tok/s, {d['bytes_per_token'] / 1e6:.0f} MB read/token, "
                  f"{d['disk_gb_s']:.2f} GB/s while decoding, pool read {d['pool_bytes'] / 1e6:.0f} MB "
                  f"(errors {d['pool_errors']}), checksum {d['checksum']:.4f}  (load {load:.2f})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
