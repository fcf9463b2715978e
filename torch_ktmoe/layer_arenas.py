"""LayerArenas: the weight arenas of one KTMoE layer, one per NUMA part, as one object.

It makes them (named in C++: ``layer0003.part1``), replaces one for each cache load
or build (:meth:`load_or_build`: one C++ call per part), and answers for all of them
together: statistics, residency (:meth:`warm`, :attr:`resident_bytes`, :meth:`missing_bytes`;
the model-wide background warm of ``warm="auto"`` is model_warm.py's). Anonymous
experts are always resident; warming is a no-op for them. It is a sequence of
:class:`~torch_ktmoe.arena.WeightArena` (``layer.arenas[p]``).
"""
import warnings
from collections.abc import Sequence
from typing import List, Optional

from . import memory
from ._native import _C
from .arena import WeightArena


class LayerArenas(Sequence):
    def __init__(self, directory: Optional[str], layer_idx: int, parts: int, *, hugepage: bool, nodes: int,
                 policy: str, trust_others: bool, read_first: bool):
        self.directory, self.layer_idx = directory, layer_idx
        self._options = dict(hugepage=hugepage, persistent=policy != "off", map_only=policy == "map",
                             trust_others=trust_others)
        self._nodes = nodes
        self.read_first = read_first  # a kept file is read once, at disk speed, before it is mapped (warm on load)
        self._arenas = [self._make(p) for p in range(parts)]

    def __getitem__(self, p):
        return self._arenas[p]

    def __len__(self) -> int:
        return len(self._arenas)

    def _make(self, p: int) -> WeightArena:
        return WeightArena(self.directory, _C.cache_arena_name(self.layer_idx, p),
                           numa_node=p % self._nodes if self._nodes > 1 else -1, **self._options)

    def fresh(self, p: int) -> WeightArena:
        """A new arena for part ``p`` (tensors of an earlier load keep theirs alive)."""
        self._arenas[p] = self._make(p)
        return self._arenas[p]

    def load_or_build(self, p: int, key, policy: str, verify: str, build=None, events: Optional[list] = None):
        """Part ``p``'s kept file mapped, or built by ``build(arena)`` into a fresh arena: ``(w13, w2, hit)``.

        Appends ``{name, hit, reason}`` to ``events`` (see :meth:`WeightArena.load_or_build`).
        """
        arena = self.fresh(p)
        w13, w2, hit, reason = arena.load_or_build(
            key, policy, verify, None if build is None else (lambda: build(arena)),
            read_first_max_bytes=self.read_budget() if self.read_first else 0)
        if events is not None:
            events.append({"name": arena.name, "hit": hit, "reason": reason})
        return w13, w2, hit

    # ------------------------------------------------------------ statistics
    def stats(self) -> List[dict]:
        """Per NUMA part: allocations, file_backed_bytes, anon_bytes, fallbacks, reasons, name, dir, file_mode."""
        return [dict(a.stats(), name=a.name, dir=a.dir, file_mode=a.file_mode) for a in self._arenas]

    @property
    def file_backed_bytes(self) -> int:
        return sum(a.stats()["file_backed_bytes"] for a in self._arenas)

    @property
    def file_backed(self) -> bool:
        """Whether some of the layer's experts are in files (what read-ahead and warm act on)."""
        return any(a.file_mode and a.stats()["file_backed_bytes"] for a in self._arenas)

    # ------------------------------------------------------------ residency
    @property
    def resident_bytes(self) -> int:
        """Bytes of the layer's packed experts in RAM (``mincore`` over its files)."""
        return sum(a.resident_bytes() for a in self._arenas)

    @property
    def warm_pending(self) -> bool:
        """Whether the model's background warm (``warm="auto"``, model_warm.py) has queued or is reading this
        layer. Kept on the arenas, which copies of the layer share."""
        return any(getattr(a, "warm_pending", False) for a in self._arenas)

    @warm_pending.setter
    def warm_pending(self, pending: bool) -> None:
        for a in self._arenas:
            a.warm_pending = pending

    @property
    def file_resident_bytes(self) -> int:
        """Bytes of the layer's file-backed experts in RAM (``mincore`` over its files)."""
        return sum(a.resident_bytes() - a.stats()["anon_bytes"] for a in self._arenas if a.file_mode)

    def missing_bytes(self) -> int:
        """Bytes of the layer's file-backed experts not in RAM: what a warm reads from disk."""
        return sum(a.stats()["file_backed_bytes"] for a in self._arenas if a.file_mode) - self.file_resident_bytes

    @staticmethod
    def read_budget() -> int:
        """Bytes a load or a warm may read into RAM without evicting others: the one headroom check."""
        return memory.memory_headroom_bytes()

    def warm(self, wait: bool = True) -> bool:
        """Prefaults the file-backed arenas when what is missing fits :meth:`read_budget` (see ``KTMoE.warm``)."""
        file_arenas = [a for a in self._arenas if a.file_mode]
        if not file_arenas:
            return True
        missing, budget = self.missing_bytes(), self.read_budget()
        if missing > budget:
            warnings.warn(f"KTMoE(layer {self.layer_idx}): not warming {missing / 2**20:.0f} MiB of experts: "
                          f"only {budget / 2**20:.0f} MiB of memory headroom (warming would evict "
                          "the hot set); experts fault in on first use", ResourceWarning, stacklevel=3)
            return False
        for a in file_arenas:
            a.prefault(wait)
        return True

    def join_warm(self) -> None:
        for a in self._arenas:
            a.join_prefault()
