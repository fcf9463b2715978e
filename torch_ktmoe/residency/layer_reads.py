"""LayerReads: how one MoE layer reads its experts ahead, decided once per forward (:meth:`LayerReads.plan`).

A :class:`~torch_ktmoe.KTMoE` owns one ``LayerReads`` (``layer.reads``). It holds

* the four switches, each ``"auto"`` by default (:mod:`.modes`): ``warm`` (prefault the experts while the first tokens
  run), ``prefetch`` (the op reads the routed experts' rows ahead, ``MADV_WILLNEED``), ``residency`` (count routed
  experts found in RAM or read from disk) and ``next_layer_prefetch`` (the previous layer predicts this one's experts
  and reads them ahead), resolved here and nowhere else;
* what it reads: the layer's :class:`~torch_ktmoe.layer_arenas.LayerArenas` (its experts directory,
  :mod:`.experts_dir`), or a GGUF file's blocks where they lie, and the packed tensors of the last load;
* the counters (:mod:`.counters`), the recall of the predictions of this layer (:mod:`.recall`), whether reading
  them ahead pays (:mod:`.prediction_gate`) and the model's background warm (:mod:`.model_warm`);
* **one** link to the next MoE layer's ``LayerReads`` (:attr:`next`), set by whoever wires the model (the Hugging Face
  wing by module order, the sglang wrapper within its model); unset, the directory's layer index order
  (:meth:`ExpertsDir.layer_after`). The predictor of the next layer's experts and a prefill's streaming of the next
  layer both follow it.

:meth:`plan` answers, once per forward, what the forward does about reading: whether the op reads the routed experts
ahead, whether to map the next layer whole in the background (a prefill of a model that does not fit), whether to
count. A layer whose experts are anonymous, or fit in memory, plans nothing: no reads, no counting.
"""
from __future__ import annotations

import copy
import warnings
import weakref
from typing import Callable, NamedTuple, Optional

import torch

from .counters import LayerResidency, empty_stats
from .modes import check_modes
from .prediction_gate import PredictionGate
from .recall import PredictionRecall
from .routing import routed_to_most

__all__ = ["LayerReads", "ReadPlan"]


class ReadPlan(NamedTuple):
    """One forward's reading, as :meth:`LayerReads.plan` decided it."""
    prefetch: bool  # the op reads the routed experts' rows ahead (moe_forward's prefetch=)
    stream_next: bool  # map the next layer whole in the background while this one computes (a prefill)
    count: bool  # count the routed experts' residency around the forward


def _no_next():
    return None  # the link of a layer wired as the last


