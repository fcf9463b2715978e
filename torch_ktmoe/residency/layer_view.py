"""The reading-ahead face of a KTMoE: its public switches, figures and warm, each answered by its
:class:`~.layer_reads.LayerReads` (``layer.reads``). ``KTMoE`` inherits it; nothing here knows the layer class."""
from __future__ import annotations

from typing import Optional


def _mode(name: str, doc: str) -> property:
    """A switch of ``self.reads`` read and set under its own name (set after a load, it is what counts from then)."""
    return property(lambda self: getattr(self.reads, name), lambda self, value: setattr(self.reads, name, value),
                    doc=doc)


class LayerReadsView:
    """Mixed into ``KTMoE`` (see the module): every name below is the layer's ``reads``' answer."""

    warm_mode = property(lambda self: self.reads.warm_mode, doc="The ``warm=`` mode.")
    prefetch_mode = _mode("prefetch_mode", "The ``prefetch=`` switch.")
    residency_mode = _mode("residency_mode", "The ``residency=`` switch.")
    next_layer_prefetch_mode = _mode("next_layer_prefetch_mode", "The ``next_layer_prefetch=`` switch.")

    @property
    def prefetching(self) -> bool:
        """Whether forwards read ahead the routed experts now (``prefetch`` resolved; with ``"auto"`` also while
        the model's background warm has not reached this layer; a GGUF layer's ``"auto"``: while its model's mapped
        experts did not fit in memory when it was loaded)."""
        return self.reads.prefetching

    @property
    def next_layer_prefetching(self) -> bool:
        """Whether the previous MoE layer reads this layer's predicted experts ahead now (``next_layer_prefetch``
        resolved: ``"auto"``, while this layer's file-backed experts do not fit in memory; a GGUF layer's: while
        its model's mapped experts did not fit when it was loaded)."""
        return self.reads.next_layer_prefetching

    @property
    def residency(self):
        """The residency counters (:class:`~.counters.LayerResidency`), None for anonymous experts."""
        return self.reads.counters

    @property
    def next_layer_recall(self):
        """The previous layer's predictions of this one (:class:`~.recall.PredictionRecall`)."""
        return self.reads.recall

    @property
    def model_warm(self):
        """``warm="auto"``: the model's background warm (:class:`~.model_warm.ModelWarm`), else None."""
        return self.reads.model_warm

    def warm(self, wait: bool = True) -> bool:
        """Prefault this layer's expert files so the first forward runs at steady speed (the arenas' prefaulter:
        ``read()`` what is not cached, one read of what is, then ``MADV_POPULATE_READ``; docs/memory.md).
        ``wait=False`` returns at once and reads on one background thread per arena (joined when the arena goes).

        Reads only when the bytes still missing fit in the memory headroom
        (:func:`torch_ktmoe.memory.memory_headroom_bytes`): reading experts that do not fit in RAM would evict
        the hot ones. Otherwise it skips the layer with a :class:`ResourceWarning` and returns False (experts
        fault in on first use). Anonymous experts are always resident: True at once.
        """
        return self.reads.warm(wait)

    def join_warm(self) -> None:
        """Waits for a background :meth:`warm` to finish, and for the model's (``warm="auto"``)."""
        self.reads.join_warm()

    @property
    def resident_bytes(self) -> int:
        """Bytes of this layer's packed experts in RAM (``mincore`` over its files)."""
        return self.reads.arenas.resident_bytes

    def residency_stats(self) -> Optional[dict]:
        """Routed experts resident / read, bytes read and faults per token, disk GB/s (:mod:`.counters`), and the
        recall of the previous layer's predictions (:mod:`.recall`); None for anonymous experts never predicted."""
        return self.reads.stats()
