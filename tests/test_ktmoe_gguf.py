"""KTMoE(weight_format="gguf"): a GGUF file's experts where they lie, as a module: its forward is the op's over
the same blocks, in any input shape, with biases and activations; it maps the file without a copy; copies share
the blocks; bad input is named."""
import copy
import pickle

import pytest
import torch

from gguf import GGMLQuantizationType as Q

from tests.helpers import random_routing
from tests.helpers.gguf_files import write_moe_gguf
from ktmoe_harness.ggml_rows import ggml_experts
from torch_ktmoe import KTMoE, ops
from torch_ktmoe.checkpoint.gguf import expert_layers, layer_experts, open_gguf
from torch_ktmoe.gguf_experts import GGUFExperts

TYPES = (Q.Q4_K, Q.Q4_K, Q.Q6_K)


def gguf_layer(types=TYPES, e=4, h=256, i=256, **kwargs):
    gate, up, down = ggml_experts(types, e, h, i)
    layer = KTMoE(e, 2, h, i, weight_format="gguf", **kwargs)
    layer.load_gguf(GGUFExperts.of(gate, up, down, types))
    return layer, (gate, up, down)


@pytest.mark.parametrize("types", [TYPES, (Q.Q8_0, Q.Q5_K, Q.IQ4_XS)])
def test_forward_is_the_op_over_the_blocks(types):
    layer, (gate, up, down) = gguf_layer(types)
    x = torch.randn(2, 3, 256, dtype=torch.bfloat16)
    ids, w = random_routing(6, 4, 2)
    out = layer(x, ids.view(2, 3, 2), w.view(2, 3, 2))
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.equal(out.view(6, 256), ops.moe_forward_ggml(x.view(6, 256), ids, w, gate, up, down, types))
    assert layer.loaded and layer.packed_bytes == gate.numel() + up.numel() + down.numel()
    assert "GGUF q4_K/q4_K/q6_K in place" in repr(layer) or types != TYPES


def test_biases_and_activation_reach_the_op():
    layer, (gate, up, down) = gguf_layer(activation="swiglu_oai")
    b13, b2 = torch.randn(4, 512) * 0.1, torch.randn(4, 256) * 0.1
    layer.set_biases(b13, b2)
    x = torch.randn(5, 256)
    ids, w = random_routing(5, 4, 2)
    params = ops.activation_params("swiglu_oai")
    want = ops.moe_forward_ggml(x, ids, w, gate, up, down, TYPES, w13_bias=b13, w2_bias=b2, activation="swiglu_oai",
                                activation_params=params)
    assert torch.equal(layer(x, ids, w), want)


def file_layer(tmp_path, experts: int):
    """(the file's path, its expert layer, its GGUFExperts, a KTMoE loaded from them): a one-layer GGUF in tmp_path."""
    path = write_moe_gguf(tmp_path / "m.gguf", layers=1, experts=experts, hidden=256, inter=256, sane=True)
    model = open_gguf(path)
    (found,) = expert_layers(model)
    gguf = layer_experts(model, found)
    layer = KTMoE(experts, 2, 256, 256, weight_format="gguf")
    layer.load_gguf(gguf)
    return path, found, gguf, layer


def test_a_gguf_file_is_used_where_it_lies(tmp_path):
    path, found, experts, layer = file_layer(tmp_path, 4)
    assert layer.file_backed_bytes == found.nbytes == layer.packed_bytes
    ptr = layer.gguf.gate.data_ptr()
    with open("/proc/self/maps") as maps:  # the blocks are the file's mapping, not a copy
        (line,) = [m for m in maps if int(m.split("-")[0], 16) <= ptr < int(m.split()[0].split("-")[1], 16)]
    assert line.rstrip().endswith(str(path))
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    ids, w = random_routing(3, 4, 2)
    assert torch.isfinite(layer(x, ids, w)).all()


def test_copies_share_the_blocks_and_pickling_says_why_not():
    layer, _ = gguf_layer()
    twin = copy.deepcopy(layer)
    assert twin.gguf is layer.gguf
    with pytest.raises(TypeError, match="GGUF file's blocks where they lie"):
        pickle.dumps(layer)


