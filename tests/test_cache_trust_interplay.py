"""The cache's trust checks against pickling and packed model directories: a refused cache dir keeps
no file (so no pickling by file, no manifest naming files that do not exist), an opted-in layer
pickles, and a packed directory owned by another user still loads."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from tests.helpers import root_only
from tests.helpers.cache_layer import FILE, loaded, run


def _shared_dir(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    return d


# ---------------------------------------------------------------- pickling
def test_pickling_layer_in_refused_dir_raises_at_pickle_time(tmp_path):
    d = _shared_dir(tmp_path)
    m = loaded(d)
    assert m.file_backed_bytes > 0 and m.arenas[0].cache_refusal and not m.arenas[0].read_only
    with pytest.raises(TypeError, match=r"cannot pickle.*unnamed files.*writable by others"):
        pickle.dumps(m)
    assert os.listdir(d) == []


def test_pickling_trusting_layer_in_shared_dir_round_trips(tmp_path):
    d = _shared_dir(tmp_path)
    m = loaded(d, cache_trust_others=True, verify="full")
    assert (d / FILE).exists() and all(a.read_only for a in m.arenas)
    m2 = pickle.loads(pickle.dumps(m))
    assert m2.cache_trust_others and m2.verify == "full" and m2.cache_hit
    assert torch.equal(run(m2), run(m))


# ---------------------------------------------------------------- packed model directories
hf = pytest.importorskip("torch_ktmoe.hf")  # transformers
pytest.importorskip("transformers")

from torch_ktmoe.hf.packed_dir import MANIFEST, PackedDirError  # noqa: E402

from tests.helpers.hf_models import logits, source_checkpoint  # noqa: E402


def test_save_packed_into_refused_experts_dir_writes_no_manifest(tmp_path):
    model = hf.from_pretrained(source_checkpoint(tmp_path, "olmoe"), dtype=torch.float32, progress=False)
    experts = tmp_path / "packed" / "experts"
    experts.mkdir(parents=True)
    os.chmod(experts, 0o777)
    with pytest.raises(PackedDirError, match="neither empty nor a packed model directory"):  # not written into
        hf.save_packed(model, tmp_path / "packed")
    assert not (tmp_path / "packed" / MANIFEST).exists() and os.listdir(experts) == []


def test_save_packed_from_refused_cache_repacks(tmp_path):
    src = source_checkpoint(tmp_path, "olmoe")
    cache_dir = _shared_dir(tmp_path)  # refused: the model's experts live in unnamed files
    model = hf.from_pretrained(src, dtype=torch.float32, mmap_experts_dir=cache_dir, progress=False)
    manifest = hf.save_packed(model, tmp_path / "packed")
    for e in manifest["layers"]:
        assert all((tmp_path / "packed" / "experts" / n).is_file() for n in e["files"])
    assert not any(".copy." in n or ".tmp." in n for n in os.listdir(tmp_path / "packed" / "experts"))
    loaded_model = hf.from_pretrained(tmp_path / "packed", dtype=torch.float32, progress=False)
    assert torch.equal(logits(loaded_model), logits(model))


def test_save_packed_does_not_copy_a_replaced_cache_file(tmp_path):
    src = source_checkpoint(tmp_path, "olmoe")
    model = hf.from_pretrained(src, dtype=torch.float32, mmap_experts_dir=tmp_path / "cache", progress=False)
    victim = tmp_path / "cache" / "layer0000.part0.ktmoe"
    planted = tmp_path / "planted"
    planted.write_bytes(b"\0" * 4096)
    os.replace(planted, victim)  # a new inode: the model's mapping keeps the old one
    manifest = hf.save_packed(model, tmp_path / "packed")
    assert (tmp_path / "packed" / "experts" / manifest["layers"][0]["files"][0]).read_bytes() != b"\0" * 4096
    kept = sorted(n for n in os.listdir(tmp_path / "packed" / "experts") if not n.endswith(".lock"))
    assert kept == sorted(n for e in manifest["layers"] for n in e["files"])  # no staging copy left
    loaded_model = hf.from_pretrained(tmp_path / "packed", dtype=torch.float32, progress=False)
    assert torch.equal(logits(loaded_model), logits(model))


@root_only
def test_packed_dir_owned_by_another_user_loads(tmp_path):
    model = hf.from_pretrained(source_checkpoint(tmp_path, "olmoe"), dtype=torch.float32, progress=False)
    hf.save_packed(model, tmp_path / "packed")
    for root, dirs, files in os.walk(tmp_path / "packed"):
        for name in [*dirs, *files]:
            os.chown(os.path.join(root, name), 65534, 65534)
    os.chown(tmp_path / "packed", 65534, 65534)
    loaded_model = hf.from_pretrained(tmp_path / "packed", dtype=torch.float32, progress=False)
    ktms = [a.ktmoe for a in loaded_model.modules() if type(a).__name__ == "KTMoEExperts"]
    assert ktms and all(k.cache_hit and k.cache_trust_others for k in ktms)
    assert torch.equal(logits(loaded_model), logits(model))