class LayerReads:
    """The reading ahead of one layer (see the module). ``layer_idx``, ``num_experts``, ``top_k``: the layer's; the
    modes as ``KTMoE`` takes them (ValueError naming a bad one):

    warm: ``"auto"`` (default): file-backed experts that fit in memory (``prefetch="auto"``'s check) are
        prefaulted by the model's one background worker in load order while the first tokens run (a layer
        not yet warm reads its routed experts ahead; :mod:`.model_warm`); ``"none"``: they fault
        in on first use; ``"blocking"`` / ``"background"``: :meth:`KTMoE.warm` after loading, waited for or not.
    prefetch: before each forward, ask the kernel to read the routed experts' rows (``MADV_WILLNEED``), so
        the cold ones of a model bigger than RAM come from disk together (skipped for a forward routed to at
        least 3/4 of the experts, e.g. a prefill: its faults read them faster). ``"auto"`` (default): while the
        file-backed experts of all live arenas do not fit in RAM or the memory cgroup together, as the last
        layer loaded from the directory found (:class:`~.experts_dir.ExpertsDir`); ``True`` /
        ``False`` force it. Outputs are the same either way.
    residency: count routed experts found in RAM or read from disk (:meth:`KTMoE.residency_stats`,
        :func:`torch_ktmoe.residency_report`; file-backed experts). ``"auto"``: while :attr:`prefetching`
        (~35 us a forward at decode); ``True`` / ``False``: always / never.
    next_layer_prefetch: let the previous MoE layer predict this layer's experts from its hidden state and
        read them ahead while it computes (:mod:`.predictor`; wired by ``torch_ktmoe.hf``'s
        loaders). ``"auto"`` (default): while the file-backed experts do not fit in memory
        (``prefetch="auto"``'s decision; a 30B-class model under a 12 GiB limit decoded 1.05-1.5x faster,
        docs/memory.md); ``True``: always; ``False``: never. Outputs are the same either way; the
        predictions' recall shows in :meth:`KTMoE.residency_stats`.
    """

    def __init__(self, layer_idx: int, num_experts: int, top_k: int, *, warm="auto", prefetch="auto",
                 residency="auto", next_layer_prefetch="auto", owner=None):
        check_modes(warm=warm, prefetch=prefetch, residency=residency, next_layer_prefetch=next_layer_prefetch)
        self.layer_idx, self.num_experts, self.top_k = layer_idx, num_experts, top_k
        self.warm_mode, self.prefetch_mode = warm, prefetch
        self.residency_mode, self.next_layer_prefetch_mode = residency, next_layer_prefetch
        self.arenas = None  # the layer's LayerArenas (KTMoE sets it)
        self.gguf = None  # a GGUF file's experts where they lie (KTMoE.load_gguf)
        self.packed: list = []  # [(w13, w2)] per NUMA part of the last load
        self.file_backed = False  # whether the last load left experts in files
        self.counters: Optional[LayerResidency] = None  # file-backed experts: hits / misses
        self.recall = PredictionRecall()  # the previous layer's predictions of this one
        self.gate = PredictionGate()  # whether reading those predictions ahead pays (their recall)
        self.model_warm = None  # warm="auto": the model's background warm (ModelWarm)
        self.stream_off: Optional[str] = None  # why streaming the next layer was switched off
        self._next: Optional[Callable] = None  # the link: a weakref to the next LayerReads; None: unset
        self.owned_by(owner)

    def owned_by(self, owner) -> None:
        """The module whose ``reads`` these are (weakly held): a pickled ``LayerReads`` (e.g. a predictor's target in a
        pickled model) is its owner's ``reads`` in the receiver."""
        self._owner = None if owner is None else weakref.ref(owner)

    def __reduce__(self):
        owner = self._owner() if self._owner is not None else None
        if owner is None:
            raise TypeError(f"cannot pickle the reads of layer {self.layer_idx}: they pickle as their layer's, and "
                            "no layer owns them")
        return getattr, (owner, "reads")

    def __deepcopy__(self, memo):
        """A copy sharing what the layer's copies share (its arenas, packed tensors, the next link: the same files)
        and copying the rest (the switches, counters and recall), whoever reaches it first: the layer's copy or a
        predictor's (the layer's copy then makes itself the owner)."""
        for shared in (*(self.arenas or ()), *(t for pair in self.packed for t in pair)):
            memo[id(shared)] = shared
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    # ------------------------------------------------------------ loads
    def loaded(self, packed: list) -> None:
        """A load put the layer's packed experts in its arenas: the counters, the directory's fit decision (the last
        layer loaded sees the whole model) and the warm the ``warm`` mode asks for."""
        self.packed = packed
        self.file_backed = file_backed = self.arenas.file_backed
        self.counters = LayerResidency() if file_backed and self.residency_mode is not False else None
        directory = self.arenas.experts_dir
        if file_backed:
            directory.loaded(self)
        if self.warm_mode == "auto":
            if file_backed:
                self.model_warm = directory.warm_on_load(self.arenas)
        elif self.warm_mode != "none":
            self.warm(wait=self.warm_mode == "blocking")

    def warm(self, wait: bool = True) -> bool:
        """Prefault the layer's expert files (see ``KTMoE.warm``)."""
        return self.arenas.warm(wait)

    def join_warm(self) -> None:
        """Waits for a background :meth:`warm`, and for the model's (``warm="auto"``)."""
        if self.model_warm is not None:
            self.model_warm.join()
        self.arenas.join_warm()

    # ------------------------------------------------------------ the modes resolved
    def _do_not_fit(self) -> bool:
        """``"auto"``'s question: are the layer's experts in files that do not fit in memory (a GGUF layer: its
        model's mapped experts did not fit when it was loaded)?"""
        if self.gguf is not None:
            return self.gguf.mapped and not self.gguf.fits
        return self.file_backed and not self.arenas.experts_dir.file_experts_fit

    @property
    def prefetching(self) -> bool:
        """Whether forwards read ahead the routed experts now (``"auto"``: while the experts do not fit, and while
        the model's background warm has not reached this layer)."""
        mode = self.prefetch_mode
        if mode is True or mode is False:
            return mode
        return self._do_not_fit() or (self.gguf is None and self.file_backed and self.arenas.warm_pending)

    @property
    def next_layer_prefetching(self) -> bool:
        """Whether the previous MoE layer reads this layer's predicted experts ahead now (``"auto"``: while the
        experts do not fit)."""
        mode = self.next_layer_prefetch_mode
        return mode is True or (mode == "auto" and self._do_not_fit())

    # ------------------------------------------------------------ the next layer
    def link(self, following: Optional["LayerReads"]) -> None:
        """Sets :attr:`next` (None: this layer is the model's last); the wiring of a model calls it."""
        self._next = _no_next if following is None else weakref.ref(following)

    @property
    def next(self) -> Optional["LayerReads"]:
        """The next MoE layer's reads: as wired (:meth:`link`), else the live layer of the next larger index in the
        same experts directory, or None."""
        if self._next is not None:
            return self._next()
        directory = self.arenas.experts_dir if self.arenas is not None else None
        return directory.layer_after(self) if directory is not None else None

    # ------------------------------------------------------------ one forward
    def plan(self, topk_ids: torch.Tensor, compiling: bool = False) -> ReadPlan:
        """This forward's reading (see the module); also counts the recall of a prediction waiting on it. In a
        compiled graph (``compiling``) the op's read-ahead only: nothing observed, streamed or counted."""
        prefetch = self.prefetching
        if compiling:
            return ReadPlan(prefetch, False, False)
        if self.recall.pending is not None:
            result = self.recall.observe(topk_ids)  # the previous layer predicted this forward's experts
            if result is not None:
                self.gate.judge(*result)
        stream = prefetch and self._streams_next(topk_ids)
        count = self.counters is not None and (prefetch or self.residency_mode is True)
        return ReadPlan(prefetch, stream, count)

    def _streams_next(self, topk_ids: torch.Tensor) -> bool:
        directory = self.arenas.experts_dir if self.arenas is not None else None
        return (directory is not None and self.stream_off is None and not directory.file_experts_fit
                and routed_to_most(self.num_experts, topk_ids))

    def stream_next(self) -> bool:
        """A prefill of this layer has started: map the next layer's experts in the background beside it
        (:meth:`ExpertsDir.stream`). A failure switches streaming off for this layer with one ResourceWarning."""
        following = self.next
        if following is None or not following.file_backed:
            return False
        try:
            return self.arenas.experts_dir.stream(following.arenas, self.arenas.file_backed_bytes)
        except Exception as e:  # noqa: BLE001 - e.g. the files gone: the experts fault in as without it
            self.stream_off = f"{type(e).__name__}: {e}"
            warnings.warn(f"KTMoE(layer {self.layer_idx}): streaming the next layer failed ({self.stream_off}); "
                          "switched off, its experts fault in on use", ResourceWarning, stacklevel=3)
            return False

    def counted(self, topk_ids: torch.Tensor, tokens: int, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Runs ``forward()`` counting the routed experts' residency (:meth:`LayerResidency.observe`)."""
        return self.counters.observe(self.packed, topk_ids, tokens, forward)

    # ------------------------------------------------------------ figures
    def stats(self) -> Optional[dict]:
        """The counters (zero for anonymous experts) and the recall of the predictions of this layer; None for
        anonymous experts never predicted."""
        recall = self.recall.stats()
        if self.counters is None and not recall["predicted_forwards"]:
            return None
        counts = self.counters.stats() if self.counters is not None else empty_stats()
        return {**counts, **recall, **self.gate.stats()}

    def reset(self) -> None:
        """Zeroes the counters and the recall."""
        if self.counters is not None:
            self.counters.reset()
        self.recall.reset()
        self.gate.reset()

    def modes(self) -> dict:
        """The four switches by their ``KTMoE`` keyword names (what constructs a copy)."""
        return dict(warm=self.warm_mode, prefetch=self.prefetch_mode, residency=self.residency_mode,
                    next_layer_prefetch=self.next_layer_prefetch_mode)
