"""Whether reading a layer's predicted experts ahead pays, judged from the recall of its last predictions.

A prediction read ahead brings ``recall · k`` of the experts the layer will route to in early, and ``k' - recall · k``
it will not use: bytes the disk reads for nothing while the layer's own demand reads wait behind them, and pages that
evict others under a memory limit. With k' = k the two are equal at a recall of 1/2, so :data:`OFF_BELOW` = 0.5 is
where reading the predictions turns into a loss. :class:`PredictionGate` keeps the recall of the layer's last
:data:`WINDOW` predicted forwards; below :data:`OFF_BELOW` it switches the reads off (the previous layer stops reading
this one's predicted experts), and predicts without reading one forward in :data:`PROBE_EVERY` to keep measuring;
from :data:`ON_FROM` (a margin above, so it does not flap) it switches them back on. Its counters
(``prediction_off_forwards``, ``prediction_switched_off``, ``prediction_switched_on``) are in the layer's
residency figures and :func:`torch_ktmoe.residency_report`.
"""
from collections import deque

__all__ = ["PredictionGate", "GATE_COUNTERS", "WINDOW", "OFF_BELOW", "ON_FROM", "PROBE_EVERY"]

WINDOW = 16  # predicted forwards the recall is judged over
OFF_BELOW = 0.5  # a recall under this reads more wrong experts than right ones (k' = k): switched off
ON_FROM = 0.6  # switched back on from this recall
PROBE_EVERY = 4  # while off: one forward in this many is still predicted (not read) to measure the recall
GATE_COUNTERS = ("prediction_off_forwards", "prediction_switched_off", "prediction_switched_on")


class PredictionGate:
    """The reads of one layer's predictions, on or off by their recall (see the module)."""

    def __init__(self):
        self.reading = True  # whether the previous layer reads this layer's predicted experts ahead
        self._window = deque(maxlen=WINDOW)  # (found, routed) of the last predicted forwards
        self._off_forwards = 0  # forwards since switched off (probe timing)
        self.reset()

    def reset(self) -> None:
        self.counts = dict.fromkeys(GATE_COUNTERS, 0)

    def predicts_now(self) -> bool:
        """Whether to predict this forward: always while reading; while off, one forward in :data:`PROBE_EVERY`
        (the others are counted as ``prediction_off_forwards``)."""
        if self.reading:
            return True
        self._off_forwards += 1
        if self._off_forwards % PROBE_EVERY == 0:
            return True
        self.counts["prediction_off_forwards"] += 1
        return False

    def judge(self, found: int, routed: int) -> None:
        """One predicted forward's result: ``found`` of its ``routed`` experts were predicted."""
        self._window.append((found, routed))
        if len(self._window) < WINDOW:
            return
        routed_all = sum(r for _, r in self._window)
        recall = sum(f for f, _ in self._window) / routed_all if routed_all else 1.0
        if self.reading and recall < OFF_BELOW:
            self.reading, self._off_forwards = False, 0
            self.counts["prediction_switched_off"] += 1
        elif not self.reading and recall >= ON_FROM:
            self.reading = True
            self.counts["prediction_switched_on"] += 1

    def stats(self) -> dict:
        return dict(self.counts, prediction_reading=self.reading)
