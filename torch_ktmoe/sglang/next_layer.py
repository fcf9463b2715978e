"""Next-layer prefetch between sglang wrappers: which wrapper is the next layer, and its router from the checkpoint.

sglang's model keeps each layer's router on the GPU and hands a wrapper only its own layer's inputs, so a wrapper
reads the next MoE layer's router from the checkpoint itself (:func:`next_router`: ``{block}.gate.weight`` /
``router.weight``, its bias and ``e_score_correction_bias`` under the next wrapper's layer), once, the first time
that layer asks for it.

The next layer is the live wrapper of the next higher ``layer_idx`` **of the same model** (:class:`Model`): the
wrappers of one weight path (its real path) built one after another, in increasing ``layer_idx`` as sglang builds
a model's layers; a wrapper whose ``layer_idx`` its path's latest model already holds (or passed) starts a new
model. Two models in one process never take each other's layers, whether their checkpoints differ or not.

A prediction is an optimisation: a router that cannot be read (the checkpoint gone, a NaN in it, a config.json that
is not one) switches it off for that layer with one :class:`~torch_ktmoe.residency.predictor.NextLayerPrefetchWarning`
(:func:`~torch_ktmoe.residency.predictor.warn_prefetch_off`); so does a failing read ahead, in the predictor itself.
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Optional

import torch

from .. import ops
from ..checkpoint import MOE_BLOCK_NAMES, SafetensorsCheckpoint
from .checkpoint import LAYER_PREFIXES, checkpoint_config

SCORE_FUNCTIONS = {  # config.json scoring_func -> the score a bias-corrected router adds its bias to
    "sigmoid": torch.sigmoid,
    "sqrtsoftplus": lambda logits: torch.nn.functional.softplus(logits).sqrt(),
    "softmax": lambda logits: logits.softmax(-1),
}


class Model:
    """One model's wrappers by ``layer_idx`` (weakly held: a wrapper dropped leaves its model)."""

    def __init__(self):
        self.layers: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()

    def following(self, layer_idx: int):
        """The wrapper of the next higher layer than ``layer_idx``, or None."""
        return min((w for i, w in list(self.layers.items()) if i > layer_idx), key=lambda w: w.layer_idx,
                   default=None)


_models: dict[str, list[Model]] = {}  # real weight path -> its models, in the order they were built
_lock = threading.Lock()


def join_model(wrapper) -> Model:
    """The model ``wrapper`` belongs to (see the module), with ``wrapper`` entered under its ``layer_idx``."""
    key = os.path.realpath(wrapper.weight_path)
    with _lock:
        models = [m for m in _models.get(key, []) if len(m.layers)]
        model = models[-1] if models else None
        if model is None or any(i >= wrapper.layer_idx for i in list(model.layers.keys())):
            model = Model()
            models.append(model)
        model.layers[wrapper.layer_idx] = wrapper
        _models[key] = models
    return model


def next_router(wrapper) -> tuple:
    """``(router module, "")`` for ``wrapper``'s layer from its checkpoint (``weight`` [E, H], ``bias`` or
    ``e_score_correction_bias`` and the config's ``scoring_func`` where it has them; a bias-free weight packed for
    ``ktmoe::linear``), or ``(None, why not)``. A checkpoint that cannot be read raises (the caller switches the
    prediction off)."""
    names = [f"{lp.format(L=wrapper.layer_idx)}.{block}.{r}" for lp in LAYER_PREFIXES for block in MOE_BLOCK_NAMES
             for r in ("gate", "router")]
    with SafetensorsCheckpoint(wrapper.weight_path) as ckpt:
        name = next((n for n in names if f"{n}.weight" in ckpt), None)
        if name is None:
            return None, f"no router weight in {wrapper.weight_path} (tried {names[0]}.weight and the like)"
        if f"{name}.tid2eid" in ckpt:
            return None, f"{name} is hash-routed: its experts follow the token ids, not the hidden state"
        weight = ckpt.get(f"{name}.weight")
        if not weight.is_floating_point() or tuple(weight.shape) != (wrapper.num_experts, wrapper.hidden_size):
            return None, (f"{name}.weight is {weight.dtype} {tuple(weight.shape)}, not [E={wrapper.num_experts}, "
                          f"H={wrapper.hidden_size}] floating point")
        bias = ckpt.get(f"{name}.bias") if f"{name}.bias" in ckpt else None
        correction = (ckpt.get(f"{name}.e_score_correction_bias").float()
                      if f"{name}.e_score_correction_bias" in ckpt else None)
    router = torch.nn.Module()
    if bias is None:  # logits through ktmoe::linear; the weight only gives the shape
        router.register_buffer("ktmoe_w_packed", ops.pack_linear(weight.to(torch.bfloat16)))
        router.weight = torch.nn.Parameter(torch.empty(weight.shape, device="meta"), requires_grad=False)
    else:
        router.weight = torch.nn.Parameter(weight.float(), requires_grad=False)
        router.bias = torch.nn.Parameter(bias.float(), requires_grad=False)
    if correction is not None:
        router.register_buffer("e_score_correction_bias", correction)
        scoring = checkpoint_config(wrapper.weight_path).get("scoring_func", "sigmoid")
        if not isinstance(scoring, str) or scoring not in SCORE_FUNCTIONS:
            return None, (f"{os.path.join(wrapper.weight_path, 'config.json')}: scoring_func {scoring!r} is none of "
                          f"{sorted(SCORE_FUNCTIONS)}")
        router.score_fn = SCORE_FUNCTIONS[scoring]
    return router, ""


def same_shape(wrapper, following) -> Optional[str]:
    """Why ``following`` cannot be predicted from ``wrapper``'s hidden state (another hidden size), or None."""
    if following.hidden_size != wrapper.hidden_size:
        return f"its hidden size {following.hidden_size} is not layer {wrapper.layer_idx}'s {wrapper.hidden_size}"
    return None
