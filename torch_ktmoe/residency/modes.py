"""The four switches of a layer's reading ahead, as ``KTMoE`` takes them (:class:`~.layer_reads.LayerReads` resolves
them): ``warm`` one of :data:`WARM_MODES`; ``prefetch``, ``residency``, ``next_layer_prefetch`` one of
:data:`SWITCH_MODES` (``"auto"``: while the layer's experts are in files that do not fit in memory)."""

WARM_MODES = ("auto", "none", "blocking", "background")
SWITCH_MODES = ("auto", True, False)


def check_modes(*, warm, **switches) -> None:
    """ValueError naming the first switch that is none of its modes."""
    for name, mode in switches.items():
        if not (isinstance(mode, bool) or mode == "auto"):
            raise ValueError(f"{name} must be one of {SWITCH_MODES}, got {mode!r}")
    if warm not in WARM_MODES:
        raise ValueError(f"warm must be one of {WARM_MODES}, got {warm!r}")
