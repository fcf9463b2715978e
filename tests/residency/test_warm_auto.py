"""warm="auto" (KTMoE's default): a model's file-backed experts warmed in the background after a cold load.

Each test packs a small model (3 layers) with warm="none", frees it, drops its files from the
page cache (posix_fadvise DONTNEED) and maps them again from the cache: a cold start.
"""
import copy
import gc
import glob
import os
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch

import torch_ktmoe
from tests.helpers import random_experts, random_routing
from torch_ktmoe import KTMoE, WeightArena, memory
from torch_ktmoe.residency import model_warm

E, K, H, I = 16, 4, 256, 512  # 12 MiB packed bf16 per layer
LAYERS = 3


def _drop_page_cache(directory):
    for path in glob.glob(os.path.join(directory, "*.ktmoe")):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _cold_model(directory, layers=LAYERS, fits=None, **kwargs):
    """(layers mapped cold from their cache files, fingerprints, routed inputs, reference outputs)."""
    packed = [KTMoE(E, K, H, I, mmap_experts_dir=directory, layer_idx=i, numa_parts=1, warm="none")
              for i in range(layers)]
    x = torch.randn(3, H, dtype=torch.bfloat16)
    ids, w = random_routing(3, E, K)
    for i, layer in enumerate(packed):
        layer.load_weights(*random_experts(E, H, I, seed=i, dtype=torch.bfloat16))
    refs = [layer(x, ids, w) for layer in packed]
    fingerprints = [layer.cache_fingerprint for layer in packed]
    del packed, layer
    gc.collect()
    _drop_page_cache(directory)
    model = []
    for i in range(layers):
        if fits is not None:
            fits(i)
        layer = KTMoE(E, K, H, I, mmap_experts_dir=directory, layer_idx=i, numa_parts=1, **kwargs)
        assert layer.try_load_cached(fingerprints[i])
        model.append(layer)
    return model, (x, ids, w), refs


def _cold(layer):
    return layer.resident_bytes <= 0.05 * layer.packed_bytes


def test_auto_is_the_default_and_warms_a_fitting_model_in_the_background(tmp_path):
    model, (x, ids, w), refs = _cold_model(tmp_path)
    assert all(layer.warm_mode == "auto" for layer in model)
    warm = model[0].model_warm
    assert warm is not None and all(layer.model_warm is warm for layer in model)  # one per model directory
    model[-1].join_warm()
    assert all(layer.resident_bytes >= 0.99 * layer.packed_bytes for layer in model)
    p = warm.progress()
    assert p["warmed_layers"] == LAYERS and not p["running"] and p["queued_layers"] == 0
    assert p["errors"] == [] and p["stopped_reason"] == ""
    assert p["file_backed_bytes"] == sum(layer.file_backed_bytes for layer in model)
    assert p["warmed_bytes"] >= p["file_backed_bytes"]  # whole mappings (2 MiB slices) went through
    assert p["resident_bytes"] >= 0.99 * p["file_backed_bytes"]
    assert not any(layer.prefetching for layer in model)  # warm: no read-ahead left to do
    faults = torch_ktmoe.memory_report()["major_faults"]
    assert all(torch.equal(layer(x, ids, w), ref) for layer, ref in zip(model, refs))
    assert torch_ktmoe.memory_report()["major_faults"] == faults


def test_warm_none_stays_cold(tmp_path):
    model, (x, ids, w), refs = _cold_model(tmp_path, warm="none")
    time.sleep(0.3)
    assert all(layer.model_warm is None and _cold(layer) for layer in model)
    assert all(torch.equal(layer(x, ids, w), ref) for layer, ref in zip(model, refs))


def test_auto_does_not_warm_a_model_that_does_not_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "file_experts_fit_in_memory", lambda: False)
    model, (x, ids, w), refs = _cold_model(tmp_path)
    model[-1].join_warm()
    assert all(_cold(layer) for layer in model)
    assert all(layer.prefetching for layer in model)  # read-ahead of the routed experts instead
    assert "do not fit" in model[0].model_warm.progress()["stopped_reason"]
    assert all(torch.equal(layer(x, ids, w), ref) for layer, ref in zip(model, refs))


def test_a_later_layer_that_does_not_fit_stops_the_model_warm(tmp_path, monkeypatch):
    """Layers 0 and 1 fit when loaded, layer 2's load finds the model does not: warming stops, read-ahead on."""
    fits = {"answer": True}
    monkeypatch.setattr(memory, "file_experts_fit_in_memory", lambda: fits["answer"])
    model, (x, ids, w), refs = _cold_model(tmp_path, fits=lambda i: fits.update(answer=i < 2))
    model[-1].join_warm()
    p = model[0].model_warm.progress()
    assert "do not fit" in p["stopped_reason"] and p["queued_layers"] == 0 and not p["running"]
    assert _cold(model[2])  # never queued
    assert all(layer.prefetching for layer in model)
    assert all(torch.equal(layer(x, ids, w), ref) for layer, ref in zip(model, refs))


def test_a_layer_beyond_the_headroom_when_its_turn_comes_stops_the_warm(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "memory_headroom_bytes", lambda: 1 << 20)  # the model "fits", RAM filled since
    monkeypatch.setattr(memory, "file_experts_fit_in_memory", lambda: True)
    model, _, _ = _cold_model(tmp_path)
    model[-1].join_warm()
    assert "memory headroom" in model[0].model_warm.progress()["stopped_reason"]
    assert all(_cold(layer) for layer in model)


def test_anonymous_experts_get_no_warm():
    layer = KTMoE(E, K, H, I)
    layer.load_weights(*random_experts(E, H, I))
    assert layer.warm_mode == "auto" and layer.model_warm is None and not layer.prefetching
    layer.join_warm()


