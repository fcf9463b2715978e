"""The packed model directory: hf.save_packed(model, DIR), then hf.from_pretrained(DIR) without the source."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

pytest.importorskip("transformers")

from torch_ktmoe import hf  # noqa: E402
from torch_ktmoe.hf.packed_dir import MANIFEST, PackedDirError  # noqa: E402

from tests.helpers.hf_models import greedy, logits, make_model, source_checkpoint  # noqa: E402


@pytest.mark.parametrize("kind,fmt", [("qwen3_moe", "bf16"), ("deepseek_v3", "int4"), ("mixtral", "int8")])
def test_packed_dir_loads_without_source_bit_identical(tmp_path, kind, fmt):
    src = source_checkpoint(tmp_path, kind)
    model = hf.from_pretrained(src, dtype=torch.float32, weight_format=fmt, progress=False)
    ref, (ref_seq, _) = logits(model), greedy(model)
    manifest = hf.save_packed(model, tmp_path / "packed")
    assert {e["weight_format"] for e in manifest["layers"]} == {fmt}
    shutil.rmtree(src)  # the source checkpoint is gone
    loaded = hf.from_pretrained(tmp_path / "packed", dtype=torch.float32, progress=False)
    ktms = [a.ktmoe for a in loaded.modules() if type(a).__name__ == "KTMoEExperts"]
    assert len(ktms) == len(manifest["layers"]) and all(k.cache_hit for k in ktms), "mapped, never packed"
    assert all(k.file_backed_bytes == k.packed_bytes > 0 for k in ktms)
    assert loaded.ktmoe_report.layers_patched == model.ktmoe_report.layers_patched
    assert torch.equal(logits(loaded), ref)
    assert torch.equal(greedy(loaded)[0], ref_seq)


def test_packed_dir_from_file_backed_model_copies_cache_files(tmp_path):
    src = source_checkpoint(tmp_path, "olmoe")
    model = hf.from_pretrained(src, dtype=torch.float32, mmap_experts_dir=tmp_path / "cache", progress=False)
    manifest = hf.save_packed(model, tmp_path / "packed")
    for e in manifest["layers"]:
        for name in e["files"]:
            assert (tmp_path / "packed" / "experts" / name).read_bytes() == (tmp_path / "cache" / name).read_bytes()
    loaded = hf.from_pretrained(tmp_path / "packed", dtype=torch.float32, progress=False)
    assert torch.equal(logits(loaded), logits(model))


def test_packed_dir_corrupt_expert_file_names_it(tmp_path):
    model = hf.from_pretrained(source_checkpoint(tmp_path, "olmoe"), dtype=torch.float32, progress=False)
    manifest = hf.save_packed(model, tmp_path / "packed")
    victim = tmp_path / "packed" / "experts" / manifest["layers"][1]["files"][0]
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF  # inside the header
    victim.write_bytes(bytes(data))
    with pytest.raises(PackedDirError, match=r"model\.layers\.1\.mlp\.experts"):
        hf.from_pretrained(tmp_path / "packed", dtype=torch.float32, progress=False)
    victim.unlink()
    with pytest.raises(PackedDirError, match="missing or invalid"):
        hf.from_pretrained(tmp_path / "packed", dtype=torch.float32, progress=False)


def test_packed_dir_refuses_conflicting_arguments_and_bad_manifests(tmp_path):
    model = hf.from_pretrained(source_checkpoint(tmp_path, "olmoe"), dtype=torch.float32, progress=False)
    hf.save_packed(model, tmp_path / "packed")
    with pytest.raises(PackedDirError, match="fixes weight_format"):
        hf.from_pretrained(tmp_path / "packed", weight_format="int8", progress=False)
    with pytest.raises(PackedDirError, match="fixes mmap_experts_dir"):
        hf.from_pretrained(tmp_path / "packed", mmap_experts_dir=tmp_path / "x", progress=False)
    path = tmp_path / "packed" / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["layers"][0]["intermediate_size"] += 16
    path.write_text(json.dumps(manifest))
    with pytest.raises(PackedDirError, match="manifest"):
        hf.from_pretrained(tmp_path / "packed", dtype=torch.float32, progress=False)
    manifest["version"] = 99
    path.write_text(json.dumps(manifest))
    with pytest.raises(PackedDirError, match="version"):
        hf.from_pretrained(tmp_path / "packed", dtype=torch.float32, progress=False)


def test_save_packed_of_an_unpatched_model_raises(tmp_path):
    with pytest.raises(PackedDirError, match="patch it first"):
        hf.save_packed(make_model("olmoe"), tmp_path / "packed")
    assert not (tmp_path / "packed" / MANIFEST).exists()
