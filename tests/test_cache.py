"""The persistent packed cache: reuse, every kind of invalid file, atomicity, locking, HF, CLI."""
import os
import subprocess
import sys

import pytest
import torch

from torch_ktmoe import KTMoE, cache
from torch_ktmoe import layer as layer_mod
from tests.helpers import random_experts
from tests.helpers.cache_layer import E, FILE, H, I, loaded, make, reason, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_reuse_maps_without_packing_bit_identical(tmp_path, monkeypatch):
    first = loaded(tmp_path, numa_parts=2)
    assert not first.cache_hit and all(e["reason"] == "missing" for e in first.cache_events)
    ref = run(first)
    monkeypatch.setattr(layer_mod.ops, "pack_experts", lambda *a, **k: pytest.fail("packed"))
    second = loaded(tmp_path, numa_parts=2)
    assert second.cache_hit
    assert all(a.read_only and a.file_mode for a in second.arenas)
    assert torch.equal(run(second), ref)
    assert second.file_backed_bytes >= second.packed_bytes
    assert cache.leftover_temp_files(tmp_path) == []


def test_stale_fingerprint_rebuilt(tmp_path):
    loaded(tmp_path, seed=0)
    m = loaded(tmp_path, seed=1)  # other weights
    assert not m.cache_hit and reason(m).startswith("stale: source fingerprint")
    fresh = loaded(None, seed=1)
    assert torch.equal(run(m), run(fresh))
    assert loaded(tmp_path, seed=1).cache_hit  # the file now holds the new weights


@pytest.mark.parametrize("change, why", [(dict(fmt="bf16"), "stale: weight format"),
                                         (dict(numa_parts=2), "stale: intermediate range")])
def test_stale_layout_rebuilt(tmp_path, change, why):
    loaded(tmp_path)
    m = loaded(tmp_path, **change)
    assert not m.cache_hit and m.cache_events[0]["reason"].startswith(why)


def test_explicit_fingerprint_and_rebuild_policy(tmp_path):
    m = make(tmp_path)
    m.load_weights(*random_experts(E, H, I), fingerprint="ckpt-v1")
    assert m.try_load_cached("ckpt-v1") and not make(tmp_path).try_load_cached("ckpt-v2")
    r = loaded(tmp_path, cache="rebuild")
    assert not r.cache_hit and reason(r) == "cache='rebuild'"
    assert not make(tmp_path, cache="rebuild").try_load_cached("ckpt-v1")


