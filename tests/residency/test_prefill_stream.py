"""A prefill's streaming of the next layer (KTMoE, LayerReads.stream_next, LayerArenas.stream): a forward routed
to at least 3/4 of a layer's experts, while the model's file-backed experts do not fit (``prefetching``), maps
the next layer (LayerReads.next: unwired, the next index of the same directory) in the background (MADV_POPULATE_READ alone); decode, fitting models,
anonymous experts and the last layer start nothing; outputs never change; ``routed_to_most`` says what counts."""
import os
import subprocess
import sys
import warnings

import pytest
import torch

from tests.helpers import random_experts
from torch_ktmoe import KTMoE, memory, ops
from torch_ktmoe._native import _C
from torch_ktmoe.residency.experts_dir import ExpertsDir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
E, K, H, I = 8, 2, 256, 128
ALL = torch.arange(E).reshape(E // K, K)  # 4 tokens routed to every expert: a prefill
ONE = torch.tensor([[0, 1]])  # decode: 2 of the 8 experts


@pytest.fixture(autouse=True)
def does_not_fit(monkeypatch):
    monkeypatch.setattr(memory, "file_experts_fit_in_memory", lambda: False)  # streaming is for such models


def _model(directory, layers=2, **kwargs):
    out = []
    for idx in range(layers):
        layer = KTMoE(E, K, H, I, weight_format="int8", mmap_experts_dir=directory, layer_idx=idx, numa_parts=1,
                      warm="none", **kwargs)
        layer.load_weights(*random_experts(E, H, I, seed=idx))
        out.append(layer)
    return out


def _evicted(layer):
    for a in layer.arenas:
        a.join_prefault()
        a.evict()
    assert layer.arenas.file_resident_bytes == 0
    return layer


def _forward(layer, ids):
    x = torch.randn(ids.shape[0], H).bfloat16()
    w = torch.full(ids.shape, 0.5)
    return layer(x, ids, w), ops.moe_forward(x, ids, w, *layer.packed_tensors()[0])


def test_routed_to_most_is_three_quarters_of_the_distinct_ids():
    assert _C.routed_to_most(8, torch.tensor([[0, 1], [2, 3], [4, 5]]))  # 6 of 8
    assert _C.routed_to_most(8, torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32))
    assert not _C.routed_to_most(8, torch.tensor([[0, 1], [2, 3], [4, 4]]))  # 5 distinct
    assert not _C.routed_to_most(8, torch.tensor([[0, 1], [2, 3], [4, -1]]))  # negative ids are skipped
    assert not _C.routed_to_most(8, torch.empty(0, 2, dtype=torch.long))
    with pytest.raises(RuntimeError, match="expert id 8"):
        _C.routed_to_most(8, torch.tensor([[8]]))
    with pytest.raises(RuntimeError, match="integer CPU tensor"):
        _C.routed_to_most(8, torch.tensor([[0.0]]))
    with pytest.raises(RuntimeError, match="num_experts must be > 0"):
        _C.routed_to_most(0, torch.tensor([[0]]))


def test_a_prefill_maps_the_next_layer_and_outputs_do_not_change(tmp_path):
    first, second = _model(tmp_path, prefetch=True)
    _evicted(second)
    got, ref = _forward(first, ALL)
    assert torch.equal(got, ref)
    for a in second.arenas:
        a.join_prefault()
        assert a.prefault_status == "populate_read"
    assert second.arenas.file_resident_bytes >= second.arenas.file_backed_bytes  # (mincore: whole pages)
    got, ref = _forward(second, ALL)  # the last layer: nothing after it to stream
    assert torch.equal(got, ref)


def test_decode_streams_nothing(tmp_path):
    first, second = _model(tmp_path, prefetch=True)
    _evicted(second)
    got, ref = _forward(first, ONE)
    assert torch.equal(got, ref)
    assert all(a.prefault_status != "running" for a in second.arenas)
    assert second.arenas.file_resident_bytes == 0


def test_a_model_that_fits_streams_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "file_experts_fit_in_memory", lambda: True)
    first, second = _model(tmp_path, prefetch=True)  # read-ahead forced, but the model fits: no streaming
    _evicted(second)
    _forward(first, ALL)
    assert second.arenas.file_resident_bytes == 0


def test_layers_that_do_not_fit_together_stream_nothing(tmp_path, monkeypatch):
    first, second = _model(tmp_path, prefetch=True)
    _evicted(second)
    room = first.arenas.file_backed_bytes + second.arenas.file_backed_bytes
    monkeypatch.setattr(memory, "file_room_bytes", lambda: room - 1)  # streaming would evict the layer computing
    assert not first.reads.stream_next()
    got, ref = _forward(first, ALL)
    assert torch.equal(got, ref) and second.arenas.file_resident_bytes == 0
    monkeypatch.setattr(memory, "file_room_bytes", lambda: room)
    assert first.reads.stream_next()
    for a in second.arenas:
        a.join_prefault()


def test_a_layer_the_warm_has_queued_is_left_to_the_warm(tmp_path):
    first, second = _model(tmp_path, prefetch=True)
    _evicted(second)
    second.arenas.warm_pending = True  # the model's warm maps it; its status stays the warm's
    assert not first.reads.stream_next()
    _forward(first, ALL)
    assert second.arenas.file_resident_bytes == 0


