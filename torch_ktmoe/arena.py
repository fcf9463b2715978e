"""WeightArena: where packed expert weights live (anonymous or MAP_SHARED file)."""
import logging
import warnings

import torch

from ._native import _C
from .paths import utf8_path

log = logging.getLogger("torch_ktmoe.cache")


class ArenaFallbackWarning(UserWarning):
    """A file-backed arena had to use anonymous memory (the reason is the message)."""


class CacheLockWarning(UserWarning):
    """Another process held a cache file's lock past the deadline: the layer kept nothing (the message says which)."""


class WeightArena(_C.WeightArena):
    """An allocator for packed weights; one per (layer, NUMA part).

    ``WeightArena(None, name)`` is anonymous: with ``hugepage`` (the default) an allocation of 2 MiB or more
    is its own 2 MiB-aligned mapping advised ``MADV_HUGEPAGE``; smaller ones are 64-byte-aligned heap memory.
    ``WeightArena(dir, name)`` keeps allocations in one ``MAP_SHARED`` file created
    (and unlinked at once) under ``dir``: 2 MiB-aligned slices whose space is
    reserved with ``fallocate`` before anything is written. A directory that
    cannot serve (missing, unwritable, tmpfs/hugetlbfs, full, bad name) makes
    each allocation fall back to anonymous memory; the first fallback warns
    (:class:`ArenaFallbackWarning`) and ``stats()`` lists every reason.

    ``persistent=True`` creates no unnamed file: the file is a kept cache file,
    built or mapped (copy on write) by :meth:`load_or_build` (see
    :mod:`torch_ktmoe.cache`). A persistent arena refuses a directory or cache
    file owned by another user or writable by others (``cache_refusal`` says why;
    it then uses an unnamed file and keeps nothing) unless ``trust_others=True``.
    ``map_only=True`` (the cache's ``"map"`` policy) is persistent and creates no
    file at all: it maps a valid kept file or holds nothing.
    Tensors mapped from a kept file are private copy-on-write views: a write into
    one stays in this process (as anonymous memory) and never reaches the file.

    Memory lives as long as any tensor allocated from the arena.
    """

    def __init__(self, dir=None, name: str = "arena", *, hugepage: bool = True, numa_node: int = -1,
                 persistent: bool = False, trust_others: bool = False, map_only: bool = False):
        super().__init__(utf8_path(dir, "WeightArena: dir") if dir is not None else "", name, hugepage, numa_node,
                         persistent, trust_others, map_only)

    def load_or_build(self, key, policy: str, verify: str = "header", build=None, *, read_first_max_bytes: int = 0):
        """Validate-or-build this arena's kept file in one call; ``(w13, w2, hit, reason)``.

        The protocol is C++'s (``csrc/arena/cache_protocol.h``): under the file's
        lock (``policy`` ``"reuse"`` / ``"rebuild"``) stale temp files are removed,
        a valid kept file is mapped (``"reuse"``), else ``build()`` packs into this
        arena and returns ``(w13, w2)``, and the file is committed. ``build=None``
        loads only (``(None, None, False, reason)`` on a miss). ``"map"`` only maps
        (no lock, nothing created or deleted). ``verify="full"`` also compares the
        data checksums. ``read_first_max_bytes``: read a kept file of at most that
        size with ``read()`` before mapping it. Log lines go to the
        ``torch_ktmoe.cache`` logger; a lock held past its deadline
        (``KTMOE_CACHE_LOCK_WAIT`` seconds, default 5) warns (:class:`CacheLockWarning`).
        """
        hit, reason, w13, w2, warning = super().load_or_build(key, policy, verify == "full", build,
                                                             int(read_first_max_bytes), log.log)
        if warning:
            warnings.warn(warning, CacheLockWarning, stacklevel=2)
        return w13, w2, hit, reason

    def empty(self, *sizes) -> torch.Tensor:
        """A uint8 tensor of ``sizes`` in arena memory (thread-safe)."""
        if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
            sizes = tuple(sizes[0])
        t = super().empty([int(s) for s in sizes])
        self.warn_fallback(stacklevel=3)
        return t

    def warn_fallback(self, stacklevel: int = 2) -> None:
        """Warns with the reason of this arena's first fallback, once."""
        reason = self.take_warning()
        if reason:
            warnings.warn(reason, ArenaFallbackWarning, stacklevel=stacklevel + 1)

    def __repr__(self):
        mode = f"file in {self.dir!r}" if self.file_mode else (
            "anonymous" if not self.dir else f"anonymous fallback ({self.open_error})")
        s = self.stats()
        return (f"WeightArena({self.name!r}, {mode}, allocations={s['allocations']}, "
                f"file_backed={s['file_backed_bytes']}, anon={s['anon_bytes']}, fallbacks={s['fallbacks']})")
