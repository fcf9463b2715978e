"""KTMoE's residency: warming its expert files before use, and reading routed experts ahead.

A mixin of :class:`torch_ktmoe.layer.KTMoE` (it uses the layer's ``arenas``,
``layer_idx``, ``prefetch_mode``): what happens to the pages of file-backed experts
between the load and the forwards. Anonymous experts are always resident; both are
no-ops for them.
"""
import warnings


class Residency:
    # Whether the file-backed experts of all live arenas fit in RAM together (memory.file_experts_fit_in_memory),
    # as of the last load of a prefetch="auto" layer with file-backed experts; shared by all layers.
    _file_experts_fit = True

    def warm(self, wait: bool = True) -> bool:
        """Prefault this layer's expert files so the first forward runs at steady speed.

        Pages not in the page cache are read with ``read()`` (sequential
        readahead in large folios); pages already cached are read once through
        the mapping (on a VM that hands free memory back to its host, the first
        CPU access to a page the disk filled costs microseconds, which would
        otherwise land in the first forwards); then ``MADV_POPULATE_READ``
        (Linux >= 5.14; synchronous, errors raise), else ``MADV_WILLNEED``, maps
        them. ``wait=False`` returns at once and reads on one background thread
        per arena (joined when the arena goes).

        When the experts do not fit in RAM, reading all of them would evict the
        hot experts (and anything else) to bring in cold ones, which is worse than
        faulting on demand. So warm reads only when the bytes still missing fit in
        the memory headroom (``MemAvailable``, or the memory cgroup's, see
        :func:`torch_ktmoe.memory.memory_headroom_bytes`); otherwise it skips the
        whole layer with a :class:`ResourceWarning` and returns False (experts
        then fault in on first use, as without warm). Anonymous experts are
        always resident: returns True at once.
        """
        from .memory import memory_headroom_bytes

        file_arenas = [a for a in self.arenas if a.file_mode]
        if not file_arenas:
            return True
        missing = sum(a.stats()["file_backed_bytes"] for a in file_arenas) - \
            sum(a.resident_bytes() - a.stats()["anon_bytes"] for a in file_arenas)
        headroom = memory_headroom_bytes()
        if missing > headroom:
            warnings.warn(f"KTMoE(layer {self.layer_idx}): not warming {missing / 2**20:.0f} MiB of experts: "
                          f"only {headroom / 2**20:.0f} MiB of memory headroom (warming would evict "
                          "the hot set); experts fault in on first use", ResourceWarning, stacklevel=2)
            return False
        for a in file_arenas:
            a.prefault(wait)
        return True

    def join_warm(self) -> None:
        """Waits for a background :meth:`warm` to finish."""
        for a in self.arenas:
            a.join_prefault()

    @property
    def resident_bytes(self) -> int:
        """Bytes of this layer's packed experts in RAM (``mincore`` over its files)."""
        return sum(a.resident_bytes() for a in self.arenas)

    @property
    def prefetching(self) -> bool:
        """Whether forwards read ahead the routed experts now (``prefetch`` resolved)."""
        return self.prefetch_mode is True or (self._auto_prefetch and not Residency._file_experts_fit)

    def _decide_prefetch(self) -> None:
        """After a load: "auto" reads ahead when this layer is file-backed and the file-backed experts of
        all live arenas do not fit in memory (every such load asks again: the last one sees the whole model)."""
        self._auto_prefetch = self.prefetch_mode == "auto" and any(
            a.file_mode and a.stats()["file_backed_bytes"] for a in self.arenas)
        if self._auto_prefetch:
            from .memory import file_experts_fit_in_memory

            Residency._file_experts_fit = file_experts_fit_in_memory()
