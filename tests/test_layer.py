"""KTMoE nn.Module: loading paths, shapes, storage modes, NUMA parts, torch.compile, errors."""
import pytest
import torch

import torch_ktmoe
from torch_ktmoe import KTMoE, reference
from torch_ktmoe.ops import WEIGHT_FORMATS
from tests.helpers import QUANTIZED_REFERENCE_TOLERANCE, random_experts, random_routing

E, K, H, I = 8, 2, 64, 48


def make_layer(fmt="bf16", **kwargs):
    layer = KTMoE(E, K, H, I, weight_format=fmt, **kwargs)
    gate_up, down = random_experts(E, H, I)
    layer.load_weights(gate_up, down)
    return layer, gate_up, down


@pytest.mark.parametrize("fmt", WEIGHT_FORMATS)
def test_forward_matches_reference(fmt):
    layer, gate_up, down = make_layer(fmt)
    x = torch.randn(11, H)
    ids, w = random_routing(11, E, K, masked=0.1)
    ref = reference.moe_reference(x, ids, w, reference.quantize_weights(gate_up, fmt),
                                  reference.quantize_weights(down, fmt), reference.format_activations(fmt))
    assert reference.relative_error(layer(x, ids, w), ref) <= QUANTIZED_REFERENCE_TOLERANCE


def test_three_loading_paths_pack_the_same_bytes():
    gate_up, down = random_experts(E, H, I, dtype=torch.bfloat16)
    a = KTMoE(E, K, H, I)
    a.load_weights(gate_up, down)
    b = KTMoE(E, K, H, I)
    b.load_weights_separate(gate_up[:, :I], gate_up[:, I:], down)
    c = KTMoE(E, K, H, I)
    for e in reversed(range(E)):
        assert not c.loaded
        c.load_expert(e, gate_up[e], down[e])
    for other in (b, c):
        for (w13a, w2a), (w13o, w2o) in zip(a.packed_tensors(), other.packed_tensors()):
            assert torch.equal(w13a, w13o) and torch.equal(w2a, w2o)


def test_batched_input_shape_and_dtype():
    layer, _, _ = make_layer()
    x = torch.randn(2, 5, H, dtype=torch.bfloat16)
    ids, w = random_routing(10, E, K)
    out = layer(x, ids, w)
    assert out.shape == (2, 5, H) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.reshape(10, H), layer(x.reshape(10, H), ids, w), rtol=0, atol=0)


def test_no_dense_copy_stays_inside_the_module():
    layer, _, _ = make_layer()
    tensors = list(layer.parameters()) + list(layer.buffers())
    assert all(t.dtype == torch.uint8 for t in tensors)
    assert sum(t.numel() for t in tensors) == layer.packed_bytes
    assert not layer._pending
    assert layer.state_dict() == {}  # packed weights are not checkpoint state


@pytest.mark.parametrize("fmt", ["bf16", "int4"])
def test_file_backed_is_bit_identical_to_anonymous(tmp_path, fmt):
    anon, _, _ = make_layer(fmt)
    filed, _, _ = make_layer(fmt, mmap_experts_dir=tmp_path, layer_idx=3)
    assert filed.file_backed_bytes == filed.packed_bytes > 0
    assert anon.file_backed_bytes == 0
    stats = filed.arena_stats()
    assert stats[0]["name"] == "layer0003.part0" and stats[0]["file_mode"] and stats[0]["fallbacks"] == 0
    x = torch.randn(9, H)
    ids, w = random_routing(9, E, K)
    assert torch.equal(anon(x, ids, w), filed(x, ids, w))
    assert "file-backed in" in repr(filed) and "storage=anonymous" in repr(anon)
    assert "format=" + fmt in repr(filed)


def test_unusable_directory_falls_back_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="No such file or directory"):
        layer, _, _ = make_layer(mmap_experts_dir=tmp_path / "missing")
    assert layer.file_backed_bytes == 0 and layer.arena_stats()[0]["fallbacks"] == 2
    assert "anonymous fallback" in repr(layer)


