"""ExpertsDir: one experts directory, one object: the layers whose experts live there, its read-ahead decision,
its background warm, a prefill's streaming of a layer, and the names of its files.

A directory holds one model's layers (its files are named by layer index and NUMA part), so what is decided
per model lives here: whether the model's file-backed experts fit in memory (read-ahead of the routed experts
when they do not, ``KTMoE(prefetch="auto")``) and the background warm of ``warm="auto"``
(:class:`~.model_warm.ModelWarm`). There is one ``ExpertsDir`` per real path (:func:`experts_dir`),
shared by every layer loaded from it and by their copies; a forked child starts with no warm, and interpreter
exit stops every warm. File and lock names are spelled in C++ (``csrc/arena/cache_file.h``); the directory
itself goes down into each arena once (:class:`torch_ktmoe.layer_arenas.LayerArenas`).
"""
import atexit
import os
import threading
import weakref
from typing import Dict, List

from .. import memory
from .._native import _C
from .model_warm import ModelWarm


def arena_name(layer_idx: int, part: int) -> str:
    """The arena of a layer's NUMA part, ``layer0003.part1``."""
    return _C.cache_arena_name(layer_idx, part)


def layer_file_names(layer_idx: int, parts: int) -> List[str]:
    """The kept files of a layer's parts, ``layer0003.part0.ktmoe``, ..."""
    return [_C.cache_file_name(arena_name(layer_idx, p)) for p in range(parts)]


def layer_lock_names(layer_idx: int, parts: int) -> List[str]:
    """The build locks of a layer's parts, ``layer0003.part0.ktmoe.lock``, ..."""
    return [_C.cache_lock_name(arena_name(layer_idx, p)) for p in range(parts)]


class ExpertsDir:
    """The experts directory ``path`` (a real path) of one model (see the module)."""

    def __init__(self, path: str):
        self.path = path
        self.file_experts_fit = True  # the read-ahead decision: the last layer loaded decides for the model
        self.warm = ModelWarm(self)
        self._layers: List[weakref.ref] = []  # the LayerReads of the layers loaded from here, load order

    def __deepcopy__(self, memo):  # one per directory: a copied layer shares it
        return self

    def loaded(self, reads) -> None:
        """A layer (its :class:`~.layer_reads.LayerReads`) finished a load with file-backed experts: decide
        read-ahead again (the last layer loaded sees the whole model) and remember the layer."""
        self.file_experts_fit = memory.file_experts_fit_in_memory()
        if not any(r() is reads for r in self._layers):
            self._layers = [r for r in self._layers if r() is not None] + [weakref.ref(reads)]

    def warm_on_load(self, arenas) -> ModelWarm:
        """``warm="auto"`` after :meth:`loaded`: queue the layer while the model fits, else stop the model's warm."""
        if self.file_experts_fit:
            self.warm.add(arenas)
        else:
            self.warm.stop("the model's file-backed experts do not fit in memory: read-ahead of the routed "
                           "experts instead")
        return self.warm

    def layer_reads(self) -> list:
        """The live layers' :class:`~.layer_reads.LayerReads`, load order."""
        return [r for r in (ref() for ref in self._layers) if r is not None]

    def layers(self) -> list:
        """The live layers' :class:`LayerArenas`, load order."""
        return [r.arenas for r in self.layer_reads()]

    def layer_after(self, reads):
        """The live layer loaded from here with the next larger layer index after ``reads``'s, or None: the next
        layer of a model nobody wired (:attr:`LayerReads.next`)."""
        later = [r for r in self.layer_reads() if r.layer_idx > reads.layer_idx]
        return min(later, key=lambda r: r.layer_idx) if later else None

    def stream(self, arenas, beside_bytes: int) -> bool:
        """Map the layer ``arenas``'s experts in the background (:meth:`LayerArenas.stream`) while a layer of
        ``beside_bytes`` computes, if the two fit in memory together (:func:`torch_ktmoe.memory.file_room_bytes`;
        else streaming would evict the layer computing) and the model's warm has not queued the layer (the warm
        maps it; its status stays its own). True if a stream was started."""
        if arenas.warm_pending or arenas.file_backed_bytes + beside_bytes > memory.file_room_bytes():
            return False
        return arenas.stream()

    def residency(self) -> dict:
        """``file_backed_bytes`` and ``resident_bytes`` (``mincore``) of the live layers' file-backed experts."""
        layers = self.layers()
        return dict(file_backed_bytes=sum(a.file_backed_bytes for a in layers),
                    resident_bytes=sum(a.file_resident_bytes for a in layers))


_BY_PATH: Dict[str, ExpertsDir] = {}
_BY_PATH_LOCK = threading.Lock()


def experts_dir(directory: str) -> ExpertsDir:
    """The :class:`ExpertsDir` of ``directory`` (one per real path)."""
    path = os.path.realpath(directory)
    with _BY_PATH_LOCK:
        if path not in _BY_PATH:
            _BY_PATH[path] = ExpertsDir(path)
        return _BY_PATH[path]


def _forget_warms_in_child() -> None:
    global _BY_PATH_LOCK
    _BY_PATH_LOCK = threading.Lock()  # a parent thread may have held it at the fork
    for d in _BY_PATH.values():
        d.warm.forget_after_fork()


os.register_at_fork(after_in_child=_forget_warms_in_child)


@atexit.register
def stop_all_warms() -> None:
    """Stops every directory's background warm and waits for the workers (interpreter exit)."""
    with _BY_PATH_LOCK:
        warms = [d.warm for d in _BY_PATH.values()]
    for w in warms:
        w.stop("interpreter exit")
    for w in warms:
        w.join(timeout=5.0)
