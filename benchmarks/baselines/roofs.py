"""The roofs that benchmark ratios are taken against, measured in the same run on the same threads.

* read roof: ``read_roof_gbps(threads)`` streams a buffer far larger than the L3, allocated as the
  packed weights are (huge pages where the host gives them: on 4 KiB pages the same read was up to
  20 % slower on the Zen 5 VM), with the widest loads our kernels use now (benchmarks/baselines/roof_probes.cpp,
  built on first use by benchmarks/micro/build.py with the flags csrc/isa_flags.json gives the active ISA: zmm
  loads under avx512 / amx, ymm loads and the
  256-bit FMA roof under avx2 / avx2_vnni, e.g. ``KTMOE_ISA=avx2`` on an AVX-512 host: the roofs of
  the code being measured). ``torch.sum`` reaches only part of it, so it is not used.
  ``read_seconds(tensors, threads)`` times one such read of given tensors (e.g. the slices of an arena).
* compute roof: ``compute_roof_gflops(threads)``, the peak of the instruction our bf16 gemm
  multiplies with (vdpbf16ps on AVX-512 BF16, 256-bit fp32 FMA on AVX2), from the same file; and
  ``matmul_roof_gflops``, a dense bf16 ``torch.matmul`` of the layer's FLOPs (what torch reaches).
"""
import ctypes
import functools
import statistics
import time

import torch

from benchmarks.micro.build import build

def _probes():
    import torch_ktmoe  # the ISA our kernels run now (KTMOE_ISA or the best this CPU has)
    return _probes_for(torch_ktmoe.active_isa())


@functools.lru_cache(maxsize=None)
def _probes_for(isa: str):
    lib = ctypes.CDLL(str(build("roof_probes", isa, shared=True)))
    lib.read_roof_gbps.restype = ctypes.c_double
    lib.read_roof_gbps.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int]
    lib.read_seconds.restype = ctypes.c_double
    lib.read_seconds.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64), ctypes.c_int,
                                 ctypes.c_int]
    lib.read_roof_isa.restype = ctypes.c_char_p
    lib.compute_roof_gflops.restype = ctypes.c_double
    lib.compute_roof_gflops.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.compute_roof_instruction.restype = ctypes.c_char_p
    return lib


def read_roof_isa() -> str:
    return _probes().read_roof_isa().decode()


@functools.lru_cache(maxsize=1)
def _buffer(nbytes: int) -> torch.Tensor:
    """Memory as the packed weights get it (an anonymous arena: transparent huge pages where the host
    gives them), touched: no page faults in the timed passes."""
    from torch_ktmoe.arena import WeightArena
    return WeightArena(None, "read_roof").empty(nbytes).fill_(1)


def read_roof_gbps(threads: int, nbytes: int = 512 << 20, repeats: int = 5) -> float:
    """Best-of-``repeats`` GB/s of a streaming read of ``nbytes`` on ``threads`` threads."""
    return _probes().read_roof_gbps(_buffer(nbytes).data_ptr(), nbytes, threads, repeats)


def read_seconds(tensors, threads: int) -> float:
    """Seconds of one streaming read of every byte of ``tensors`` (contiguous, CPU) on ``threads`` threads."""
    assert all(t.is_contiguous() and t.device.type == "cpu" for t in tensors), "contiguous CPU tensors only"
    n = len(tensors)
    bufs = (ctypes.c_void_p * n)(*[t.data_ptr() for t in tensors])
    sizes = (ctypes.c_int64 * n)(*[t.numel() * t.element_size() for t in tensors])
    return _probes().read_seconds(bufs, sizes, n, threads)


def compute_roof_instruction() -> str:
    return _probes().compute_roof_instruction().decode()


def compute_roof_gflops(threads: int, iters: int = 2_000_000, tries: int = 5) -> float:
    """Peak GFLOP/s of ``threads`` threads running the bf16 gemm's multiply instruction: the best of
    ``tries`` (a roof is a peak; one try where a co-tenant held a core once read 230 instead of 466 on 2 threads)."""
    return max(_probes().compute_roof_gflops(threads, iters) for _ in range(tries))


def median_ms(fn, reps: int, budget_s: float) -> float:
    """Median ms of ``fn()`` over ``reps`` calls (at least 3, fewer past ``budget_s``), after a warm-up."""
    fn()
    times, t_end = [], time.perf_counter() + budget_s
    while len(times) < reps and (len(times) < 3 or time.perf_counter() < t_end):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def matmul_roof_gflops(tokens: int, top_k: int, hidden: int, inter: int, reps: int = 7) -> float:
    """GFLOP/s of dense bf16 [T*k, H] x [H, 3I] on the current torch thread count."""
    a = torch.randn(tokens * top_k, hidden, dtype=torch.bfloat16)
    b = torch.randn(hidden, 3 * inter, dtype=torch.bfloat16)
    ms = median_ms(lambda: torch.matmul(a, b), reps, 5.0)
    return 2 * a.shape[0] * hidden * 3 * inter / ms / 1e6


if __name__ == "__main__":
    for t in (1, 2):
        print(f"{t} thread(s): read roof ({read_roof_isa()}) {read_roof_gbps(t):.1f} GB/s, "
              f"compute roof ({compute_roof_instruction()}) {compute_roof_gflops(t):.0f} GFLOP/s")
