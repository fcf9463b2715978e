"""LayerReads (torch_ktmoe.residency.layer_reads): the one decision per forward (plan), the one next link (wired,
else the directory's index order), the switches resolved in one place, and copies and pickles through the layer."""
import copy
import pickle

import pytest
import torch

from tests.helpers import random_experts
from torch_ktmoe import KTMoE, memory
from torch_ktmoe.residency import LayerReads, ReadPlan

E, K, H, I = 8, 2, 64, 32
DECODE = torch.tensor([[0, 1]])  # 2 of the 8 experts
PREFILL = torch.arange(E).reshape(E // K, K)  # every expert


def _layer(directory=None, idx=0, **kwargs):
    if directory is not None:
        directory.mkdir(exist_ok=True)
    layer = KTMoE(E, K, H, I, mmap_experts_dir=directory, layer_idx=idx, numa_parts=1, warm="none", **kwargs)
    layer.load_weights(*random_experts(E, H, I, seed=idx))
    return layer


@pytest.fixture
def does_not_fit(monkeypatch):
    monkeypatch.setattr(memory, "file_experts_fit_in_memory", lambda: False)


def test_anonymous_experts_plan_nothing():
    layer = _layer()
    for ids in (DECODE, PREFILL):
        assert layer.reads.plan(ids) == ReadPlan(False, False, False)
    forced = _layer(prefetch=True, residency=True)  # forced on: the op reads ahead; nothing to count or stream
    assert forced.reads.plan(PREFILL) == ReadPlan(True, False, False)


def test_a_model_that_fits_plans_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "file_experts_fit_in_memory", lambda: True)
    first, _ = _layer(tmp_path, 0), _layer(tmp_path, 1)
    assert first.reads.plan(DECODE) == first.reads.plan(PREFILL) == ReadPlan(False, False, False)


def test_a_model_that_does_not_fit_reads_ahead_counts_and_streams_its_prefills(tmp_path, does_not_fit):
    first, second = _layer(tmp_path, 0), _layer(tmp_path, 1)
    assert first.reads.plan(DECODE) == ReadPlan(True, False, True)  # decode: read ahead and count, no stream
    assert first.reads.plan(PREFILL) == ReadPlan(True, True, True)  # prefill: the next layer mapped beside it
    assert second.reads.plan(PREFILL) == ReadPlan(True, True, True)  # (its stream_next finds no next: nothing)
    assert not second.reads.stream_next()
    never = _layer(tmp_path, 2, residency=False)
    assert never.reads.plan(DECODE) == ReadPlan(True, False, False)


def test_a_compiled_graph_plans_the_ops_read_ahead_only(tmp_path, does_not_fit):
    first, _ = _layer(tmp_path, 0), _layer(tmp_path, 1)
    first.reads.recall.expect(DECODE)
    assert first.reads.plan(PREFILL, compiling=True) == ReadPlan(True, False, False)
    assert first.reads.recall.pending is not None  # not observed inside a graph


def test_the_plan_counts_a_waiting_predictions_recall():
    layer = _layer()
    layer.reads.recall.expect(torch.tensor([[0, 5]]))
    layer.reads.plan(DECODE)
    stats = layer.reads.stats()
    assert layer.reads.recall.pending is None and (stats["predicted_routed"], stats["predicted_found"]) == (2, 1)


def test_the_next_link_as_wired_else_the_directorys_index_order(tmp_path):
    a0, a1, a2 = (_layer(tmp_path / "a", i) for i in (0, 1, 2))
    assert a0.reads.next is a1.reads and a1.reads.next is a2.reads and a2.reads.next is None  # unwired: by index
    a0.reads.link(a2.reads)  # wired (e.g. hf by module order): the link wins
    assert a0.reads.next is a2.reads
    a2.reads.link(None)  # wired as the last layer
    assert a2.reads.next is None
    anonymous = _layer()
    assert anonymous.reads.next is None  # no directory, no wiring: no next layer
    anonymous.reads.link(a1.reads)
    assert anonymous.reads.next is a1.reads
    del a1
    assert anonymous.reads.next is None  # held weakly: a layer dropped is no one's next


def test_switches_are_checked_and_resolved_in_one_place():
    with pytest.raises(ValueError, match="prefetch must be one of"):
        LayerReads(0, E, K, prefetch="yes")
    with pytest.raises(ValueError, match="warm must be one of"):
        LayerReads(0, E, K, warm="eager")
    layer = _layer(prefetch=True, residency=False, next_layer_prefetch=True)
    assert layer.reads.modes() == dict(warm="none", prefetch=True, residency=False, next_layer_prefetch=True)
    assert (layer.prefetch_mode, layer.residency_mode, layer.next_layer_prefetch_mode) == (True, False, True)
    layer.prefetch_mode = False  # the layer's switch is its reads'
    assert layer.reads.prefetch_mode is False and not layer.prefetching


def test_copies_and_pickles_of_a_layer_carry_its_reads(tmp_path):
    layer = _layer(tmp_path, 0, prefetch=True)
    twin = copy.deepcopy(layer)
    assert twin.reads is not layer.reads and twin.reads.arenas is twin.arenas
    assert all(a is b for a, b in zip(twin.reads.arenas, layer.arenas))  # the same files
    assert twin.reads.packed[0][0] is layer.w13_0  # shared, not copied
    pickled = pickle.loads(pickle.dumps([layer, layer.reads]))
    assert pickled[1] is pickled[0].reads and pickled[0].reads.prefetch_mode is True
    with pytest.raises(TypeError, match="no layer owns them"):
        pickle.dumps(LayerReads(0, E, K))
