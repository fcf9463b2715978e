"""KTMoE.residency_stats / torch_ktmoe.residency_report: routed experts resident (hits) or read from disk (misses),
bytes read and major faults, checked against layers whose residency is known (evicted, then warm)."""
import os

import torch
from torch import nn

import torch_ktmoe
from tests.helpers import random_experts
from torch_ktmoe import KTMoE

E, K, H, I = 8, 2, 512, 256


def _layer(directory=None, idx=0, residency=True):
    gate_up, down = random_experts(E, H, I)
    layer = KTMoE(E, K, H, I, mmap_experts_dir=directory, layer_idx=idx, numa_parts=1, prefetch=False, warm="none",
                  residency=residency)
    layer.load_weights(gate_up, down)
    return layer


def _evict(layer):
    for arena in layer.arenas:
        arena.evict()


def test_anonymous_experts_are_not_counted():
    layer = _layer()
    x, ids, w = torch.randn(2, H), torch.tensor([[0, 1], [1, 2]]), torch.full((2, 2), 0.5)
    layer(x, ids, w)
    assert layer.residency is None and layer.residency_stats() is None
    report = torch_ktmoe.residency_report(layer)
    assert report["layers"] == 0 and report["per_layer"] == {} and report["hit_rate"] is None


def test_evicted_experts_are_misses_read_from_disk_then_hits(tmp_path):
    layer = _layer(tmp_path)
    x, w = torch.randn(2, H), torch.full((2, 2), 0.5)
    ids = torch.tensor([[0, 1], [1, -1]])  # experts 0 and 1 routed; -1 skipped
    ref = layer(x, ids, w)
    layer.residency.reset()
    _evict(layer)
    assert torch.equal(layer(x, ids, w), ref)  # counting never changes an output
    s = layer.residency_stats()
    assert (s["forwards"], s["tokens"], s["hits"], s["misses"]) == (1, 2, 0, 2)
    assert s["major_faults"] > 0 and s["read_seconds"] > 0 and s["hit_rate"] == 0.0
    if os.path.exists("/proc/self/io"):  # the bytes read: at least the two experts' packed rows
        w13, w2 = layer.packed_tensors()[0]
        assert s["read_bytes"] >= 2 * (w13.shape[1] + w2.shape[1]) * 0.5 and s["disk_GBps"] > 0
    layer(x, ids, w)
    s = layer.residency_stats()
    assert (s["forwards"], s["hits"], s["misses"], s["hit_rate"]) == (2, 2, 2, 0.5)
    assert s["read_bytes_per_token"] == s["read_bytes"] / 4


def test_report_over_a_model_sums_layers_and_counts_tokens_once(tmp_path):
    model = nn.ModuleList([_layer(tmp_path, 0), _layer(tmp_path, 1)])
    x, w = torch.randn(3, H), torch.full((3, 2), 0.5)
    ids = torch.tensor([[0, 1], [2, 3], [4, 5]])
    for layer in model:
        layer(x, ids, w)
    _evict(model[1])
    model[1](x, ids, w)
    report = torch_ktmoe.residency_report(model)
    assert report["layers"] == 2 and set(report["per_layer"]) == {"0", "1"}
    assert report["tokens"] == 6  # layer 1 saw 6 tokens; every token passes every layer
    assert report["misses"] == 6 and report["hits"] == 12 and report["hit_rate"] == 12 / 18
    assert report["per_layer"]["0"]["misses"] == 0 and report["per_layer"]["1"]["misses"] == 6
    again = torch_ktmoe.residency_report(model, reset=True)
    assert again["hits"] == 12 and torch_ktmoe.residency_report(model)["forwards"] == 0


def test_auto_counts_while_the_layer_reads_ahead_and_false_never(tmp_path):
    x, ids, w = torch.randn(1, H), torch.tensor([[0, 1]]), torch.ones(1, 2)
    auto = _layer(tmp_path / "a" if (tmp_path / "a").mkdir() is None else None, residency="auto")
    auto(x, ids, w)
    assert not auto.prefetching and auto.residency_stats()["forwards"] == 0  # fits, prefetch=False: not counted
    auto.prefetch_mode = True
    auto(x, ids, w)
    assert auto.residency_stats()["forwards"] == 1
    never = _layer(tmp_path / "n" if (tmp_path / "n").mkdir() is None else None, residency=False)
    never(x, ids, w)
    assert never.residency is None and never.residency_stats() is None
    import copy
    assert copy.deepcopy(auto).residency_mode == "auto" and copy.deepcopy(never).residency_mode is False


def test_routed_experts_resident_checks_its_arguments():
    import pytest

    w = torch.zeros(4, 100, dtype=torch.uint8)
    ids = torch.tensor([[0, 3], [3, -1]])
    assert torch_ktmoe._C.routed_experts_resident([w, w], ids) == (2, 0)  # anonymous memory: resident
    # each distinct expert once, however many rows route to it (prefill: thousands)
    assert torch_ktmoe._C.routed_experts_resident([w], torch.zeros(300, 2, dtype=torch.int64)) == (1, 0)
    with pytest.raises(RuntimeError, match="expert id 4 >= num_experts 4"):
        torch_ktmoe._C.routed_experts_resident([w], torch.tensor([[4]]))
    with pytest.raises(RuntimeError, match="contiguous CPU uint8"):
        torch_ktmoe._C.routed_experts_resident([w.float()], ids)
