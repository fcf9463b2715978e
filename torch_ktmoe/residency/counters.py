"""Residency you can see: per layer, the routed experts that were in RAM and those read from disk.

[NOTE] What is counted, and what it costs
-----------------------------------------
A KTMoE layer with file-backed experts keeps a :class:`LayerResidency`; each forward goes through
:meth:`LayerResidency.observe`, which first asks the page cache (``mincore``, ``_C.rows_resident``) whether
every page of each routed expert's packed rows is in RAM (``_C.routed_experts_resident``, one call):

* a **hit**: the expert was resident; a **miss**: some of its pages had to come from disk;
* on a forward with misses, the process's ``read_bytes`` (``/proc/self/io``: what it made the block layer
  read, page faults and read-ahead included) and major faults (``getrusage``) before and after, and the
  forward's wall time: bytes read from disk, faults, and the disk rate achieved while the layer waited.
  Both are the whole process's: reads by its other threads in that time (the background warm of a model
  whose warm has not reached the layer yet, a data loader) count too.

A forward whose routed experts are all resident costs that call and nothing else: one ``mincore`` per routed
expert and packed matrix, a walk over its pages (~35 us per layer at decode on the reference shape, top-8, about
2 % of that layer's forward), so ``KTMoE(residency="auto")`` counts only while a layer reads its routed experts
ahead (they do not fit in RAM, or the warm has not reached them), where a forward's disk reads cost
milliseconds; the figures of the process (``/proc/self/io``) are read only around forwards with misses,
where the disk dominates the time anyway. Anonymous experts are not counted (always resident).
Read with :meth:`torch_ktmoe.KTMoE.residency_stats` (one layer) or :func:`~.report.residency_report` (a model); both
also carry the recall of the next-layer predictor (:mod:`.predictor`, :mod:`.recall`) where it predicted the layer.
Other processes' reads of the same files do not count; a page another process brought in is a hit.
"""
from __future__ import annotations

import resource
import time
from typing import Callable

import torch

from .._native import _C

__all__ = ["LayerResidency", "COUNTERS", "derived", "empty_stats", "process_read_bytes"]

COUNTERS = ("forwards", "tokens", "hits", "misses", "read_bytes", "major_faults", "read_seconds")


def process_read_bytes() -> int:
    """``read_bytes`` of /proc/self/io (0 where the kernel does not account I/O per task)."""
    try:
        with open("/proc/self/io", "rb") as f:
            for line in f:
                if line.startswith(b"read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _major_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


class LayerResidency:
    """The residency counters of one layer's file-backed experts (see the module)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.counts = dict.fromkeys(COUNTERS, 0)

    def observe(self, packed: list, topk_ids: torch.Tensor, tokens: int, forward: Callable[[], torch.Tensor]):
        """Runs ``forward()`` and counts it. ``packed``: the layer's [(w13, w2)] per NUMA part; ``topk_ids``
        [T, k] (< 0: skipped); ``tokens`` T."""
        hits, misses = _C.routed_experts_resident([w for pair in packed for w in pair], topk_ids)
        c = self.counts
        c["forwards"] += 1
        c["tokens"] += tokens
        c["hits"] += hits
        c["misses"] += misses
        if not misses:
            return forward()
        read0, faults0, t0 = process_read_bytes(), _major_faults(), time.perf_counter()
        out = forward()
        c["read_seconds"] += time.perf_counter() - t0
        c["read_bytes"] += process_read_bytes() - read0
        c["major_faults"] += _major_faults() - faults0
        return out

    def stats(self) -> dict:
        """The counters and what follows from them (hit rate, bytes and faults per token, disk GB/s)."""
        return derived(dict(self.counts))


def empty_stats() -> dict:
    """The figures of a layer never counted (all zero)."""
    return derived(dict.fromkeys(COUNTERS, 0))


def derived(c: dict) -> dict:
    routed = c["hits"] + c["misses"]
    c["hit_rate"] = c["hits"] / routed if routed else None
    c["read_bytes_per_token"] = c["read_bytes"] / c["tokens"] if c["tokens"] else None
    c["major_faults_per_token"] = c["major_faults"] / c["tokens"] if c["tokens"] else None
    c["disk_GBps"] = c["read_bytes"] / c["read_seconds"] / 1e9 if c["read_seconds"] else None
    return c
