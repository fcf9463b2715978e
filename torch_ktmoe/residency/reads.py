"""Reads of packed experts into the page cache with depth: the reader pool (``csrc/arena/reader_pool.h``).

A process-wide pool of I/O threads (8 by default, :func:`set_reader_threads`) reads file-backed experts'
rows with blocking ``pread`` in 1 MiB pieces, several in flight, into the page cache (the one copy: the
data read is discarded). It starts on its first read (a model whose experts are anonymous, or fit and are
never read ahead, starts none), drops duplicate and, past 8 GiB queued, the oldest requests (it never
blocks a caller), records a failed or short read (a truncated file) as an error in :func:`reader_pool_stats`,
stops at interpreter exit and starts anew in a forked child.

Who uses it: the background warm (``warm="auto"``, ``WeightArena.prefault``) reads its 64 MiB steps
through it, one step ahead, and :func:`read_ahead_experts` queues a layer's experts for any caller that
knows them ahead of the compute (the next-layer prefetch: a layer's likely experts, one layer ahead).
``moe_forward(prefetch=True)`` (``KTMoE(prefetch=...)``) does not: for the experts it is about to compute
it asks the kernel (``MADV_WILLNEED``), which queues all their reads at once (``csrc/ops/expert_reads.h``
gives the measurement).
"""
from .._native import _C

__all__ = ["read_ahead_experts", "reader_pool_stats", "set_reader_threads", "stop_reader_pool"]


def read_ahead_experts(w13, w2, expert_ids) -> None:
    """Queues the packed rows of each expert in ``expert_ids`` (any integer tensor; ids < 0 skipped, each
    id once; an expert whose rows are all in the page cache already is skipped) of ``w13`` [E, B13] and ``w2``
    [E, B2] (a layer's packed uint8 tensors, e.g. ``KTMoE.packed_tensors()[part]``) to the reader pool, and
    returns at once. Tensors of a file-backed
    arena are read into the page cache; anonymous (or any other) memory: nothing to do. An id >= E, or
    tensors that are not contiguous CPU uint8 [E, B] with one E, raise RuntimeError. With the pool off
    (``set_reader_threads(0)``) it asks the kernel instead (``MADV_WILLNEED`` from the calling thread)."""
    _C.read_ahead_experts(w13, w2, expert_ids)


def reader_pool_stats() -> dict:
    """The pool's counters since process start: ``threads`` (of the next start), ``threads_running``,
    ``requests``, ``pieces_queued``, ``pieces_read``, ``bytes_read``, ``duplicates`` (merged or already in
    flight), ``dropped`` (overflow, cancelled, stopped), ``errors``, ``last_error``, ``queued_now``,
    ``in_flight_now``, ``busy_s`` (wall time with at least one read in flight: ``bytes_read / busy_s`` is
    the disk rate achieved) and ``thread_busy_s`` (summed over threads)."""
    return _C.reader_pool_stats()


def set_reader_threads(threads: int) -> None:
    """Threads of the pool's next start (stops a running pool, dropping its queue); 0 turns the pool off:
    :func:`read_ahead_experts` falls back to ``MADV_WILLNEED`` from the calling thread, and a warm's
    populate faults its steps in itself."""
    _C.reader_pool_set_threads(int(threads))


def stop_reader_pool() -> None:
    """Drops queued reads and joins the pool's threads (the next read starts them again)."""
    _C.reader_pool_stop()
