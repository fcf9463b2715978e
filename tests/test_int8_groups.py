"""int8 per group (group_size 32 / 64: a fp32 scale per (row, group), like q8_0, and the
activations quantized per the same groups) next to per channel: packing equals the reference
oracle bit for bit, the forward on every ISA equals the reference layer, per-channel blobs keep
their layout, and the cache key tells the two apart. (Every ISA's gemm_int8 giving generic's bits is tests/native: test_int8_isas_agree.)"""
import pytest
import torch

from torch_ktmoe import KTMoE, ops, reference
from torch_ktmoe.unpack import packed_header, unpack_experts
from tests.helpers import random_experts, random_routing
from tests.helpers.cache_layer import loaded, reason, run


def _t3(shape, seed):
    """Student-t(3) weights / sqrt(fan_in): heavy tails, an outlier per row or so."""
    g = torch.Generator().manual_seed(seed)
    chi2 = torch.randn((3, *shape), generator=g).pow(2).sum(0)
    return torch.randn(shape, generator=g) / (chi2 / 3).sqrt() / shape[-1] ** 0.5


@pytest.mark.parametrize("group", [32, 64])
@pytest.mark.parametrize("H, I", [(128, 96), (100, 72)])
def test_packing_is_the_reference_rounding_bit_for_bit(group, H, I):
    gate_up, down = random_experts(3, H, I)
    w13, w2 = ops.pack_experts(gate_up, down, "int8", group_size=group)
    for w, k in ((w13, H), (w2, I)):
        h = packed_header(w)
        assert (h["format"], h["group"], h["kp"]) == ("int8", group, -(-k // group) * group)
        assert h["total_bytes"] - h["scale_offset"] >= h["np"] * (h["kp"] // group) * 4
    got_gu, got_dn, _ = unpack_experts([(w13, w2)])
    assert torch.equal(got_gu.float(), reference.quantize_weights(gate_up, "int8", group))
    assert torch.equal(got_dn.float(), reference.quantize_weights(down, "int8", group))


def test_group_32_is_the_default_from_dense_weights():
    gate_up, down = random_experts(2, 64, 96)
    assert [packed_header(w)["group"] for w in ops.pack_experts(gate_up, down, "int8")] == [32, 32]
    layer = KTMoE(2, 1, 64, 96, weight_format="int8", numa_parts=1)
    layer.load_weights(gate_up, down)
    assert layer.group_size == 32 and packed_header(layer.w2_0)["group"] == 32
    assert ops.FORMAT_TRAITS["int8"]["default_group"] == ops.default_group_size("int8") == 32


def test_group_size_0_is_per_channel_with_the_row_scale_layout():
    gate_up, down = random_experts(2, 64, 96)
    _, w2 = ops.pack_experts(gate_up, down, "int8", group_size=0)
    h = packed_header(w2)
    assert (h["group"], h["kp"]) == (96, 96)  # one group: kp
    # scales: float s[np] right at scale_offset, s[n] = max|w[n]| / 127 (the layout of every older file)
    s = w2[:, h["scale_offset"]:h["scale_offset"] + 4 * h["np"]].contiguous().view(torch.float32)
    assert torch.equal(s[:, :64], down.abs().amax(-1) / 127)
    assert torch.equal(unpack_experts([(_, w2)])[1].float(), reference.quantize_weights(down, "int8", 0))


@pytest.mark.parametrize("group", [0, 32, 64])
def test_forward_equals_the_reference_on_every_isa(isa, group):
    E, H, I, T = 4, 160, 96, 9
    gate_up, down = _t3((E, 2 * I, H), 1), _t3((E, H, I), 2)
    x = torch.randn(T, H)
    ids, w = random_routing(T, E, 2, seed=3)
    m = KTMoE(E, 2, H, I, weight_format="int8", group_size=group)
    m.load_weights(gate_up, down)
    out = m(x, ids, w)
    ref = reference.moe_reference(x, ids, w, reference.quantize_weights(gate_up, "int8", group),
                                  reference.quantize_weights(down, "int8", group),
                                  reference.format_activations("int8", group))
    assert reference.relative_error(out, ref) < 1e-4


def test_the_format_table_says_int8_activations_follow_the_weight_groups():
    traits = ops.FORMAT_TRAITS
    assert (traits["int8"]["activations"], traits["int8"]["activation_scale"]) == ("int8", "weight_group")
    assert (traits["int4"]["activations"], traits["int4"]["activation_scale"]) == ("int8", "row")
    assert all(r["activation_scale"] == "none" for r in traits.values() if r["activations"] == "bf16")


@pytest.mark.parametrize("group", [32, 64])
def test_activations_get_a_scale_per_group(isa, group):
    """A token with one huge input: per group only that input's group loses precision, so the
    forward meets the per-group reference of its activations and not the per-row one."""
    E, H, I, T = 2, 256, 128, 6
    gate_up, down = random_experts(E, H, I)
    x = torch.randn(T, H)
    x[:, 5] = 300.0  # one outlier per token: a per-row scale would flatten every other input
    ids, w = random_routing(T, E, 2, seed=4)
    m = KTMoE(E, 2, H, I, weight_format="int8", group_size=group)
    m.load_weights(gate_up, down)
    out = m(x, ids, w)
    wq = reference.quantize_weights(gate_up, "int8", group), reference.quantize_weights(down, "int8", group)
    per_group = reference.moe_reference(x, ids, w, *wq, reference.format_activations("int8", group))
    per_row = reference.moe_reference(x, ids, w, *wq, "int8")
    assert reference.relative_error(out, per_group) < 1e-4
    assert reference.relative_error(out, per_row) > 1e-2


def test_a_non_finite_input_still_gives_a_non_finite_token(isa):
    """A NaN in one group of one token: that token's output is non-finite, the others are not."""
    E, H, I = 2, 128, 64
    gate_up, down = random_experts(E, H, I)
    x = torch.randn(3, H)
    x[1, 70] = float("nan")
    ids, w = random_routing(3, E, 2, seed=5)
    m = KTMoE(E, 2, H, I, weight_format="int8", group_size=32)
    m.load_weights(gate_up, down)
    finite = m(x, ids, w).isfinite().all(-1)
    assert finite.tolist() == [True, False, True]


def test_groups_cut_the_heavy_tailed_error():
    """On Student-t(3) weights a group of 32 has a smaller layer error than one scale per row."""
    E, H, I, T = 4, 256, 128, 32
    gate_up, down = _t3((E, 2 * I, H), 7), _t3((E, H, I), 8)
    x = torch.randn(T, H)
    ids, w = random_routing(T, E, 2, seed=9)
    ref = reference.moe_reference(x, ids, w, gate_up, down)
    err = {}
    for group in (0, 32):
        m = KTMoE(E, 2, H, I, weight_format="int8", group_size=group)
        m.load_weights(gate_up, down)
        err[group] = reference.relative_error(m(x, ids, w), ref)
    assert err[32] < 0.75 * err[0], err


def test_a_per_channel_cache_file_is_rebuilt_for_the_default_group(tmp_path):
    """A file packed per channel (int8's only layout before groups, keyed group 0) is stale for a layer
    of the default group 32: rebuilt, never mapped as if it were grouped."""
    assert not loaded(tmp_path, group_size=0).cache_hit
    default = loaded(tmp_path)
    assert not default.cache_hit and reason(default) == "stale: group size is 0, expected 32"
    assert torch.equal(run(default), run(loaded(None, group_size=32)))


@pytest.mark.parametrize("first, second", [(0, 32), (32, 0), (32, 64)])
def test_the_cache_tells_group_sizes_apart(tmp_path, first, second):
    built = loaded(tmp_path, group_size=first)
    assert not built.cache_hit
    again = loaded(tmp_path, group_size=first)
    assert again.cache_hit and torch.equal(run(again), run(built))
    other = loaded(tmp_path, group_size=second)
    assert not other.cache_hit and reason(other).startswith("stale: group size")
    assert torch.equal(run(other), run(loaded(None, group_size=second)))


def test_a_group_not_a_multiple_of_32_is_refused():
    gate_up, down = random_experts(2, 64, 96)
    with pytest.raises(RuntimeError, match="group_size must be 0 .default. or a positive multiple of 32, got 48"):
        ops.pack_experts(gate_up, down, "int8", group_size=48)