def damage_truncate(path):
    os.truncate(path, os.path.getsize(path) // 2)


def damage_foreign(path):
    size = os.path.getsize(path)
    os.unlink(path)
    with open(path, "wb") as f:
        f.write(os.urandom(size))


def damage_checksum(path):
    with open(path, "r+b") as f:  # one byte of the header's fingerprint
        f.seek(400)
        b = f.read(1)
        f.seek(400)
        f.write(bytes([b[0] ^ 0xFF]))


def damage_empty(path):
    os.truncate(path, 0)


@pytest.mark.parametrize("damage, why", [(damage_truncate, "truncated"), (damage_foreign, "foreign"),
                                         (damage_checksum, "corrupt: header checksum"), (damage_empty, "truncated")])
def test_invalid_file_rebuilt(tmp_path, damage, why):
    ref = run(loaded(tmp_path))
    damage(tmp_path / FILE)
    assert not cache.inspect_dir(tmp_path)[0]["valid"]
    m = loaded(tmp_path)
    assert not m.cache_hit and reason(m).startswith(why), reason(m)
    assert torch.equal(run(m), ref)
    assert cache.inspect_dir(tmp_path)[0]["valid"]
    assert loaded(tmp_path).cache_hit


def test_no_temp_file_after_exception(tmp_path, monkeypatch):
    real = layer_mod.ops.pack_experts

    def fail_after_packing(*a, **k):
        real(*a, **k)
        raise RuntimeError("boom")

    monkeypatch.setattr(layer_mod.ops, "pack_experts", fail_after_packing)
    with pytest.raises(RuntimeError, match="boom"):
        loaded(tmp_path)
    assert cache.leftover_temp_files(tmp_path) == [] and not (tmp_path / FILE).exists()


def test_crashed_build_temp_file_removed(tmp_path):
    (tmp_path / (FILE + ".tmp.999999999")).write_bytes(b"half a build")
    assert cache.leftover_temp_files(tmp_path)
    loaded(tmp_path)
    assert cache.leftover_temp_files(tmp_path) == [] and loaded(tmp_path).cache_hit


def test_off_leaves_no_file(tmp_path):
    m = loaded(tmp_path, cache="off")
    assert m.file_backed_bytes > 0 and m.cache_events == []
    assert os.listdir(tmp_path) == []


def test_unusable_directory_falls_back(tmp_path):
    from torch_ktmoe.arena import ArenaFallbackWarning

    with pytest.warns(ArenaFallbackWarning):
        m = loaded(tmp_path / "missing")
    assert not m.cache_hit and reason(m).startswith("unusable directory")
    assert m.file_backed_bytes == 0 and torch.equal(run(m), run(loaded(None)))


CHILD = """
import sys, torch
sys.path.insert(0, {root!r})
from tests.helpers.cache_layer import loaded, run
m = loaded({dir!r})
torch.save((m.cache_hit, run(m)), sys.argv[1])
"""


def test_two_processes_build_concurrently(tmp_path):
    d = tmp_path / "cache"
    d.mkdir()
    script = CHILD.format(root=ROOT, dir=str(d))
    outs = [tmp_path / f"out{i}.pt" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", script, str(o)]) for o in outs]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    (hit0, y0), (hit1, y1) = (torch.load(o) for o in outs)
    assert sorted([hit0, hit1]) == [False, True]  # the lock: one built, the other reused
    assert torch.equal(y0, y1) and torch.equal(y0, run(loaded(None)))
    assert [r["valid"] for r in cache.inspect_dir(d)] == [True]
    assert cache.leftover_temp_files(d) == []


# ---------------------------------------------------------------------------------------------
# Hugging Face and the CLI


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from tests.helpers.hf_models import make_model

    path = tmp_path_factory.mktemp("ckpt") / "qwen3_moe"
    make_model("qwen3_moe").save_pretrained(path)
    return path


def test_from_pretrained_second_is_cache_hit(tiny_checkpoint, tmp_path, monkeypatch):
    from tests.helpers.hf_models import logits
    from torch_ktmoe import hf
    from torch_ktmoe.checkpoint import SafetensorsCheckpoint

    first = hf.from_pretrained(tiny_checkpoint, dtype=torch.float32, mmap_experts_dir=tmp_path,
                               weight_format="int8", progress=False)
    ref = logits(first)
    for read in ("get", "get_row"):  # no tensor of the checkpoint is read (only shapes are looked up)
        monkeypatch.setattr(SafetensorsCheckpoint, read, lambda *a, **k: pytest.fail("read experts although cached"))
    second = hf.from_pretrained(tiny_checkpoint, dtype=torch.float32, mmap_experts_dir=tmp_path,
                                weight_format="int8", progress=False)
    layers = [m for m in second.modules() if isinstance(m, KTMoE)]
    assert len(layers) == 2 and all(m.cache_hit for m in layers)
    assert torch.equal(logits(second), ref)


def test_patch_model_second_is_cache_hit(tmp_path, monkeypatch):
    from tests.helpers.hf_models import logits, make_model
    from torch_ktmoe import hf

    first = make_model("qwen3_moe")
    hf.patch_model(first, mmap_experts_dir=tmp_path, weight_format="int8")
    monkeypatch.setattr(layer_mod.ops, "pack_experts", lambda *a, **k: pytest.fail("packed although cached"))
    second = make_model("qwen3_moe")  # same seed: same weights, same fingerprint
    hf.patch_model(second, mmap_experts_dir=tmp_path, weight_format="int8", cache="reuse")
    layers = [m for m in second.modules() if isinstance(m, KTMoE)]
    assert len(layers) == 2 and all(m.cache_hit for m in layers)
    assert torch.equal(logits(second), logits(first))


def test_cli_pack_and_inspect(tiny_checkpoint, tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    d = tmp_path / "cache"
    pack = subprocess.run([sys.executable, "-m", "torch_ktmoe", "pack", str(tiny_checkpoint), str(d),
                           "--format", "int8", "--quiet"], env=env, capture_output=True, text=True, timeout=300)
    assert pack.returncode == 0, pack.stderr
    damage_checksum(d / "layer0001.part0.ktmoe")
    insp = subprocess.run([sys.executable, "-m", "torch_ktmoe", "inspect", str(d)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert insp.returncode == 0, insp.stderr
    assert "layer0000.part0.ktmoe" in insp.stdout and "int8" in insp.stdout
    assert "invalid: corrupt: header checksum" in insp.stdout
    rows = {r["name"]: r for r in cache.inspect_dir(d)}
    assert rows["layer0000.part0.ktmoe"]["valid"] and rows["layer0000.part0.ktmoe"]["layer"] == 0


def test_cli_pack_missing_checkpoint_creates_nothing(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    d = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "torch_ktmoe", "pack", str(tmp_path / "no-such-ckpt"), str(d)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "does not exist" in r.stderr and "repo id" not in r.stderr, r.stderr
    assert not d.exists()


def test_cli_pack_refuses_tmpfs_up_front(tiny_checkpoint):
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    d = f"/dev/shm/ktmoe-test-pack-{os.getpid()}"
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "torch_ktmoe", "pack", str(tiny_checkpoint), d, "--quiet"],
                       env=env, capture_output=True, text=True, timeout=120)
    try:
        assert r.returncode != 0 and "tmpfs" in r.stderr and "packed" not in r.stdout, (r.stdout, r.stderr)
        assert not os.path.exists(d) or os.listdir(d) == []
    finally:
        if os.path.isdir(d):
            os.rmdir(d)


def test_cli_pack_reports_files_not_kept_truthfully(tiny_checkpoint, tmp_path):
    d = tmp_path / "cache"
    (d / "layer0001.part0.ktmoe").mkdir(parents=True)  # rename over a directory fails: that layer is not kept
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "torch_ktmoe", "pack", str(tiny_checkpoint), str(d), "--format", "int8",
                        "--quiet"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "kept 1 of 2 cache files" in r.stdout and "layer0001.part0 was not kept" in r.stderr, (r.stdout, r.stderr)