def test_the_next_layer_is_the_next_index_of_the_same_directory(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    layers = _model(tmp_path / "a", layers=3)
    other = _model(tmp_path / "b", layers=2)
    directory = layers[0].arenas.experts_dir
    assert isinstance(directory, ExpertsDir)
    assert directory.layer_after(layers[0].reads) is layers[1].reads
    assert layers[0].reads.next is layers[1].reads and layers[1].reads.next is layers[2].reads  # unwired: the fallback
    assert layers[2].reads.next is None
    assert not layers[2].reads.stream_next()
    assert other[0].reads.next is other[1].reads


def test_anonymous_experts_stream_nothing():
    layer = KTMoE(E, K, H, I, weight_format="int8", numa_parts=1, prefetch=True)
    layer.load_weights(*random_experts(E, H, I))
    assert layer.arenas.experts_dir is None and not layer.arenas.stream()
    got, ref = _forward(layer, ALL)
    assert torch.equal(got, ref)


def test_a_stream_in_flight_is_not_started_twice(tmp_path):
    first, second = _model(tmp_path, prefetch=True)
    _evicted(second)
    assert second.arenas.stream()
    started_again = second.arenas.stream()  # False while the first still runs, True once it ended: never an error
    for a in second.arenas:
        a.join_prefault()
        assert a.prefault_status == "populate_read"
    assert isinstance(started_again, bool)
    assert second.arenas.file_resident_bytes >= second.arenas.file_backed_bytes  # (mincore: whole pages)


_EXIT_WHILE_STREAMING = r"""
import sys, torch
from tests.helpers import random_experts
from torch_ktmoe import KTMoE, memory
memory.file_experts_fit_in_memory = lambda: False  # streaming is for models that do not fit
layers = []
for idx in range(2):
    layer = KTMoE(8, 2, 1024, 512, weight_format="int8", mmap_experts_dir=sys.argv[1], layer_idx=idx,
                  numa_parts=1, warm="none", prefetch=True)
    layer.load_weights(*random_experts(8, 1024, 512, seed=idx))
    layers.append(layer)
for a in layers[1].arenas:
    a.evict()
layers[0](torch.randn(4, 1024), torch.arange(8).reshape(4, 2), torch.full((4, 2), 0.5))
if sys.argv[2] == "fork":
    import os
    pid = os.fork()
    if pid == 0:  # the child has no prefaulter thread: its arenas stream again by themselves
        arenas = layers[1].arenas
        for a in arenas:
            assert a.prefault_status != "running", a.prefault_status
            a.evict()
        assert arenas.stream()
        for a in arenas:
            a.join_prefault()
            assert a.prefault_status == "populate_read", a.prefault_status
        os._exit(0 if arenas.file_resident_bytes >= arenas.file_backed_bytes else 3)
    assert os.waitpid(pid, 0)[1] == 0
print("exit")
"""


@pytest.mark.parametrize("how", ["exit", "fork"])
def test_exit_or_fork_while_a_stream_runs(tmp_path, how):
    res = subprocess.run([sys.executable, "-c", _EXIT_WHILE_STREAMING, str(tmp_path), how], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0 and res.stdout.strip().endswith("exit"), res.stderr[-2000:]


_TRUNCATED = r"""
import os, sys, torch
from tests.helpers import random_experts
from torch_ktmoe import KTMoE
layer = KTMoE(8, 2, 1024, 512, weight_format="int8", mmap_experts_dir=sys.argv[1], layer_idx=1, numa_parts=1,
              warm="none", prefetch=True)
layer.load_weights(*random_experts(8, 1024, 512))
for a in layer.arenas:
    a.evict()
path = os.path.join(sys.argv[1], layer.arenas.file_names()[0])
os.truncate(path, os.path.getsize(path) // 4)  # under the mapping: the stream's pages past the end do not exist
assert layer.arenas.stream()
for a in layer.arenas:
    a.join_prefault()
    print(a.prefault_status)
"""


def test_a_truncated_next_layer_ends_its_stream_with_an_error(tmp_path):
    res = subprocess.run([sys.executable, "-c", _TRUNCATED, str(tmp_path)], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().startswith("error: madvise(MADV_POPULATE_READ)"), res.stdout


def test_a_failing_stream_warns_once_and_switches_streaming_off(tmp_path, monkeypatch):
    """Any failure of the stream (here the directory's files gone: FileNotFoundError) is one warning naming the
    layer; the forward's output is unchanged and later prefills do not try again."""
    first, second = _model(tmp_path, prefetch=True)
    calls = []

    def gone(self, arenas, beside_bytes):
        calls.append(arenas)
        raise FileNotFoundError(2, "No such file or directory", str(tmp_path))

    monkeypatch.setattr(ExpertsDir, "stream", gone)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            got, ref = _forward(first, ALL)
            assert torch.equal(got, ref)
    ours = [str(s.message) for s in seen if "stream" in str(s.message)]
    assert len(ours) == 1 and "layer 0" in ours[0] and "No such file" in ours[0], [str(s.message) for s in seen]
    assert len(calls) == 1
