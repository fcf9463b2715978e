"""LayerArenas: the weight arenas of one KTMoE layer, one per NUMA part, as one object.

It opens a part's arena when a load or a build needs one (named in C++: ``layer0003.part1``; an
earlier load's arena stays with its tensors), runs each part's cache load or build
(:meth:`load_or_build`: one C++ call per part), and answers for all of them together: statistics,
whether the cache kept their files (:attr:`kept`), residency (:meth:`warm`, :attr:`resident_bytes`,
:meth:`missing_bytes`; the model-wide read-ahead decision and background warm are its
:class:`~torch_ktmoe.residency.experts_dir.ExpertsDir`'s). Anonymous experts are always resident; warming is a
no-op for them. ``layer.arenas[p]`` is part ``p``'s :class:`~torch_ktmoe.arena.WeightArena`; iterating
gives the open ones.
"""
import warnings
from typing import List, Optional

from . import memory
from .arena import WeightArena
from .residency.experts_dir import arena_name, experts_dir, layer_file_names


class LayerArenas:
    def __init__(self, directory: Optional[str], layer_idx: int, parts: int, *, hugepage: bool, nodes: int,
                 policy: str, trust_others: bool, read_first: bool):
        self.directory, self.layer_idx, self.parts = directory, layer_idx, parts
        self.experts_dir = None if directory is None else experts_dir(directory)
        self._options = dict(hugepage=hugepage, persistent=policy != "off", map_only=policy == "map",
                             trust_others=trust_others)
        self._nodes = nodes
        self.read_first = read_first  # a kept file is read once, at disk speed, before it is mapped (warm on load)
        self._arenas: List[Optional[WeightArena]] = [None] * parts  # opened by a load or a build

    def __getitem__(self, p: int) -> WeightArena:
        """Part ``p``'s arena, opened if none is yet."""
        if self._arenas[p] is None:
            self._arenas[p] = self._open(p)
        return self._arenas[p]

    def __iter__(self):
        return iter([a for a in self._arenas if a is not None])

    def __len__(self) -> int:
        return self.parts

    def _open(self, p: int) -> WeightArena:
        return WeightArena(self.directory, arena_name(self.layer_idx, p),
                           numa_node=p % self._nodes if self._nodes > 1 else -1, **self._options)

    def for_build(self, p: int) -> WeightArena:
        """An arena for a new load or build of part ``p``: the part's own while it holds nothing (e.g. after a
        load that missed), else a new one (tensors of an earlier load keep theirs alive)."""
        a = self._arenas[p]
        if a is None or a.file_mode or a.stats()["allocations"]:
            a = self._arenas[p] = self._open(p)
        return a

    def load_or_build(self, p: int, key, policy: str, verify: str, build=None, events: Optional[list] = None):
        """Part ``p``'s kept file mapped, or built by ``build(arena)``: ``(w13, w2, hit)``.

        Appends ``{name, hit, reason}`` to ``events`` (see :meth:`WeightArena.load_or_build`).
        """
        arena = self.for_build(p)
        w13, w2, hit, reason = arena.load_or_build(
            key, policy, verify, None if build is None else (lambda: build(arena)),
            read_first_max_bytes=self.read_budget() if self.read_first else 0)
        if events is not None:
            events.append({"name": arena.name, "hit": hit, "reason": reason})
        return w13, w2, hit

    # ------------------------------------------------------------ the kept files
    def file_names(self) -> List[str]:
        """The names of the parts' kept files in the directory (spelled in C++)."""
        return layer_file_names(self.layer_idx, self.parts)

    @property
    def kept(self) -> bool:
        """Whether every part is mapped from (or was committed to) a kept cache file the cache did not refuse."""
        return all(a is not None and a.read_only and not a.cache_refusal for a in self._arenas)

    def refusals(self) -> str:
        """Why the cache refused to keep the parts' files, each reason once ("" if it refused none)."""
        return "; ".join(dict.fromkeys(a.cache_refusal for a in self if a.cache_refusal))

    # ------------------------------------------------------------ statistics
    def stats(self) -> List[dict]:
        """Per NUMA part: allocations, file_backed_bytes, anon_bytes, fallbacks, reasons, name, dir, file_mode
        (zeros for a part not loaded yet)."""
        none = dict(allocations=0, file_backed_bytes=0, anon_bytes=0, fallbacks=0, fallback_reasons=[],
                    dir=self.directory or "", file_mode=False)
        return [dict(none, name=arena_name(self.layer_idx, p)) if a is None else
                dict(a.stats(), name=a.name, dir=a.dir, file_mode=a.file_mode) for p, a in enumerate(self._arenas)]

    @property
    def file_backed_bytes(self) -> int:
        return sum(a.stats()["file_backed_bytes"] for a in self)

    @property
    def file_backed(self) -> bool:
        """Whether some of the layer's experts are in files (what read-ahead and warm act on)."""
        return any(a.file_mode and a.stats()["file_backed_bytes"] for a in self)

    # ------------------------------------------------------------ residency
    @property
    def resident_bytes(self) -> int:
        """Bytes of the layer's packed experts in RAM (``mincore`` over its files)."""
        return sum(a.resident_bytes() for a in self)

    @property
    def warm_pending(self) -> bool:
        """Whether the model's background warm (``warm="auto"``, residency/model_warm.py) has queued or is reading this
        layer. Kept on the arenas, which copies of the layer share."""
        return any(getattr(a, "warm_pending", False) for a in self)

    @warm_pending.setter
    def warm_pending(self, pending: bool) -> None:
        for a in self:
            a.warm_pending = pending

    @property
    def file_resident_bytes(self) -> int:
        """Bytes of the layer's file-backed experts in RAM (``mincore`` over its files)."""
        return sum(a.resident_bytes() - a.stats()["anon_bytes"] for a in self if a.file_mode)

    def missing_bytes(self) -> int:
        """Bytes of the layer's file-backed experts not in RAM: what a warm reads from disk."""
        return sum(a.stats()["file_backed_bytes"] for a in self if a.file_mode) - self.file_resident_bytes

    @staticmethod
    def read_budget() -> int:
        """Bytes a load or a warm may read into RAM without evicting others: the one headroom check."""
        return memory.memory_headroom_bytes()

    def warm(self, wait: bool = True) -> bool:
        """Prefaults the file-backed arenas when what is missing fits :meth:`read_budget` (see ``KTMoE.warm``)."""
        file_arenas = [a for a in self if a.file_mode]
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

    def stream(self) -> bool:
        """Starts mapping the file-backed arenas in the background (``MADV_POPULATE_READ`` alone, on each
        arena's prefaulter thread; prefaulter.h): a prefill's next layer. False where an arena's prefaulter is
        still running (a warm or an earlier stream): nothing new is started for it, and the caller (a compute
        thread) never waits on it."""
        started = False
        for a in self:
            if a.file_mode and a.prefault_status != "running":
                a.prefault(wait=False, map_only=True)
                started = True
        return started

    def join_warm(self) -> None:
        for a in self:
            a.join_prefault()
