"""Reading the routed experts ahead: moe_forward(prefetch=True) and KTMoE(prefetch=).

The read-ahead (MADV_WILLNEED over each routed expert's packed rows) must never change
an output, in any format, for anonymous and file-backed experts; KTMoE's "auto" turns
it on only for file-backed experts that do not fit in memory together (the speed it
buys under a memory limit: benchmarks/memory/bench_bigger_than_ram.py).
"""
import copy

import pytest
import torch

import torch_ktmoe
from tests.helpers import random_experts, random_routing
from torch_ktmoe import KTMoE, memory, ops

E, K, H, I = 8, 2, 256, 128


def _subdir(path, name):
    (path / name).mkdir()
    return path / name


def _layer(fmt="bf16", directory=None, **kw):
    gate_up, down = random_experts(E, H, I)
    layer = KTMoE(E, K, H, I, weight_format=fmt, mmap_experts_dir=directory, numa_parts=1, **kw)
    layer.load_weights(gate_up, down)
    layer.join_warm()  # warm="auto": a layer reads ahead until its model's background warm has reached it
    return layer


@pytest.mark.parametrize("fmt", ops.WEIGHT_FORMATS)
@pytest.mark.parametrize("file_backed", [False, True], ids=["anonymous", "file"])
def test_prefetch_never_changes_outputs(fmt, file_backed, tmp_path):
    layer = _layer(fmt, tmp_path if file_backed else None, prefetch=False)
    w13, w2 = layer.packed_tensors()[0]
    # 1 token routes 2 of the 8 experts (advised); 40 route all of them (left to the gemms' faults)
    for tokens, masked in ((1, 0.0), (7, 0.3), (40, 0.0)):
        x = torch.randn(tokens, H).bfloat16()
        ids, w = random_routing(tokens, E, K, masked=masked)
        ref = ops.moe_forward(x, ids, w, w13, w2)
        if file_backed:
            for a in layer.arenas:
                a.evict()  # cold: the read-ahead really reads
        assert torch.equal(ops.moe_forward(x, ids, w, w13, w2, prefetch=True), ref)
        assert torch.equal(layer(x, ids, w), ref)
    forced = _layer(fmt, _subdir(tmp_path, "forced") if file_backed else None, prefetch=True)
    assert forced.prefetching
    x = torch.randn(3, H)
    ids, w = random_routing(3, E, K)
    assert torch.equal(forced(x, ids, w), ops.moe_forward(x, ids, w, *forced.packed_tensors()[0]))


def test_prefetch_checks_ids_before_reading_ahead():
    layer = _layer()
    w13, w2 = layer.packed_tensors()[0]
    with pytest.raises(RuntimeError, match="expert id 8"):
        ops.moe_forward(torch.randn(1, H), torch.tensor([[8, 1]]), torch.ones(1, 2), w13, w2, prefetch=True)


def test_auto_is_off_for_anonymous_and_fitting_experts(tmp_path):
    assert not _layer().prefetching  # anonymous: nothing to read from a file
    assert memory.file_experts_fit_in_memory()
    assert not _layer(directory=tmp_path).prefetching  # a few MiB of files fit


def test_auto_turns_on_when_file_experts_do_not_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "memory_headroom_bytes", lambda: 0)
    monkeypatch.setattr(memory, "_stat_field_kb", lambda path, field: 1 << 20)  # "1 MiB of RAM"
    layer = _layer(directory=tmp_path)
    assert not memory.file_experts_fit_in_memory()
    assert layer.prefetching
    x = torch.randn(2, H)
    ids, w = random_routing(2, E, K)
    assert torch.equal(layer(x, ids, w), ops.moe_forward(x, ids, w, *layer.packed_tensors()[0]))
    assert not _layer(prefetch="auto").prefetching  # anonymous stays off
    assert not _layer(directory=_subdir(tmp_path, "off"), prefetch=False).prefetching


def test_auto_is_decided_again_after_a_reload(tmp_path, monkeypatch):
    layer = _layer(directory=tmp_path)
    assert not layer.prefetching
    monkeypatch.setattr(memory, "file_experts_fit_in_memory", lambda: False)
    assert not layer.prefetching  # decided at the end of the load
    gate_up, down = random_experts(E, H, I, seed=1)
    layer.load_weights(gate_up, down)  # more arena allocations: the process-wide answer is asked again
    assert layer.prefetching
    layer.join_warm()
    assert layer.prefetching and layer.model_warm.progress()["stopped_reason"]  # and no warm: it does not fit


def test_auto_reads_ahead_until_the_model_warm_reaches_the_layer(tmp_path):
    layer = _layer(directory=tmp_path)  # joined: warmed
    assert not layer.arenas.warm_pending and not layer.prefetching
    layer.arenas.warm_pending = True  # as the model's warm marks a layer it has queued
    assert layer.prefetching and copy.deepcopy(layer).prefetching  # kept on the arenas, which copies share
    x = torch.randn(2, H)
    ids, w = random_routing(2, E, K)
    assert torch.equal(layer(x, ids, w), ops.moe_forward(x, ids, w, *layer.packed_tensors()[0]))
    layer.arenas.warm_pending = False
    assert not layer.prefetching
    assert not _layer(directory=_subdir(tmp_path, "none"), warm="none").prefetching


def test_each_model_keeps_its_own_read_ahead_decision(tmp_path, monkeypatch):
    """One model's experts fit, another's do not: each keeps its decision, whichever was loaded last."""
    fits = {"answer": True}
    monkeypatch.setattr(memory, "file_experts_fit_in_memory", lambda: fits["answer"])
    small = _layer(directory=_subdir(tmp_path, "small"))
    fits["answer"] = False
    big = [_layer(directory=_subdir(tmp_path, "big"), layer_idx=0)]
    assert big[0].prefetching and not small.prefetching  # big loaded last: small keeps its own answer
    fits["answer"] = True
    small_1 = _layer(directory=tmp_path / "small", layer_idx=1)
    assert not small.prefetching and not small_1.prefetching and big[0].prefetching
    fits["answer"] = False
    big.append(_layer(directory=tmp_path / "big", layer_idx=1))  # the model's last layer decides for the model
    fits["answer"] = True
    assert all(layer.prefetching for layer in big) and not small.prefetching
    big.append(_layer(directory=tmp_path / "big", layer_idx=2))
    assert not any(layer.prefetching for layer in big)


@pytest.mark.parametrize("bad", ["on", 1, None, "true"])
def test_prefetch_argument_is_checked(bad):
    with pytest.raises(ValueError, match="prefetch must be one of"):
        KTMoE(E, K, H, I, prefetch=bad)


def test_prefetch_mode_survives_copies(tmp_path):
    import pickle

    layer = _layer(directory=tmp_path, prefetch=True)
    assert copy.deepcopy(layer).prefetch_mode is True
    assert pickle.loads(pickle.dumps(layer)).prefetch_mode is True
    assert torch_ktmoe.KTMoE(E, K, H, I).prefetch_mode == "auto"
