"""Packed experts on transparent huge pages against the same bytes on 4 KiB pages, at decode.

Run:  python -m benchmarks.memory.bench_huge_pages [--formats int8,int4] [--threads 1,2] [--calls 300]
      (KTMOE_ISA=avx2 for the AVX2 kernels on any host)

The reference layer (E=128, top-8, H=2048, I=768) is packed once: the pack op's outputs are the
library's own memory (common/huge_pages.h: 2 MiB-aligned, MADV_HUGEPAGE). A copy of the same bytes
goes into an anonymous private mapping without the advice (4 KiB pages under THP's "madvise" mode).
T=1 calls alternate between the two, in both orders, over random routings (cold experts: 680 MB of
int8); both give the same bits. Prints median / p10 / min ms of each, weight GB/s at the median and
the ratio, and how much of this process THP backs (AnonHugePages).
"""
import argparse
import mmap
import statistics
import time

import torch

import torch_ktmoe
from ktmoe_harness.moe_inputs import random_experts
from torch_ktmoe import ops

SHAPE = (128, 8, 2048, 768)  # E, top-k, H, I


def on_small_pages(t: torch.Tensor, keep: list) -> torch.Tensor:
    """A copy of ``t`` in an anonymous private mapping with no huge-page advice (kept alive by ``keep``)."""
    n = t.numel() * t.element_size()
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    keep.append(m)
    copy = torch.frombuffer(m, dtype=torch.uint8).view(t.dtype).view(t.shape)
    copy.copy_(t)
    return copy


def anon_huge_mib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:")) // 1024


def stats(times):
    s = sorted(times)
    return statistics.median(s), s[len(s) // 10], s[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="int8,int4")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--calls", type=int, default=300, help="calls of each memory per point")
    args = ap.parse_args(argv)
    experts, top_k, hidden, inter = SHAPE
    print(f"torch_ktmoe {torch_ktmoe.__version__}, ISA {torch_ktmoe.active_isa()}, THP mode "
          f"{open('/sys/kernel/mm/transparent_hugepage/enabled').read().strip()}", flush=True)
    gate_up, down = random_experts(experts, hidden, inter, torch.bfloat16)
    x = torch.randn(1, hidden).to(torch.bfloat16)
    weights = torch.full((1, top_k), 1.0 / top_k)
    gen = torch.Generator().manual_seed(1)
    for fmt in args.formats.split(","):
        keep = []
        huge13, huge2 = ops.pack_experts(gate_up, down, fmt)
        small13, small2 = on_small_pages(huge13, keep), on_small_pages(huge2, keep)
        read_bytes = top_k * (huge13.shape[1] + huge2.shape[1])
        memories = {"huge pages": (huge13, huge2), "4 KiB pages": (small13, small2)}
        ids = torch.randperm(experts, generator=gen)[:top_k].view(1, top_k).to(torch.int32)
        outs = [torch.ops.ktmoe.moe_forward(x, ids, weights, *w) for w in memories.values()]
        assert torch.equal(*outs), "the same bytes gave different outputs"
        print(f"{fmt}: {read_bytes / 1e6:.1f} MB of experts a call; THP backs {anon_huge_mib()} MiB of this process")
        for th in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(th)
            times = {name: [] for name in memories}
            for i in range(args.calls):
                ids = torch.randperm(experts, generator=gen)[:top_k].view(1, top_k).to(torch.int32)
                for name in (list(memories) if i % 2 else list(memories)[::-1]):
                    t0 = time.perf_counter()
                    torch.ops.ktmoe.moe_forward(x, ids, weights, *memories[name])
                    times[name].append((time.perf_counter() - t0) * 1e3)
            (hm, hp, hmin), (sm, sp, smin) = stats(times["huge pages"]), stats(times["4 KiB pages"])
            print(f"  {fmt} T=1 {th}t  huge pages {hm:.3f} / {hp:.3f} / {hmin:.3f} ms ({read_bytes / hm / 1e6:.1f} GB/s)"
                  f"  4 KiB pages {sm:.3f} / {sp:.3f} / {smin:.3f} ms ({read_bytes / sm / 1e6:.1f} GB/s)"
                  f"  -> {sm / hm:.2f}x (median / p10 / min)", flush=True)
        del memories, huge13, huge2, small13, small2, outs
        keep.clear()


if __name__ == "__main__":
    main()
