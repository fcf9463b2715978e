"""A packed model directory is a model people receive: loading it only reads, inside it.

Its manifest is checked field by field, ``experts_dir`` stays inside the directory, symlinks
may lead only into the hub repo folder of a Hugging Face cache snapshot, and a save that fails
late leaves the directory it was replacing as it was."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest
import torch

pytest.importorskip("transformers")

from torch_ktmoe import hf  # noqa: E402
from torch_ktmoe.hf import packed_dir  # noqa: E402
from torch_ktmoe.hf.packed_dir import MANIFEST, PackedDirError  # noqa: E402

from tests.helpers.hf_models import logits, source_checkpoint  # noqa: E402

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another user")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A packed olmoe directory and the logits of the model it was saved from."""
    tmp = tmp_path_factory.mktemp("saved")
    model = hf.from_pretrained(source_checkpoint(tmp, "olmoe"), dtype=torch.float32, progress=False)
    hf.save_packed(model, tmp / "packed")
    return tmp / "packed", logits(model)


@pytest.fixture
def packed(saved, tmp_path):
    d = tmp_path / "packed"
    shutil.copytree(saved[0], d)
    return d, saved[1]


def load(d):
    return hf.from_pretrained(d, dtype=torch.float32, progress=False)


def tree(root) -> dict:
    """Every entry under root (root included): type and mode, owner, size, mtime, content hash."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for path in [dirpath, *(os.path.join(dirpath, n) for n in filenames)]:
            st = os.lstat(path)
            digest = None
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as f:
                    digest = hashlib.blake2b(f.read(), digest_size=16).hexdigest()
            out[os.path.relpath(path, root)] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, digest)
    return out


def edit_manifest(d, change):
    path = d / MANIFEST
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    return str(path)


# -- loading only reads ------------------------------------------------------------------------------------


@pytest.mark.parametrize("owner", ["read_only_mode", pytest.param("other_uid", marks=root_only)])
def test_load_creates_and_deletes_nothing(packed, owner):
    d, ref = packed
    leftover = d / "experts" / "layer0000.part0.ktmoe.tmp.123"
    leftover.write_bytes(b"not ours to clean")
    if owner == "other_uid":
        for dirpath, _, filenames in os.walk(d):
            for p in [dirpath, *(os.path.join(dirpath, n) for n in filenames)]:
                os.chown(p, 65534, 65534)
    for sub in (d / "experts", d):
        os.chmod(sub, 0o555)
    try:
        before = tree(d)
        model = load(d)
        assert torch.equal(logits(model), ref)
        del model
        assert tree(d) == before  # no .lock, the temp file still there, nothing rewritten
        assert leftover.read_bytes() == b"not ours to clean"
    finally:
        for sub in (d, d / "experts"):
            os.chmod(sub, 0o755)


@pytest.mark.parametrize("experts_dir", ["../outside", "/abs/experts", "sub/experts", "..", ".", "", 7])
def test_experts_dir_must_be_a_plain_name_inside(packed, tmp_path, experts_dir):
    d, _ = packed
    outside = tmp_path / "outside"
    shutil.copytree(d / "experts", outside)  # a load that followed "../outside" would find valid files here
    before = tree(outside)
    manifest = edit_manifest(d, lambda m: m.update(experts_dir=experts_dir))
    with pytest.raises(PackedDirError, match="experts_dir must be a plain directory name") as e:
        load(d)
    assert manifest in str(e.value)
    assert tree(outside) == before


def _drop(field):
    return lambda m: m["layers"][1].pop(field)


def _set(field, value):
    return lambda m: m["layers"][1].update({field: value})


@pytest.mark.parametrize("change,field", [
    (lambda m: m.clear() or m.update(format="torch_ktmoe.packed_dir", version=1, experts_dir="experts"), "layers"),
    (lambda m: m.update(layers="all"), "layers"),
    (lambda m: m["layers"].__setitem__(0, ["not", "an", "object"]), "layers[0]"),
    (_drop("num_experts"), "num_experts"),
    (_drop("fingerprint"), "fingerprint"),
    (_set("num_experts", "8"), "layers[1].num_experts"),
    (_set("top_k", True), "layers[1].top_k"),
    (_set("hidden_size", -64), "layers[1].hidden_size"),
    (_set("layer_idx", 1.0), "layers[1].layer_idx"),
    (_set("weight_format", "fp64"), "layers[1].weight_format"),
    (_set("numa_parts", 0), "layers[1].numa_parts"),
    (_set("fingerprint", None), "layers[1].fingerprint"),
    (_set("files", ["../../etc/passwd"]), "layers[1].files"),
    (_set("module", "model.layers.0.mlp.experts"), "layers[1].module"),
    (lambda m: m["layers"][1].update(layer_idx=0, files=["layer0000.part0.ktmoe"]), "layers[1].layer_idx"),
])
def test_malformed_manifest_names_the_file_and_field(packed, change, field):
    d, _ = packed
    manifest = edit_manifest(d, change)
    with pytest.raises(PackedDirError) as e:
        load(d)
    assert manifest in str(e.value) and field in str(e.value), str(e.value)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "\xff\xfe", ""])
def test_manifest_that_is_not_json_names_the_file(packed, text):
    d, _ = packed
    (d / MANIFEST).write_bytes(text.encode("latin-1"))
    with pytest.raises(PackedDirError, match=MANIFEST):
        load(d)


# -- symlinks: a Hugging Face hub cache snapshot ------------------------------------------------------------


def hub_snapshot(packed_dir, repo):
    """``repo/snapshots/rev/...``: every file of ``packed_dir`` a relative symlink to ``repo/blobs/<sha256>``."""
    snap = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    for dirpath, _, filenames in os.walk(packed_dir):
        for name in filenames:
            src = os.path.join(dirpath, name)
            data = open(src, "rb").read()
            blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            link = snap / os.path.relpath(src, packed_dir)
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(blob, link.parent), link)
    return snap


def test_hub_snapshot_of_symlinks_loads(packed, tmp_path):
    d, ref = packed
    snap = hub_snapshot(d, tmp_path / "hub" / "models--org--name")
    assert os.path.islink(snap / "experts" / "layer0000.part0.ktmoe")
    before = tree(tmp_path / "hub")
    assert torch.equal(logits(load(snap)), ref)
    assert tree(tmp_path / "hub") == before


def test_symlink_out_of_the_snapshot_root_is_refused(packed, tmp_path):
    d, _ = packed
    snap = hub_snapshot(d, tmp_path / "hub" / "models--org--name")
    elsewhere = tmp_path / "elsewhere.ktmoe"
    shutil.copyfile(d / "experts" / "layer0001.part0.ktmoe", elsewhere)
    victim = snap / "experts" / "layer0001.part0.ktmoe"
    victim.unlink()
    os.symlink(elsewhere, victim)
    with pytest.raises(PackedDirError, match="outside the packed directory's root") as e:
        load(snap)
    assert str(victim) in str(e.value)


def test_symlinked_experts_dir_out_of_a_plain_directory_is_refused(packed, tmp_path):
    d, _ = packed
    shutil.move(d / "experts", tmp_path / "experts_elsewhere")
    os.symlink(tmp_path / "experts_elsewhere", d / "experts")
    with pytest.raises(PackedDirError, match="experts directory resolves to"):
        load(d)


def test_hub_download_fetches_the_packed_files(monkeypatch, tmp_path):
    import fnmatch

    import huggingface_hub

    from torch_ktmoe.hf import streaming

    repo_files = ["config.json", "model.safetensors", MANIFEST, "experts/layer0000.part0.ktmoe", "README.md"]
    fetched = []

    def snapshot_download(repo_id, allow_patterns=None, **kwargs):
        fetched.extend(f for f in repo_files if any(fnmatch.fnmatch(f, p) for p in allow_patterns))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert streaming._resolve_dir("org/packed-model") == str(tmp_path)
    assert set(fetched) == set(repo_files) - {"README.md"}


# -- save_packed ------------------------------------------------------------------------------------------


def test_save_packed_failing_late_leaves_the_old_directory_loadable(packed, tmp_path, monkeypatch):
    d, ref = packed
    before = tree(d)
    other = hf.from_pretrained(source_checkpoint(tmp_path, "olmoe"), dtype=torch.float32, weight_format="int8",
                               progress=False)
    write = packed_dir._write_layer_files

    def fail_on_the_last_layer(ktm, experts_dir, where):
        if where == "model.layers.1.mlp.experts":
            raise OSError(28, "No space left on device (injected)")
        return write(ktm, experts_dir, where)

    monkeypatch.setattr(packed_dir, "_write_layer_files", fail_on_the_last_layer)
    with pytest.raises(OSError, match="injected"):
        hf.save_packed(other, d)
    assert tree(d) == before
    assert sorted(os.listdir(d.parent)) == sorted(["packed", "src"]), "no staging directory left behind"
    assert torch.equal(logits(load(d)), ref)
    monkeypatch.undo()
    hf.save_packed(other, d)  # a complete save replaces it
    assert {e["weight_format"] for e in json.loads((d / MANIFEST).read_text())["layers"]} == {"int8"}
    assert torch.equal(logits(load(d)), logits(other))
    assert sorted(os.listdir(d.parent)) == sorted(["packed", "src"])


@pytest.mark.parametrize("owner", ["writable_by_others", pytest.param("other_uid", marks=root_only)])
def test_save_packed_over_a_directory_the_cache_would_not_trust(packed, tmp_path, owner):
    d, ref = packed
    if owner == "other_uid":
        os.chown(d / "experts", 65534, 65534)
    else:
        os.chmod(d / "experts", 0o777)
    model = load(d)
    hf.save_packed(model, d)  # a fresh directory of ours takes its place: nothing to trust
    assert os.stat(d / "experts").st_mode & 0o002 == 0 and os.stat(d / "experts").st_uid == os.geteuid()
    assert torch.equal(logits(load(d)), ref)


def test_save_packed_refusals_name_the_problem_and_leave_nothing(packed, tmp_path):
    d, _ = packed
    model = load(d)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(PackedDirError, match="neither empty nor a packed model directory"):
        hf.save_packed(model, busy)
    assert os.listdir(busy) == ["notes.txt"]
    (tmp_path / "afile").write_text("x")
    with pytest.raises(PackedDirError, match="is not a directory"):
        hf.save_packed(model, tmp_path / "afile")
    if os.path.isdir("/dev/shm"):
        shm = f"/dev/shm/ktmoe-test-save-packed-{os.getpid()}"
        try:
            with pytest.raises(PackedDirError, match="tmpfs") as e:
                hf.save_packed(model, shm)
            assert "cache_trust_others" not in str(e.value)
            assert not os.path.exists(shm)
            assert not [n for n in os.listdir("/dev/shm") if n.startswith(f".ktmoe-test-save-packed-{os.getpid()}")]
        finally:
            shutil.rmtree(shm, ignore_errors=True)