def test_two_numa_parts_match_one_part():
    one, gate_up, down = make_layer("bf16", numa_parts=1)
    two = KTMoE(E, K, H, I, numa_parts=2)
    two.load_weights(gate_up, down)
    assert two.numa_parts == 2 and len(two.arena_stats()) == 2
    x = torch.randn(13, H)
    ids, w = random_routing(13, E, K)
    torch.testing.assert_close(two(x, ids, w), one(x, ids, w), rtol=1e-5, atol=1e-5)


def test_compile_several_layers_once():
    layers = [make_layer("int8", layer_idx=i)[0] for i in range(3)]
    for i, layer in enumerate(layers):  # distinct weights per layer
        gate_up, down = random_experts(E, H, I, seed=10 + i)
        layer.load_weights(gate_up, down)

    def step(x, ids, w):
        for layer in layers:
            x = x + layer(x, ids, w)
        return x

    torch._dynamo.reset()
    counts = {"compiles": 0}

    def backend(gm, example_inputs):
        counts["compiles"] += 1
        return gm.forward

    compiled = torch.compile(step, backend=backend, fullgraph=True)
    x = torch.randn(4, H)
    ids, w = random_routing(4, E, K)
    torch.testing.assert_close(compiled(x, ids, w), step(x, ids, w), rtol=0, atol=0)
    compiled(torch.randn(4, H), ids, w)
    assert counts["compiles"] == 1


def test_errors():
    with pytest.raises(ValueError, match="weight_format must be one of"):
        KTMoE(E, K, H, I, weight_format="fp4")
    layer = KTMoE(E, K, H, I)
    with pytest.raises(RuntimeError, match="call load_weights"):
        layer(torch.randn(2, H), *random_routing(2, E, K))
    gate_up, down = random_experts(E, H, I)
    with pytest.raises(ValueError, match=r"gate_up_proj must have shape \(8, 96, 64\)"):
        layer.load_weights(gate_up[:, :10], down)
    with pytest.raises(ValueError, match=r"down must have shape"):
        layer.load_weights(gate_up, down[:4])
    with pytest.raises(IndexError, match="expert 8 out of range"):
        layer.load_expert(8, gate_up[0], down[0])
    with pytest.raises(ValueError, match="numa_parts must be in"):
        KTMoE(E, K, H, I, numa_parts=0)


@pytest.mark.parametrize("fmt, first, later", [
    ("bf16", torch.bfloat16, torch.int8),  # int8 codes among bf16 experts
    ("fp8", torch.float8_e4m3fn, torch.float32),  # fp32 among e4m3 experts with scales
])
def test_load_expert_refuses_a_dtype_other_than_the_layers(fmt, first, later):
    """A later expert of another dtype is refused by name, never cast to expert 0's and packed."""
    layer = KTMoE(E, K, H, I, weight_format=fmt)
    scales = {"gate_up_scale": torch.ones(2 * I, 1), "down_scale": torch.ones(H, 1)} if fmt == "fp8" else {}
    gate_up, down = random_experts(E, H, I)
    layer.load_expert(0, gate_up[0].to(first), down[0].to(first), **scales)
    with pytest.raises(ValueError, match=rf"expert 1's gate_up is {later}, the experts before it {first}"):
        layer.load_expert(1, gate_up[1].to(later), down[1].to(later), **scales)


def test_deepcopy_shares_the_arenas_until_the_copy_reloads(tmp_path):
    import copy

    layer, _, _ = make_layer(mmap_experts_dir=tmp_path, numa_parts=2)
    x = torch.randn(3, H)
    ids, w = random_routing(3, E, K)
    before, arenas = layer(x, ids, w), list(layer.arenas)
    twin = copy.deepcopy(layer)
    assert list(twin.arenas) == arenas and twin.arenas is not layer.arenas  # shared arenas, own sequence
    twin.load_weights(*random_experts(E, H, I, seed=1))  # the copy's reload replaces its own arenas only
    assert list(layer.arenas) == arenas and not set(map(id, twin.arenas)) & set(map(id, arenas))
    assert torch.equal(layer(x, ids, w), before)
