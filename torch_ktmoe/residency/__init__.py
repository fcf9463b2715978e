"""Reading ahead, one subsystem: how a MoE layer's experts get from disk into RAM before (or while) it computes.

One :class:`LayerReads` per layer (``KTMoE.reads``) holds the switches, the counters, the recall, the warm and the
one link to the next layer, and plans each forward's reading once (:meth:`LayerReads.plan`). Its parts, one job each:

* :mod:`.modes` — the four switches (``warm``, ``prefetch``, ``residency``, ``next_layer_prefetch``) and their modes;
* :mod:`.layer_reads` — :class:`LayerReads`, :class:`ReadPlan`; :mod:`.layer_view` — KTMoE's public face of it;
* :mod:`.experts_dir` — one experts directory per model: the fit decision, file names, the layers loaded there;
* :mod:`.model_warm` — the model's background warm (``warm="auto"``);
* :mod:`.predictor` — the next layer's experts predicted from this layer's hidden state and read ahead;
* :mod:`.recall` — how many of the routed experts the predictions named; :mod:`.prediction_gate` — whether reading
  them ahead pays (off while their recall is under 1/2);
* :mod:`.counters` — routed experts found in RAM or read from disk; :mod:`.report` — a model's figures;
* :mod:`.reads` — the reader pool: experts' rows read into the page cache with depth;
* :mod:`.routing` — the one "routed to most experts" test (a prefill).

The fit budget (what fits in RAM or the memory cgroup) is :mod:`torch_ktmoe.memory`'s. Nothing here imports the layer.
"""
from .experts_dir import ExpertsDir, experts_dir
from .layer_reads import LayerReads, ReadPlan
from .predictor import NextLayerPredictor, NextLayerPrefetchWarning
from .recall import PredictionRecall
from .report import residency_report

__all__ = ["ExpertsDir", "experts_dir", "LayerReads", "ReadPlan", "NextLayerPredictor", "NextLayerPrefetchWarning",
           "PredictionRecall", "residency_report"]
