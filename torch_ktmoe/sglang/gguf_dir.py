"""``--kt-method LLAMAFILE``: one sglang MoE layer's experts from the GGUF file in ``--kt-weight-path``, in place.

kt-kernel's LLAMAFILE backend takes a directory holding a model's GGUF (one file, or the parts of a split
``name-0000k-of-0000n.gguf``). :func:`gguf_layer_experts` finds it, opens it once per process (every layer's
wrapper shares the one reading and the one mapping of the file) and returns the layer's experts where they lie.
"""
from __future__ import annotations

import os
import threading

from ..checkpoint.gguf import GGUFModel, expert_layers, layer_experts, open_gguf, split_paths
from ..gguf_experts import GGUFExperts

_opened: dict = {}  # (first part, its size and mtime) -> (GGUFModel, {layer: ExpertLayer})
_lock = threading.Lock()


def find_gguf(directory: str) -> str:
    """The GGUF model in ``directory``: its one file, or the first part of its one split. FileNotFoundError
    when there is none, ValueError naming them when there are several models."""
    names = sorted(n for n in os.listdir(directory) if n.endswith(".gguf"))
    models = sorted({os.path.basename(split_paths(os.path.join(directory, n))[0]) for n in names})
    if not models:
        raise FileNotFoundError(f"KTMoEWrapper: --kt-weight-path {directory!r} holds no *.gguf file "
                                "(--kt-method LLAMAFILE reads a GGUF model's experts)")
    if len(models) > 1:
        raise ValueError(f"KTMoEWrapper: --kt-weight-path {directory!r} holds {len(models)} GGUF models "
                         f"({', '.join(models[:4])}); give a directory with one")
    return os.path.join(directory, models[0])


def _model(path: str):
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    with _lock:
        found = _opened.get(key)
        if found is None:
            model: GGUFModel = open_gguf(path)
            found = (model, {layer.layer: layer for layer in expert_layers(model)})
            _opened.clear()  # one model per process: a reopened or changed file replaces the old reading
            _opened[key] = found
    return found


def gguf_layer_experts(directory: str, layer_idx: int, hidden: int, inter: int, num_experts: int) -> GGUFExperts:
    """Layer ``layer_idx``'s routed experts (all ``num_experts``) of the GGUF in ``directory``, checked against
    the layer's shape; ValueError naming the file and what disagrees."""
    path = find_gguf(directory)
    model, layers = _model(path)
    layer = layers.get(layer_idx)
    if layer is None:
        raise ValueError(f"KTMoEWrapper: GGUF {path!r} has no routed experts for layer {layer_idx} (it has layers "
                         f"{sorted(layers)[:3]}...{sorted(layers)[-1:]})" if layers else
                         f"KTMoEWrapper: GGUF {path!r} has no routed experts")
    if layer.shape != (num_experts, hidden, inter):
        raise ValueError(f"KTMoEWrapper: GGUF {path!r} layer {layer_idx}'s experts are (E, H, I) = {layer.shape}, "
                         f"sglang's layer {(num_experts, hidden, inter)}")
    return layer_experts(model, layer)
