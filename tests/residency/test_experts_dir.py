"""ExpertsDir: one object per experts directory (real path), holding the read-ahead decision and the warm;
file and lock names from C++; arenas opened by a load or a build only."""
import gc

import torch_ktmoe
from tests.helpers import random_experts
from torch_ktmoe import KTMoE
from torch_ktmoe.residency.experts_dir import experts_dir, layer_file_names, layer_lock_names

E, K, H, I = 8, 2, 256, 128


def _live_arenas() -> int:
    gc.collect()
    return torch_ktmoe.memory_report()["arenas"]


def test_one_object_per_real_path(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "model")
    a, b = experts_dir(tmp_path / "model"), experts_dir(tmp_path / "link")
    assert a is b and a.path == str((tmp_path / "model").resolve())
    layers = [KTMoE(E, K, H, I, mmap_experts_dir=tmp_path / name, layer_idx=i, numa_parts=1)
              for i, name in enumerate(("model", "link"))]
    for layer in layers:
        layer.load_weights(*random_experts(E, H, I))
        layer.join_warm()
    assert all(layer.model_warm is a.warm for layer in layers)
    assert [x.layer_idx for x in a.layers()] == [0, 1]
    assert a.residency()["file_backed_bytes"] == sum(layer.file_backed_bytes for layer in layers)


def test_file_and_lock_names_come_from_cpp():
    assert layer_file_names(3, 2) == ["layer0003.part0.ktmoe", "layer0003.part1.ktmoe"]
    assert layer_lock_names(3, 1) == ["layer0003.part0.ktmoe.lock"]


def test_a_cache_miss_opens_each_parts_arena_once(tmp_path):
    before = _live_arenas()
    layer = KTMoE(E, K, H, I, mmap_experts_dir=tmp_path, numa_parts=2, warm="none")
    assert _live_arenas() == before and len(layer.arena_stats()) == 2  # no placeholders
    assert not layer.try_load_cached("no such fingerprint") and _live_arenas() == before + 1  # part 0 missed
    layer.load_weights(*random_experts(E, H, I))  # builds into the arena the missed load opened, and part 1's
    assert _live_arenas() == before + 2 and layer.arenas.kept


def test_kept_is_the_one_answer(tmp_path):
    off = KTMoE(E, K, H, I, mmap_experts_dir=tmp_path, numa_parts=1, cache="off", warm="none")
    off.load_weights(*random_experts(E, H, I))
    assert off.file_backed_bytes > 0 and not off.arenas.kept and off.arenas.refusals() == ""
    assert not KTMoE(E, K, H, I, numa_parts=1).arenas.kept