def test_a_warm_error_warns_and_the_forward_still_faults_in(tmp_path, monkeypatch):
    """An arena whose prefault fails (an I/O error) is a WarmWarning and a progress error; outputs unchanged."""
    monkeypatch.setattr(WeightArena, "prefault", lambda self, wait=True: None)
    monkeypatch.setattr(WeightArena, "prefault_status", property(lambda self: "error: pread: Input/output error"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, (x, ids, w), refs = _cold_model(tmp_path)
        model[-1].join_warm()
    messages = [str(c.message) for c in caught if issubclass(c.category, model_warm.WarmWarning)]
    assert len(messages) == LAYERS and all("Input/output error" in m for m in messages), messages
    assert len(model[0].model_warm.progress()["errors"]) == LAYERS
    assert all(_cold(layer) for layer in model)
    assert all(torch.equal(layer(x, ids, w), ref) for layer, ref in zip(model, refs))


def test_copies_share_the_model_warm(tmp_path):
    model, (x, ids, w), refs = _cold_model(tmp_path, layers=1)
    twin = copy.deepcopy(model[0])
    assert twin.model_warm is model[0].model_warm
    twin.join_warm()
    assert not twin.prefetching and torch.equal(twin(x, ids, w), refs[0])


CHILD = textwrap.dedent("""
    import gc, glob, os, sys, time, torch
    from torch_ktmoe import KTMoE
    directory, mode = sys.argv[1], sys.argv[2]
    E, K, H, I, L = 8, 2, 1024, 1024, 4  # 48 MiB per layer
    layers = [KTMoE(E, K, H, I, mmap_experts_dir=directory, layer_idx=i, numa_parts=1, warm="none") for i in range(L)]
    g = torch.Generator().manual_seed(0)
    for layer in layers:
        layer.load_weights(torch.randn(E, 2 * I, H, generator=g).bfloat16(), torch.randn(E, H, I, generator=g).bfloat16())
    fingerprints = [layer.cache_fingerprint for layer in layers]
    del layers, layer; gc.collect()
    for path in glob.glob(os.path.join(directory, "*.ktmoe")):
        fd = os.open(path, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
    model = []
    for i in range(L):
        model.append(KTMoE(E, K, H, I, mmap_experts_dir=directory, layer_idx=i, numa_parts=1))
        assert model[-1].try_load_cached(fingerprints[i])
    warm = model[0].model_warm
    print("RUNNING", warm.running, flush=True)
    if mode == "free":  # the model goes while its warm runs: no hang, the worker ends
        del model; gc.collect()
        assert warm.join(timeout=30), "the warm worker did not end after the model was freed"
        assert warm.progress()["file_backed_bytes"] == 0  # it kept no layer alive
    print("OK", flush=True)
""")


@pytest.mark.parametrize("mode", ["exit", "free"])
def test_interpreter_exit_or_freeing_the_model_during_a_warm_does_not_hang(tmp_path, mode):
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), mode], capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": ":".join(sys.path), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0 and "OK" in res.stdout, res.stdout + res.stderr
    assert "Warning" not in res.stderr, res.stderr
    assert time.monotonic() - t0 < 110


FORK_CHILD = textwrap.dedent("""
    import os, signal, sys, threading, time, torch
    from torch_ktmoe import KTMoE
    from torch_ktmoe.residency import model_warm
    directory, child_does = sys.argv[1], sys.argv[2]
    go = threading.Event()  # the worker starts once the layer's file is cold: its read is long
    real_warm_layer = model_warm.ModelWarm._warm_layer
    model_warm.ModelWarm._warm_layer = lambda self, layer: (go.wait(), real_warm_layer(self, layer))[1]
    E, H, I = 16, 2048, 2048  # 384 MiB of bf16 experts
    layer = KTMoE(E, 2, H, I, mmap_experts_dir=directory, numa_parts=1)  # warm="auto"
    layer.load_weights(torch.empty(E, 2 * I, H, dtype=torch.bfloat16).normal_(),
                       torch.empty(E, H, I, dtype=torch.bfloat16).normal_())
    (arena,) = layer.arenas
    arena.evict()
    go.set()
    while arena.prefault_status != "running" or layer.model_warm._current is None:
        time.sleep(0.001)
    pid = os.fork()  # while the worker thread and the arena's C++ read run
    if pid == 0:
        status = arena.prefault_status  # "error: stopped": the read runs in the parent only
        if child_does == "join":
            layer.join_warm()
        print("CHILD", repr(status), layer.model_warm.running, flush=True)
        sys.exit(0)  # runs the atexit stop_all_warms
    deadline = time.monotonic() + 30
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            print("HUNG", flush=True)
            break
        time.sleep(0.05)
    layer.join_warm()
    print("PARENT", layer.model_warm.progress()["warmed_layers"], arena.prefault_status, flush=True)
""")


@pytest.mark.parametrize("child_does", ["join", "exit"])
def test_a_child_forked_during_the_warm_starts_without_it(tmp_path, child_does):
    """fork() while the model warm's worker reads a layer: the child (which has neither the worker nor the
    arena's I/O thread) joins at once and exits; the parent's warm goes on."""
    res = subprocess.run([sys.executable, "-c", FORK_CHILD, str(tmp_path), child_does], capture_output=True,
                         text=True, timeout=120, env={"PYTHONPATH": ":".join(sys.path), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0 and "HUNG" not in res.stdout, res.stdout + res.stderr
    assert "CHILD 'error: stopped' False" in res.stdout, res.stdout + res.stderr
    assert "PARENT 1 populate_read" in res.stdout, res.stdout + res.stderr
