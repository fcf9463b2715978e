"""torch_ktmoe.checkpoint: the readers of a block's experts, find_experts, the load recipe (its import layering:
tests/test_layering.py)."""
import os

import pytest
import torch

pytest.importorskip("safetensors")
from safetensors.torch import save_file  # noqa: E402

from torch_ktmoe.checkpoint import (  # noqa: E402
    FusedExperts,
    FusedLayout,
    Mxfp4Experts,
    PerExpertTensors,
    SafetensorsCheckpoint,
    checkpoint_fingerprint,
    find_experts,
    load_experts,
    quantize_mxfp4,
)
from tests.helpers import random_experts  # noqa: E402

E, H, I, K = 4, 64, 32, 2
P = "model.layers.0.mlp.experts"


def _save(path, tensors):
    os.makedirs(path, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(path, "model.safetensors"))
    return SafetensorsCheckpoint(path)


def _per_expert(gate_up, down):
    out = {}
    for e in range(E):
        out.update({f"{P}.{e}.gate_proj.weight": gate_up[e, :I], f"{P}.{e}.up_proj.weight": gate_up[e, I:],
                    f"{P}.{e}.down_proj.weight": down[e]})
    return out


def _interleaved_transposed(gate_up, down):
    mixed = torch.empty_like(gate_up)
    mixed[:, 0::2], mixed[:, 1::2] = gate_up[:, :I], gate_up[:, I:]
    return mixed.transpose(1, 2), down.transpose(1, 2)


def test_every_reader_yields_gate_rows_first(tmp_path):
    gate_up, down = random_experts(E, H, I)
    gpt_oss = FusedLayout(transposed=True, interleaved=True)
    gu_t, dn_t = _interleaved_transposed(gate_up, down)
    cases = {
        "fused": ({f"{P}.gate_up_proj": gate_up, f"{P}.down_proj": down}, FusedLayout(), FusedExperts),
        "gpt_oss": ({f"{P}.gate_up_proj": gu_t, f"{P}.down_proj": dn_t}, gpt_oss, FusedExperts),
        "per_expert": (_per_expert(gate_up, down), FusedLayout(), PerExpertTensors),
    }
    for name, (tensors, layout, kind) in cases.items():
        with _save(tmp_path / name, tensors) as ckpt:
            reader = find_experts(ckpt, ["nowhere", P], H, I, num_experts=E, layout=layout)
            assert type(reader) is kind
            got = list(reader.experts([2, 0]))
            assert all(torch.equal(g, gate_up[e]) and torch.equal(d, down[e]) for (g, d), e in zip(got, [2, 0])), name


def test_mxfp4_reader_dequantizes_output_major_rows(tmp_path):
    gate_up, down = random_experts(E, H, I)
    mixed = torch.empty_like(gate_up)
    mixed[:, 0::2], mixed[:, 1::2] = gate_up[:, :I], gate_up[:, I:]
    tensors = {}
    for name, t in (("gate_up_proj", mixed), ("down_proj", down)):
        tensors[f"{P}.{name}_blocks"], tensors[f"{P}.{name}_scales"] = quantize_mxfp4(t)
    with _save(tmp_path, tensors) as ckpt:
        reader = find_experts(ckpt, [P], H, I, layout=FusedLayout(transposed=True, interleaved=True))
        assert type(reader) is Mxfp4Experts
        (g, d), = reader.experts([1])
        assert g.shape == (2 * I, H) and d.shape == (H, I)
        assert (g - gate_up[1]).abs().max() < 0.25 * gate_up[1].abs().max()  # gate rows first, FP4-rounded


def test_bad_checkpoints_get_errors_naming_the_keys(tmp_path):
    gate_up, down = random_experts(E, H, I)
    with _save(tmp_path / "fused", {f"{P}.gate_up_proj": gate_up, f"{P}.down_proj": down}) as ckpt:
        with pytest.raises(KeyError, match=r"no experts of layer 7 .*model\.layers\.7\.mlp\.experts\.gate_up_proj"):
            find_experts(ckpt, ["model.layers.7.mlp.experts"], H, I, what="layer 7")
        with pytest.raises(ValueError, match=rf"{P}\.gate_up_proj: shape \[4, 64, 64\] .*expected \[4, 32, 64\]"):
            find_experts(ckpt, [P], H, I // 2)
        with pytest.raises(ValueError, match=r"shape \[4, 64, 64\] .*expected \[8, 64, 64\]"):
            find_experts(ckpt, [P], H, I, num_experts=8)
        with pytest.raises(ValueError, match=r"expert 4 is not in .*gate_up_proj \(4 experts\)"):
            list(find_experts(ckpt, [P], H, I).experts([0, 4]))
    tensors = _per_expert(gate_up, down)
    del tensors[f"{P}.3.up_proj.weight"]
    with _save(tmp_path / "per_expert", tensors) as ckpt:
        with pytest.raises(KeyError, match=r"expert 3 is missing .*3\.up_proj\.weight"):
            list(find_experts(ckpt, [P], H, I).experts(range(E)))


def test_load_experts_maps_the_cache_without_reading_the_checkpoint(tmp_path):
    gate_up, down = random_experts(E, H, I)
    src = tmp_path / "ckpt"
    with _save(src, {f"{P}.gate_up_proj": gate_up, f"{P}.down_proj": down}) as ckpt:
        source = checkpoint_fingerprint(src, "test")
        cache_dir = tmp_path / "not" / "yet" / "there"
        first = load_experts(E, K, H, I, find_experts(ckpt, [P], H, I).experts(range(E)), source=source, key=P,
                             mmap_experts_dir=cache_dir, weight_format="int8")
        assert os.path.isdir(cache_dir) and not first.cache_hit and first.file_backed_bytes > 0

        def unread():
            pytest.fail("read the checkpoint although the cache holds the block")
            yield

        second = load_experts(E, K, H, I, unread(), source=source, key=P, mmap_experts_dir=cache_dir,
                              weight_format="int8")
        assert second.cache_hit
        assert all(torch.equal(a, b) for p, q in zip(first.packed_tensors(), second.packed_tensors())
                   for a, b in zip(p, q))


def test_make_ktmoe_refuses_a_non_utf8_directory_naming_it(tmp_path):
    from torch_ktmoe.checkpoint import make_ktmoe

    bad = os.fsdecode(os.fsencode(tmp_path) + b"/experts\xff")  # what os.listdir / argv give for such a name
    with pytest.raises(ValueError, match=r"mmap_experts_dir b'.*/experts\\xff' is not a valid UTF-8 path"):
        make_ktmoe(E, K, H, I, mmap_experts_dir=bad)
    with pytest.raises(ValueError, match="not a valid UTF-8 path"):
        make_ktmoe(E, K, H, I, mmap_experts_dir=os.fsencode(bad))
    assert not os.path.exists(bad)
    ok = make_ktmoe(E, K, H, I, mmap_experts_dir=os.fsencode(tmp_path / "caché"))  # UTF-8 bytes are a path
    assert ok.mmap_experts_dir == str(tmp_path / "caché") and os.path.isdir(ok.mmap_experts_dir)
    from torch_ktmoe.checkpoint import utf8_path

    assert utf8_path(tmp_path, "x") == str(tmp_path)