def test_bad_input_is_named():
    gate, up, down = ggml_experts(TYPES, 4, 256, 256)
    with pytest.raises(ValueError, match="load_gguf needs weight_format='gguf'"):
        KTMoE(4, 2, 256, 256).load_gguf(GGUFExperts.of(gate, up, down, TYPES))
    layer = KTMoE(4, 2, 256, 256, weight_format="gguf")
    with pytest.raises(TypeError, match="takes a GGUFExperts"):
        layer.load_gguf((gate, up, down))
    with pytest.raises(ValueError, match=r"\(E, H, I\) = \(4, 256, 256\), the layer \(4, 256, 512\)"):
        KTMoE(4, 2, 256, 512, weight_format="gguf").load_gguf(GGUFExperts.of(gate, up, down, TYPES))
    with pytest.raises(ValueError, match="tq1_0, which torch_ktmoe does not read"):
        GGUFExperts.of(gate, up, down, (Q.TQ1_0, Q.Q4_K, Q.Q6_K))
    with pytest.raises(ValueError, match="not whole q6_K blocks"):
        GGUFExperts.of(gate, up, down[..., :-1], TYPES)
    with pytest.raises(ValueError, match="down holds"):
        GGUFExperts.of(gate, up, down[:, :128], TYPES)
    with pytest.raises(ValueError, match="uint8 tensor"):
        GGUFExperts.of(gate.float(), up, down, TYPES)
    with pytest.raises(ValueError, match="dense weights need a packed format"):
        layer.load_weights(torch.zeros(4, 512, 256), torch.zeros(4, 256, 256))
    with pytest.raises(ValueError, match="one part"):
        KTMoE(4, 2, 256, 256, weight_format="gguf", numa_parts=2)
    with pytest.raises(RuntimeError, match="load_weights"):
        layer(torch.zeros(1, 256), torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2))


def test_prefetch_reads_the_routed_experts_ahead_with_the_same_outputs(tmp_path):
    """prefetch=True: MADV_WILLNEED over the routed experts' rows of the file first (here after its pages were
    dropped); "auto": only while the model's mapped experts did not fit in memory at load."""
    import dataclasses
    import os

    path = write_moe_gguf(tmp_path / "m.gguf", layers=1, experts=8, hidden=256, inter=256, sane=True)
    model = open_gguf(path)
    (found,) = expert_layers(model)
    experts = layer_experts(model, found)
    assert experts.fits  # a few MiB
    x = torch.randn(2, 256, dtype=torch.bfloat16)
    ids, w = random_routing(2, 8, 2)
    plain = KTMoE(8, 2, 256, 256, weight_format="gguf", prefetch=False)
    plain.load_gguf(experts)
    want = plain(x, ids, w)
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    eager = KTMoE(8, 2, 256, 256, weight_format="gguf", prefetch=True)
    eager.load_gguf(experts)
    assert eager.prefetching and torch.equal(eager(x, ids, w), want)
    auto = KTMoE(8, 2, 256, 256, weight_format="gguf")
    auto.load_gguf(experts)
    assert not auto.prefetching
    auto.load_gguf(dataclasses.replace(experts, fits=False))
    assert auto.prefetching and torch.equal(auto(x, ids, w), want)
    anonymous = KTMoE(8, 2, 256, 256, weight_format="gguf")
    anonymous.load_gguf(GGUFExperts.of(*(t.clone() for t in (experts.gate, experts.up, experts.down)),
                                       experts.ggml_types, fits=False))
    assert not anonymous.prefetching  # nothing to read: anonymous memory


def test_next_layer_prefetch_advises_a_gguf_layers_predicted_experts(tmp_path, monkeypatch):
    """next_layer_prefetch="auto" resolves for a GGUF layer as prefetch does (mapped experts that did not fit); the
    previous layer's predictor then asks MADV_WILLNEED over the predicted experts' gate, up and down rows (pages
    read from the file, nothing copied), counts its recall, and changes no output."""
    import dataclasses
    import os

    from torch_ktmoe import gguf_experts
    from torch_ktmoe.residency.predictor import NextLayerPredictor

    path, _, experts, layer = file_layer(tmp_path, 8)
    assert not layer.next_layer_prefetching  # fits
    layer.load_gguf(dataclasses.replace(experts, fits=False))
    assert layer.next_layer_prefetching
    off = KTMoE(8, 2, 256, 256, weight_format="gguf", next_layer_prefetch=False)
    off.load_gguf(dataclasses.replace(experts, fits=False))
    assert not off.next_layer_prefetching
    anonymous = KTMoE(8, 2, 256, 256, weight_format="gguf")
    anonymous.load_gguf(GGUFExperts.of(*(t.clone() for t in (experts.gate, experts.up, experts.down)),
                                       experts.ggml_types, fits=False))
    assert not anonymous.next_layer_prefetching

    advised = []
    real = gguf_experts._willneed
    monkeypatch.setattr(gguf_experts, "_willneed", lambda a, n: (advised.append((a, n)), real(a, n)))
    router = torch.nn.Linear(256, 8, bias=False)
    x = torch.randn(1, 256)
    predicted = torch.topk(router(x), 2).indices.flatten().sort().values.tolist()
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    NextLayerPredictor(router, layer)(x)
    g = layer.gguf
    want = sorted((t.data_ptr() + e * t.stride(0), t.stride(0)) for t in (g.gate, g.up, g.down) for e in predicted)
    assert sorted(advised) == want
    ids = torch.tensor([predicted])
    w = torch.full((1, 2), 0.5)
    plain = KTMoE(8, 2, 256, 256, weight_format="gguf", prefetch=False)
    plain.load_gguf(experts)
    assert torch.equal(layer(x, ids, w), plain(x, ids, w))
    assert layer.residency_stats()["recall"] == 1.0
