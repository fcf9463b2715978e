"""The sglang wrapper's next-layer link: a failed prediction switches prefetch off for that layer with one warning
and never fails or changes a forward; the next layer is the next layer of the same model (weight path and
instance), never another model's in the same process."""
import os
import shutil
import warnings

import pytest
import torch
from safetensors.torch import save_file

from tests.helpers import random_experts
from torch_ktmoe.residency import reads as expert_reads
from torch_ktmoe.residency.predictor import NextLayerPrefetchWarning
from torch_ktmoe.sglang import KTMoEWrapper

E, K, L, GPU = 6, 2, 3, 2


def _checkpoint(path, H=64, I=32, router=None, seed=0):
    """Layers L and L + 1's fused experts and layer L + 1's router (``router`` [E, H], default random)."""
    os.makedirs(path, exist_ok=True)
    tensors = {}
    for layer in (L, L + 1):
        gate_up, down = random_experts(E, H, I, seed=seed + layer)
        tensors[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = gate_up.to(torch.bfloat16).contiguous()
        tensors[f"model.layers.{layer}.mlp.experts.down_proj"] = down.to(torch.bfloat16).contiguous()
    if router is None:
        router = torch.randn(E, H, generator=torch.Generator().manual_seed(seed + 5))
    tensors[f"model.layers.{L + 1}.mlp.gate.weight"] = router.to(torch.bfloat16).contiguous()
    save_file(tensors, os.path.join(path, "model.safetensors"))
    return str(path)


def _wrapper(path, layer, H=64, I=32, **kw):
    w = KTMoEWrapper(layer, E, K, H, I, num_gpu_experts=GPU, weight_path=path, method="BF16", **kw)
    w.load_weights()
    return w


def _routing(T, H=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    w, ids = torch.topk(torch.softmax(torch.randn(T, E, generator=g), -1), K, dim=-1)
    return x, ids.to(torch.int32), w.float()


@pytest.fixture
def reads(monkeypatch):
    calls = []
    monkeypatch.setattr(expert_reads, "read_ahead_experts", lambda w13, w2, ids: calls.append((w13, w2, ids)))
    return calls


def _forwards_with_one_warning(first, x, ids, w, expected, match):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        outs = [first.forward(x, ids, w) for _ in range(3)]
    assert all(torch.equal(o, expected) for o in outs)
    ours = [str(s.message) for s in seen if issubclass(s.category, NextLayerPrefetchWarning)]
    assert len(ours) == 1, ours
    assert f"layer {L + 1}" in ours[0] and f"layer {L}" in ours[0], ours[0]
    assert match in ours[0], ours[0]
    assert first._predictor is False


def test_a_checkpoint_gone_after_the_load_switches_prediction_off_not_the_forward(tmp_path):
    path = _checkpoint(tmp_path / "ckpt")
    first, second = _wrapper(path, L, next_layer_prefetch=True), _wrapper(path, L + 1, next_layer_prefetch=True)
    x, ids, w = _routing(2)
    expected = _wrapper(path, L, next_layer_prefetch=False).moe(x, first._id_table[ids.long()], w)
    shutil.rmtree(path)
    _forwards_with_one_warning(first, x, ids, w, expected, "FileNotFoundError")
    assert second.moe is not None


def test_a_nan_in_the_next_router_switches_prediction_off_not_the_forward(tmp_path):
    router = torch.randn(E, 64)
    router[3, 7] = float("nan")
    path = _checkpoint(tmp_path / "ckpt", router=router)
    first, second = _wrapper(path, L, next_layer_prefetch=True), _wrapper(path, L + 1, next_layer_prefetch=True)
    x, ids, w = _routing(2)
    expected = first.moe(x, first._id_table[ids.long()], w)
    _forwards_with_one_warning(first, x, ids, w, expected, "weight[3, 7]")
    assert second.moe is not None


def test_a_read_ahead_that_fails_switches_prediction_off_not_the_forward(tmp_path, monkeypatch):
    def fail(w13, w2, ids):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(expert_reads, "read_ahead_experts", fail)
    path = _checkpoint(tmp_path / "ckpt")
    first, second = _wrapper(path, L, next_layer_prefetch=True), _wrapper(path, L + 1, next_layer_prefetch=True)
    x, ids, w = _routing(1)
    expected = first.moe(x, first._id_table[ids.long()], w)
    _forwards_with_one_warning(first, x, ids, w, expected, "Input/output error")
    assert second.moe.next_layer_recall.pending is None  # no prediction left waiting on the next layer


def test_another_models_layer_is_never_the_next_one(tmp_path, reads):
    """Model A's layer L is its last MoE layer here; model B (another checkpoint, wider) has a layer L + 1 in the same
    process: A predicts nothing (before: B's router applied to A's state, a shape error); with equal shapes A
    would have read B's experts."""
    a = _wrapper(_checkpoint(tmp_path / "a"), L, next_layer_prefetch=True)
    wide = _wrapper(_checkpoint(tmp_path / "b", H=128, seed=7), L + 1, H=128, next_layer_prefetch=True)
    same = _wrapper(_checkpoint(tmp_path / "c", seed=9), L + 1, next_layer_prefetch=True)
    x, ids, w = _routing(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no prediction failure either
        out = a.forward(x, ids, w)
    assert torch.equal(out, a.moe(x, a._id_table[ids.long()], w))
    assert a._next_layer_predictor() is None and reads == [] and a.moe.reads.next is None
    assert wide.moe is not None and same.moe is not None


def test_two_instances_of_one_checkpoint_each_predict_their_own_next_layer(tmp_path, reads):
    """Two models from one weight path, built one after the other (as sglang builds a model's layers in order):
    each layer L predicts its own model's layer L + 1."""
    path = _checkpoint(tmp_path / "ckpt")
    a = [_wrapper(path, L, next_layer_prefetch=True), _wrapper(path, L + 1, next_layer_prefetch=True)]
    b = [_wrapper(path, L, next_layer_prefetch=True), _wrapper(path, L + 1, next_layer_prefetch=True)]
    for first, second in (a, b):
        predictor = first._next_layer_predictor()
        assert predictor is not None and predictor.target is second.moe.reads
        assert first.moe.reads.next is second.moe.reads  # the one link, which a prefill's streaming follows too
