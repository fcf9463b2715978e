"""torch_ktmoe.checkpoint.checkpoint_fingerprint: a checkpoint swapped under the same names, sizes and mtimes
is another checkpoint; bad files get clear errors; the cost is bounded per file."""
import os

import pytest
import torch

pytest.importorskip("safetensors")
from safetensors.torch import save_file  # noqa: E402

from torch_ktmoe.checkpoint import (  # noqa: E402
    SafetensorsCheckpoint,
    checkpoint_fingerprint,
    find_experts,
    load_experts,
)
from torch_ktmoe.checkpoint.fingerprint import SAMPLE_BYTES, SAMPLES, WHOLE_FILE_BYTES, sample_ranges  # noqa: E402
from tests.helpers import random_experts, random_routing  # noqa: E402

E, H, I, K = 4, 128, 128, 2  # a 768 KiB shard: sampled, not hashed whole
P = "model.layers.0.mlp.experts"


def _write(path, seed, dtype=torch.float32, extra_tensors=0):
    """A one-shard checkpoint of one experts block (and ``extra_tensors`` small others); returns (gate_up, down)."""
    gate_up, down = random_experts(E, H, I, seed=seed)
    os.makedirs(path, exist_ok=True)
    tensors = {f"model.layers.0.extra.{i}.weight": torch.zeros(2) for i in range(extra_tensors)}
    tensors.update({f"{P}.gate_up_proj": gate_up.to(dtype), f"{P}.down_proj": down.to(dtype)})
    save_file(tensors, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write('{"model_type": "test"}')
    return gate_up.to(dtype).float(), down.to(dtype).float()


def _swap_keeping_stat(path, seed, **write_kwargs):
    """Rewrites the checkpoint with other values, then puts the mtimes back (as rsync -a / cp -p / tar do)."""
    files = [os.path.join(path, n) for n in ("model.safetensors", "config.json")]
    before = [os.stat(f) for f in files]
    weights = _write(path, seed, **write_kwargs)
    for f, st in zip(files, before):
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (os.stat(f).st_size, os.stat(f).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    return weights


def _load(src, cache_dir):
    with SafetensorsCheckpoint(src) as ckpt:
        return load_experts(E, K, H, I, find_experts(ckpt, [P], H, I).experts(range(E)),
                            source=checkpoint_fingerprint(src, "test"), key=P, mmap_experts_dir=cache_dir,
                            weight_format="bf16")


def test_swapped_checkpoint_is_packed_again_and_runs_the_new_weights(tmp_path):
    src, cache_dir = tmp_path / "ckpt", tmp_path / "cache"
    _write(src, seed=1)
    first = _load(src, cache_dir)
    assert not first.cache_hit
    _swap_keeping_stat(src, seed=2)
    second = _load(src, cache_dir)
    assert not second.cache_hit, "the old packed experts were reused for a swapped checkpoint"
    _write(tmp_path / "new", seed=2)
    fresh = _load(tmp_path / "new", None)  # the new weights, packed without a cache
    x = torch.randn(5, H)
    ids, w = random_routing(5, E, K)
    assert torch.equal(second(x, ids, w), fresh(x, ids, w))
    assert not torch.equal(first(x, ids, w), second(x, ids, w))
    assert _load(src, cache_dir).cache_hit  # an unchanged checkpoint still hits


def test_header_and_content_each_change_the_fingerprint(tmp_path):
    src = tmp_path / "ckpt"
    _write(src, seed=1, extra_tensors=300)
    shard = os.path.join(src, "model.safetensors")
    assert os.path.getsize(shard) > WHOLE_FILE_BYTES
    base = checkpoint_fingerprint(src)
    assert checkpoint_fingerprint(src) == base and checkpoint_fingerprint(src, "salt") != base
    _swap_keeping_stat(src, seed=2, extra_tensors=300)
    assert checkpoint_fingerprint(src) != base  # same header, other values
    _swap_keeping_stat(src, seed=1, extra_tensors=300)
    assert checkpoint_fingerprint(src) == base  # the same bytes again
    st = os.stat(shard)
    with open(shard, "r+b") as f:  # a header byte no sample reads: another dtype, same size and mtime
        data = f.read()
        header_end = 8 + int.from_bytes(data[:8], "little")
        sampled = [range(o, o + n) for o, n in sample_ranges(len(data))]
        at = next(i for i in range(header_end) if data.startswith(b'"F32"', i) and not any(i in r for r in sampled))
        f.seek(at)
        f.write(b'"I32"')
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert checkpoint_fingerprint(src) != base
    _write(src, seed=1, extra_tensors=300)
    changed = checkpoint_fingerprint(src)
    with open(os.path.join(src, "config.json"), "w") as f:  # a small file is hashed whole
        f.write('{"model_type": "tset"}')
    assert checkpoint_fingerprint(src) != changed


def test_sample_ranges_cover_the_file_ends_and_stay_bounded():
    assert sample_ranges(0) == []
    assert sample_ranges(100) == [(0, 100)]
    assert sample_ranges(WHOLE_FILE_BYTES) == [(0, WHOLE_FILE_BYTES)]
    size = 4 << 30
    ranges = sample_ranges(size)
    assert len(ranges) == SAMPLES and all(n == SAMPLE_BYTES for _, n in ranges)
    assert ranges[0][0] == 0 and ranges[-1][0] + SAMPLE_BYTES == size
    assert all(a[0] < b[0] for a, b in zip(ranges, ranges[1:]))


def test_bad_files_get_errors_naming_them(tmp_path):
    src = tmp_path / "ckpt"
    _write(src, seed=1)
    junk = src / "junk.safetensors"
    junk.write_bytes(b"\xff" * 64)  # a header length far beyond the file
    with pytest.raises(ValueError, match=r"junk\.safetensors.* is not a safetensors file \(its header claims"):
        checkpoint_fingerprint(src)
    junk.write_bytes(b"abc")
    with pytest.raises(ValueError, match=r"junk\.safetensors.* is not a safetensors file \(3 bytes"):
        checkpoint_fingerprint(src)
    junk.unlink()
    os.mkfifo(src / "pipe.json")  # never blocks
    with pytest.raises(ValueError, match=r"pipe\.json.* is not a regular file"):
        checkpoint_fingerprint(src)


def test_undecodable_file_names_are_hashed(tmp_path):
    src = tmp_path / "ckpt"
    _write(src, seed=1)
    base = checkpoint_fingerprint(src)
    extra = os.path.join(os.fsencode(src), b"extra\xff.json")
    with open(extra, "wb") as f:
        f.write(b"{}")
    assert checkpoint_fingerprint(src) != base
    assert checkpoint_fingerprint(os.fsdecode(os.fsencode(src))) == checkpoint_fingerprint(src)


def test_settled_files_are_hashed_once_per_stat(tmp_path, monkeypatch):
    from torch_ktmoe.checkpoint import fingerprint

    src = tmp_path / "ckpt"
    _write(src, seed=1)
    hashed = []
    real_hash_file = fingerprint._hash_file
    monkeypatch.setattr(fingerprint, "_hash_file", lambda h, file, name: (hashed.append(name),
                                                                          real_hash_file(h, file, name)))
    first = checkpoint_fingerprint(src)
    assert checkpoint_fingerprint(src) == first and len(hashed) == 4  # just written: not kept, hashed again
    monkeypatch.setattr(fingerprint.time, "time_ns", lambda: os.stat(src / "config.json").st_ctime_ns + 10**10)
    assert checkpoint_fingerprint(src, "a") != checkpoint_fingerprint(src, "b")
    assert len(hashed) == 6  # settled: hashed once, then kept
    _swap_keeping_stat(src, seed=2)  # a new ctime
    assert checkpoint_fingerprint(src) != first and len(hashed) == 8


def _index_to(src, shard):
    """Moves the checkpoint's one shard to ``src/shard`` and writes an index naming it there."""
    import json

    os.makedirs(os.path.dirname(os.path.join(src, shard)), exist_ok=True)
    os.replace(os.path.join(src, "model.safetensors"), os.path.join(src, shard))
    with open(os.path.join(src, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {f"{P}.gate_up_proj": shard, f"{P}.down_proj": shard}}, f)


def test_a_shard_in_a_subdirectory_is_fingerprinted(tmp_path):
    src = tmp_path / "ckpt"
    _write(src, seed=1)
    _index_to(src, "sub/x.safetensors")
    base = checkpoint_fingerprint(src)
    _write(tmp_path / "other", seed=2)
    os.replace(tmp_path / "other" / "model.safetensors", src / "sub" / "x.safetensors")  # other experts
    assert checkpoint_fingerprint(src) != base


@pytest.mark.parametrize("shard", ["../x.safetensors", "/abs/x.safetensors", "sub/../../x.safetensors", ""])
def test_a_shard_named_outside_the_directory_is_refused(tmp_path, shard):
    src = tmp_path / "ckpt"
    _write(src, seed=1)
    _index_to(tmp_path / "ckpt", "sub/x.safetensors")
    with open(src / "model.safetensors.index.json", "w") as f:
        f.write('{"weight_map": {"%s.down_proj": "%s"}}' % (P, shard))
    if shard.startswith("../"):
        os.replace(src / "sub" / "x.safetensors", tmp_path / "x.safetensors")
    match = rf"model\.safetensors\.index\.json: weight_map\[.*down_proj'\] = '{shard}' is not a file inside"
    with pytest.raises(ValueError, match=match):
        checkpoint_fingerprint(src)
    with pytest.raises(ValueError, match=match):
        SafetensorsCheckpoint(src)
