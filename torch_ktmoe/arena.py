"""WeightArena: where packed expert weights live (anonymous or MAP_SHARED file)."""
import os
import stat
import warnings

import torch

from ._native import _C


class ArenaFallbackWarning(UserWarning):
    """A file-backed arena had to use anonymous memory (the reason is the message)."""


class WeightArena(_C.WeightArena):
    """An allocator for packed weights; one per (layer, NUMA part).

    ``WeightArena(None, name)`` is anonymous: plain 64-byte-aligned heap memory.
    ``WeightArena(dir, name)`` keeps allocations in one ``MAP_SHARED`` file created
    (and unlinked at once) under ``dir``: 2 MiB-aligned slices whose space is
    reserved with ``fallocate`` before anything is written. A directory that
    cannot serve (missing, unwritable, tmpfs/hugetlbfs, full, bad name) makes
    each allocation fall back to anonymous memory; the first fallback warns
    (:class:`ArenaFallbackWarning`) and ``stats()`` lists every reason.

    ``persistent=True`` creates no unnamed file: the file is a kept cache file,
    built with ``begin_build()``/``commit_build()`` or mapped (copy on write) with
    ``load_cached()`` (see :mod:`torch_ktmoe.cache`). A persistent arena refuses
    a directory or cache file owned by another user or writable by others
    (``cache_refusal`` says why; it then uses an unnamed file and keeps nothing)
    unless ``trust_others=True``. Tensors mapped from a kept file are private
    copy-on-write views: a write into one stays in this process (as anonymous
    memory) and never reaches the file.

    ``read_before_load=True`` makes ``load_cached()`` first read the kept file
    with ``read()`` (when it fits in the memory headroom), before the load maps it
    and checks every expert's header through the mapping. Those checks fault the
    file in 2 MiB at a time, synchronously, and leave every page unread by the
    CPU; read() instead streams it with readahead and reads each page once in the
    copy, overlapping the two. For a warm-on-load (see ``prefault``), which needs
    both anyway.

    Memory lives as long as any tensor allocated from the arena.
    """

    def __init__(self, dir=None, name: str = "arena", *, hugepage: bool = True, numa_node: int = -1,
                 persistent: bool = False, trust_others: bool = False, read_before_load: bool = False):
        super().__init__(os.fspath(dir) if dir is not None else "", name, hugepage, numa_node, persistent,
                         trust_others)
        self.read_before_load = bool(read_before_load)

    def load_cached(self, key, verify_data: bool = False):
        """``(reason, w13, w2)``: the kept cache file mapped copy-on-write, or why not (see the class)."""
        if self.read_before_load and not self.cache_refusal and not self.open_error:
            self._read_cache_file()
        return super().load_cached(key, verify_data)

    def _read_cache_file(self) -> None:
        from .memory import memory_headroom_bytes

        path = os.path.join(self.dir, self.name + _C.cache_suffix())
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return  # missing: the load says so
        if not stat.S_ISREG(st.st_mode) or st.st_size > memory_headroom_bytes():
            return  # not a file the load will map, or reading it would evict others
        try:
            _C.WeightArena.read_file_through_cache(path)
        except RuntimeError:
            pass  # the load's own checks report what is wrong with the file

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
