"""ModelWarm: the background warm of one model, one worker per experts directory (``KTMoE(warm="auto")``).

``warm="auto"`` (KTMoE's default) hands each loaded layer with file-backed experts to the
:class:`ModelWarm` of its :class:`torch_ktmoe.residency.experts_dir.ExpertsDir` (one directory holds one model's
layers) while the model's file-backed experts fit in memory, the decision read-ahead already takes at
every load (:func:`torch_ktmoe.memory.file_experts_fit_in_memory`: the last layer loaded sees the whole
model). One worker thread per model prefaults the layers in
load order, one arena at a time (:meth:`WeightArena.prefault`: ``read()`` at disk speed, then
``MADV_POPULATE_READ``), while the first tokens run. A load that finds the model no longer fits
stops it (:meth:`stop`: the read in flight ends within one 64 MiB step, queued layers are dropped)
and read-ahead of the routed experts takes over; so does a layer whose missing bytes exceed the
memory headroom when its turn comes (:meth:`LayerArenas.read_budget`).

Threads and lifetime: the reads run in the arena's C++ I/O thread without the GIL; the worker
(a daemon thread) only starts them and polls their status 50 times a second, holding weak
references, so it keeps no layer alive: freeing a layer stops its read (the arena's destructor).
The worker ends when its queue is empty; :func:`torch_ktmoe.residency.experts_dir.stop_all_warms` (registered
with ``atexit``) stops every model's warm at interpreter exit. A child made by ``fork()`` (data loaders,
multiprocessing's fork start method, pre-forking servers) has none of the parent's threads: it starts with
no warm (:meth:`ModelWarm.forget_after_fork`, called by residency/experts_dir.py's :func:`os.register_at_fork`
handler; the arenas forget their prefault threads in C++ likewise), so its ``join_warm()`` and its exit do not wait for
them. An error while warming (``prefault_status`` ``"error: ..."``) warns (:class:`WarmWarning`)
and is kept in :meth:`progress`; the forward then faults the pages in as without warm.
"""
import threading
import time
import warnings
import weakref
from typing import List, Optional

POLL_S = 0.02  # how often the worker looks at the read in flight (its only GIL use while warming)


class WarmWarning(UserWarning):
    """A background warm failed on one arena (the message names it and the error); forwards still fault in."""


class ModelWarm:
    """The background warm of the layers whose experts live in one directory (see the module)."""

    def __init__(self, experts_dir):
        self.experts_dir = experts_dir  # the ExpertsDir it warms (its path, its layers)
        self.directory = experts_dir.path
        self._lock = threading.Condition()
        self._queue: List[weakref.ref] = []  # LayerArenas, load order
        self._current: Optional[weakref.ref] = None  # the WeightArena being prefaulted
        self._thread: Optional[threading.Thread] = None
        self.stopped_reason = ""  # why warming stopped; "" while it may run
        self.warmed_layers = 0
        self.warmed_bytes = 0  # bytes the finished prefaults went through
        self.errors: List[str] = []

    def __deepcopy__(self, memo):  # one per model: a copied layer shares it
        return self

    # ------------------------------------------------------------ control
    def add(self, arenas) -> None:
        """Queues a loaded layer's :class:`LayerArenas` (the model fits: warming may resume)."""
        with self._lock:
            self.stopped_reason = ""
            if not any(r() is arenas for r in self._queue):
                self._queue.append(weakref.ref(arenas))
                arenas.warm_pending = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"ktmoe-warm:{self.directory}", daemon=True)
                self._thread.start()

    def stop(self, reason: str) -> None:
        """Stops warming: the read in flight ends within one 64 MiB step; queued layers are dropped."""
        with self._lock:
            self.stopped_reason = reason
            for r in self._queue:
                if r() is not None:
                    r().warm_pending = False
            self._queue.clear()
            current = self._current() if self._current is not None else None
        if current is not None:
            current.stop_prefault()  # without the GIL; waits for the step in flight

    def join(self, timeout: Optional[float] = None) -> bool:
        """Waits until nothing is queued or running; False if ``timeout`` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._thread is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def forget_after_fork(self) -> None:
        """In a forked child: the worker and the read in flight run in the parent only, and a lock
        they held stays held here; start over with no warm (loads in the child may queue layers again)."""
        if self._thread is not None:
            self.stopped_reason = "the process forked while warming: the child does not go on with it"
        self._lock = threading.Condition()
        for r in self._queue:
            if r() is not None:
                r().warm_pending = False
        self._queue.clear()
        self._current = self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def progress(self) -> dict:
        """``directory``, ``running``, ``queued_layers``, ``warmed_layers``, ``warmed_bytes`` (what the
        finished prefaults went through), ``file_backed_bytes`` and ``resident_bytes`` (``mincore``) of
        the model's live layers, ``stopped_reason`` and ``errors`` (a layer with one is not counted warmed)."""
        with self._lock:
            out = dict(directory=self.directory, running=self._thread is not None,
                       queued_layers=sum(r() is not None for r in self._queue), warmed_layers=self.warmed_layers,
                       warmed_bytes=self.warmed_bytes, stopped_reason=self.stopped_reason, errors=list(self.errors))
        out.update(self.experts_dir.residency())
        return out

    # ------------------------------------------------------------ worker
    def _run(self) -> None:
        while True:
            with self._lock:
                layer = None
                while self._queue and layer is None:
                    layer = self._queue.pop(0)
                    layer = layer if layer() is not None else None
                if layer is None:
                    self._thread = None
                    self._lock.notify_all()
                    return
            try:
                self._warm_layer(layer)
            finally:
                arenas = layer()
                if arenas is not None:
                    arenas.warm_pending = False
                del arenas

    def _warm_layer(self, layer: weakref.ref) -> None:
        arenas = layer()
        if arenas is None:
            return
        missing, budget = arenas.missing_bytes(), arenas.read_budget()
        if missing > budget:  # memory filled up since the load: warming would evict the hot set
            self.stop(f"layer {arenas.layer_idx}: {missing / 2**20:.0f} MiB to read, only "
                      f"{budget / 2**20:.0f} MiB of memory headroom")
            return
        refs = [weakref.ref(a) for a in arenas if a.file_mode]
        layer_idx, failed = arenas.layer_idx, False
        del arenas  # weak from here: freeing the layer stops its read (the arena's destructor)
        for ref in refs:
            a = ref()
            if a is None:
                continue
            a.join_prefault()  # one started elsewhere (KTMoE.warm): not under the lock below
            with self._lock:
                if self.stopped_reason:
                    return
                a.prefault(wait=False)  # starts the arena's I/O thread and returns
                self._current = ref
            del a
            status = self._wait(ref)
            with self._lock:
                self._current = None
                if status.startswith("error: ") and status != "error: stopped":
                    failed = True
                    self.errors.append(f"layer {layer_idx} ({ref().name if ref() else '?'}): {status[7:]}")
                    warnings.warn(f"KTMoE(layer {layer_idx}): warming its experts in {self.directory} failed "
                                  f"({status[7:]}); they fault in on first use", WarmWarning)
                elif status != "error: stopped" and ref() is not None:
                    self.warmed_bytes += ref().prefault_done_bytes
        with self._lock:
            if not (self.stopped_reason or failed):
                self.warmed_layers += 1

    @staticmethod
    def _wait(ref) -> str:
        """The final status of the arena's prefault ("error: stopped" if the arena went)."""
        while True:
            a = ref()
            if a is None:
                return "error: stopped"
            status = a.prefault_status
            if status != "running":
                return status
            del a
            time.sleep(POLL_S)

