"""The int4_affine format from an int4 checkpoint (ktmoe::pack_experts with exact): codes, scales and zero
points packed exactly (unpacked bit for bit to s * (q - z)), forwarded on every ISA within the bf16 bound of
the dequantized reference; the layer's exact path (load_expert with scales and zeros); its refusals.
(int4_affine quantized from dense weights is one more row of the format table: test_moe_forward_formats.)"""
import pytest
import torch

import torch_ktmoe
from torch_ktmoe import ops, reference
from torch_ktmoe.unpack import packed_header, unpack_experts
from tests.helpers import FORMAT_TOLERANCE, QUANTIZED_REFERENCE_TOLERANCE, random_routing

E, H, I = 5, 300, 136  # k tails of every group size; I = 136 is not a multiple of 16


def _checkpoint(n, k, group, *, zeros, scale_dtype, seed=0, experts=E):
    """One projection of an int4 checkpoint: codes [E, n, k] uint8, scales [E, n, ceil(k/g)] of
    scale_dtype (~1/(8 sqrt(k)): Gaussian-sized weights), zero points int32 in [0, 16] or None."""
    gen = torch.Generator().manual_seed(seed)
    groups = -(-k // group)
    codes = torch.randint(0, 16, (experts, n, k), generator=gen, dtype=torch.uint8)
    scale = ((torch.rand(experts, n, groups, generator=gen) + 0.5) / (8 * k ** 0.5)).to(scale_dtype)
    zero = torch.randint(0, 17, (experts, n, groups), generator=gen, dtype=torch.int32) if zeros else None
    return codes, scale, zero


def _exact_weights(codes, scale, zero, group):
    """s * (q - z) in float64 (exact), as fp32: what the checkpoint means."""
    k = codes.shape[-1]
    s = scale.double().repeat_interleave(group, -1)[..., :k]
    z = 8.0 if zero is None else zero.double().repeat_interleave(group, -1)[..., :k]
    return (s * (codes.double() - z)).float()


def _layer(group, zeros, scale_dtype, seed=0):
    gu = _checkpoint(2 * I, H, group, zeros=zeros, scale_dtype=scale_dtype, seed=seed)
    dn = _checkpoint(H, I, group, zeros=zeros, scale_dtype=scale_dtype, seed=seed + 1)
    return gu, dn


KINDS = [  # (group, zero points, scale dtype): compressed-tensors symmetric, GPTQ / AWQ asymmetric, others
    (32, False, torch.bfloat16), (128, True, torch.float16), (64, True, torch.float32), (128, False, torch.float16)]


@pytest.mark.parametrize("group, zeros, scale_dtype", KINDS)
def test_pack_is_exact_and_unpacks_to_s_times_q_minus_z(group, zeros, scale_dtype):
    (q13, s13, z13), (q2, s2, z2) = _layer(group, zeros, scale_dtype)
    w13, w2 = ops.pack_experts(q13, q2, "int4_affine", gate_up_scale=s13, down_scale=s2, gate_up_zero=z13,
                               down_zero=z2, group_size=group)
    h13, h2 = packed_header(w13), packed_header(w2)
    assert (h13["format"], h13["group"], h2["group"]) == ("int4_affine", group, group)
    assert w13.shape[1] == ops._C.packed_matrix_bytes("int4_affine", "gate_up", 2 * I, H, group)
    gate_up, down, fmt = unpack_experts([(w13, w2)])
    assert fmt == "int4_affine"
    assert torch.equal(gate_up, reference.dequantize_int4_affine(q13, s13, z13, group))
    assert torch.equal(down, reference.dequantize_int4_affine(q2, s2, z2, group))
    if scale_dtype != torch.float32:  # bf16 / fp16 scales (every checkpoint): s * (q - z) bit for bit
        assert torch.equal(gate_up, _exact_weights(q13, s13, z13, group))
        assert torch.equal(down, _exact_weights(q2, s2, z2, group))
    else:  # a 24-bit s: s * q and s * z round
        err = (gate_up - _exact_weights(q13, s13, z13, group)).abs().amax()
        assert err <= 2 ** -22 * 16 * s13.abs().amax()  # an ulp of s * 16 at most
    # separate gate / up codes pack the same bytes
    split = ops.pack_experts(q13[:, :I], q2, "int4_affine", gate_up_scale=s13[:, :I], down_scale=s2,
                             gate_up_zero=None if z13 is None else z13[:, :I], down_zero=z2, up=q13[:, I:],
                             up_scale=s13[:, I:], up_zero=None if z13 is None else z13[:, I:], group_size=group)
    assert torch.equal(split[0], w13) and torch.equal(split[1], w2)


def test_symmetric_is_zero_point_8():
    (q13, s13, _), (q2, s2, _) = _layer(32, False, torch.bfloat16)
    eights = [torch.full(s.shape, 8, dtype=torch.uint8) for s in (s13, s2)]
    a = ops.pack_experts(q13, q2, "int4_affine", gate_up_scale=s13, down_scale=s2, group_size=32)
    b = ops.pack_experts(q13, q2, "int4_affine", gate_up_scale=s13, down_scale=s2, gate_up_zero=eights[0],
                         down_zero=eights[1], group_size=32)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("group, zeros, scale_dtype", [KINDS[0], KINDS[1]])
def test_forward_matches_the_dequantized_reference(isa, group, zeros, scale_dtype):
    (q13, s13, z13), (q2, s2, z2) = _layer(group, zeros, scale_dtype, seed=7)
    w13, w2 = ops.pack_experts(q13, q2, "int4_affine", gate_up_scale=s13, down_scale=s2, gate_up_zero=z13,
                               down_zero=z2, group_size=group)
    gate_up, down = _exact_weights(q13, s13, z13, group), _exact_weights(q2, s2, z2, group)
    for T in (1, 3, 17, 64):
        x = torch.randn(T, H)
        ids, w = random_routing(T, E, 2, seed=T)
        out = ops.moe_forward(x, ids, w, w13, w2)
        ref_bf16 = reference.moe_reference(x, ids, w, gate_up, down, "bf16")
        assert reference.relative_error(out, ref_bf16) <= QUANTIZED_REFERENCE_TOLERANCE, T
        assert reference.relative_error(out, reference.moe_reference(x, ids, w, gate_up, down)) \
            <= FORMAT_TOLERANCE["bf16"], T


def test_dense_packing_is_the_reference_quantizer_with_zero_points():
    w = torch.randn(3, 40, 200) * torch.linspace(0.1, 3, 40)[:, None]
    w[0, 0] = w[0, 0].abs()  # a row of one sign: its zero point is 0 (GPTQ's range includes 0)
    w[1, 1] = 0  # an all-zero row: s = 0
    down = torch.randn(3, 200, 40)
    w13, w2 = ops.pack_experts(torch.cat([w, w], 1), down, "int4_affine", group_size=64)
    got_gu, got_dn, _ = unpack_experts([(w13, w2)])
    want = reference.quantize_int4_affine(w, 64)
    assert torch.equal(got_gu[:, :40], want) and torch.equal(got_gu[:, 40:], want)
    assert torch.equal(got_dn, reference.quantize_int4_affine(down, 64))
    assert torch.equal(want[1, 1], torch.zeros(200))
    # every weight within half a step s = (max(w, 0) - min(w, 0)) / 15 of its group (+6 %: s is rounded to bf16)
    g = torch.nn.functional.pad(w, (0, 56)).reshape(3, 40, 4, 64)
    step = (g.amax(-1).clamp(min=0) - g.amin(-1).clamp(max=0)) / 15
    err = (torch.nn.functional.pad(want - w, (0, 56)).reshape(3, 40, 4, 64).abs().amax(-1))
    assert (err <= step * 0.56).all()


def _one_expert():
    codes13 = torch.full((1, 64, 128), 3, dtype=torch.uint8)
    codes2 = torch.full((1, 128, 32), 3, dtype=torch.uint8)
    return codes13, codes2, torch.ones(1, 64, 1), torch.ones(1, 128, 1)


def _pack(q13, q2, s13, s2, gate_up_zero=None, down_zero=None, **kwargs):
    return ops.pack_experts(q13, q2, "int4_affine", gate_up_scale=s13, down_scale=s2, gate_up_zero=gate_up_zero,
                            down_zero=down_zero, **kwargs)


def test_refusals_name_the_problem():
    q13, q2, s13, s2 = _one_expert()
    with pytest.raises(RuntimeError, match=r"down_scale must be \[1, 128, 1\] \(one per row and k-group of "
                                           r"128 inputs\), got \[1, 128, 2\]"):
        _pack(q13, q2, s13, torch.ones(1, 128, 2))
    with pytest.raises(RuntimeError, match="gate_up must be uint8 .* got Int; dense float weights are packed by "
                                           "pack_experts"):
        _pack(q13.int(), q2, s13, s2)
    bad = q13.clone()
    bad[0, 40, 3] = 16
    with pytest.raises(RuntimeError, match="expert 0: row 40, column 3: code 16 is not a 4-bit code .* \\(gate_up\\)"):
        _pack(bad, q2, s13, s2)
    for z, what in ((17, "holds 17"), (-1, "holds -1")):
        with pytest.raises(RuntimeError, match=f"down_zero {what}: zero points must be in \\[0, 16\\] \\(GPTQ v1"):
            _pack(q13, q2, s13, s2, None, torch.full((1, 128, 1), z, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="gate_up_zero must be an integer tensor \\(zero points 0..16\\), got Float"):
        _pack(q13, q2, s13, s2, torch.ones(1, 64, 1), None)
    with pytest.raises(RuntimeError, match=r"gate_up_zero must be \[1, 64, 1\]"):
        _pack(q13, q2, s13, s2, torch.ones(1, 64, 2, dtype=torch.uint8), None)
    with pytest.raises(RuntimeError, match="down_scale must be float32, bfloat16 or float16, got Int"):
        _pack(q13, q2, s13, s2.int())
    inf_scale = s2.clone()
    inf_scale[0, 7, 0] = float("inf")
    with pytest.raises(RuntimeError, match="expert 0: row 7: scale of k-group 0 is not finite \\(down\\)"):
        _pack(q13, q2, s13, inf_scale)
    with pytest.raises(RuntimeError, match="group_size must be 0 \\(default\\) or a positive multiple of 32, got 48"):
        _pack(q13, q2, s13, s2, group_size=48)
    with pytest.raises(RuntimeError, match="up and up_scale come together"):
        _pack(q13[:, :32], q2, s13[:, :32], s2, up=q13[:, 32:])
    with pytest.raises(RuntimeError, match="up_zero without up"):
        _pack(q13, q2, s13, s2, up_zero=torch.ones(1, 64, 1, dtype=torch.uint8))


def test_opcheck_pack_experts_exact():
    q13, q2, s13, s2 = _one_expert()
    z13 = torch.full(s13.shape, 8, dtype=torch.uint8)
    exact = [s13, None, s2, z13, None, None]  # scales, then zero points (down's None: symmetric)
    torch.library.opcheck(torch.ops.ktmoe.pack_experts.default, (q13, None, q2, "int4_affine", 0, exact))
    w13, w2 = (torch.empty(s, dtype=torch.uint8) for s in ops._C.packed_sizes(q13, None, q2, "int4_affine", 0, exact))
    torch.library.opcheck(torch.ops.ktmoe.pack_experts_out.default, (q13, None, q2, "int4_affine", 0, exact, w13, w2))


@pytest.mark.parametrize("numa_parts", [1, 2])
def test_layer_loads_int4_checkpoints_exactly(numa_parts, tmp_path):
    inter, group = 256, 128  # two parts of 128: each starts a group
    gu = _checkpoint(2 * inter, H, group, zeros=True, scale_dtype=torch.float16, seed=3)
    dn = _checkpoint(H, inter, group, zeros=True, scale_dtype=torch.float16, seed=4)
    layer = torch_ktmoe.KTMoE(E, 2, H, inter, weight_format="int4_affine", numa_parts=numa_parts,
                              mmap_experts_dir=tmp_path)
    for e in range(E):  # streamed expert by expert, as checkpoint.load_experts does
        layer.load_expert(e, gu[0][e], dn[0][e], gate_up_scale=gu[1][e], down_scale=dn[1][e],
                          gate_up_zero=gu[2][e], down_zero=dn[2][e])
    want_gu, want_dn = _exact_weights(*gu, group), _exact_weights(*dn, group)
    got_gu, got_dn, fmt = unpack_experts(layer.packed_tensors())
    assert fmt == "int4_affine" and torch.equal(got_gu, want_gu) and torch.equal(got_dn, want_dn)
    x = torch.randn(5, H)
    ids, w = random_routing(5, E, 2)
    ref = reference.moe_reference(x, ids, w, want_gu, want_dn, "bf16")
    assert reference.relative_error(layer(x, ids, w), ref) <= QUANTIZED_REFERENCE_TOLERANCE
    again = torch_ktmoe.KTMoE(E, 2, H, inter, weight_format="int4_affine", numa_parts=numa_parts,
                              mmap_experts_dir=tmp_path)
    assert again.try_load_cached(layer.cache_fingerprint)  # the cache key holds the 11-character name


def test_layer_symmetric_checkpoint_and_refusals():
    (q13, s13, _), (q2, s2, _) = _layer(32, False, torch.bfloat16, seed=9)
    layer = torch_ktmoe.KTMoE(E, 2, H, I, weight_format="int4_affine", group_size=32, numa_parts=1)
    layer.load_weights(q13, q2, gate_up_scale=s13, down_scale=s2)
    got_gu, got_dn, _ = unpack_experts(layer.packed_tensors())
    assert torch.equal(got_gu, _exact_weights(q13, s13, None, 32))
    with pytest.raises(ValueError, match="come with a quantized checkpoint's exact codes and a weight_format that "
                                         "packs them .*'int4_affine': uint8 codes with gate_up_scale, down_scale, "
                                         "gate_up_zero, down_zero.*, not 'bf16'"):
        torch_ktmoe.KTMoE(E, 2, H, I).load_weights(q13, q2, gate_up_scale=s13, down_scale=s2)
    with pytest.raises(ValueError, match="down_zero does not come with weight_format='fp8', whose experts come with "
                                         "gate_up_scale, down_scale"):
        torch_ktmoe.KTMoE(E, 2, H, I, weight_format="fp8").load_weights(
            q13, q2, gate_up_scale=s13, down_scale=s2, down_zero=torch.zeros(E, H, 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"down_zero must have shape \(5, 300, 5\)"):
        torch_ktmoe.KTMoE(E, 2, H, I, weight_format="int4_affine", group_size=32, numa_parts=1).load_weights(
            q13, q2, gate_up_scale=s13, down_scale=s2, down_zero=torch.zeros(E, H, 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match="int4_affine experts come with both gate_up_scale and down_scale"):
        torch_ktmoe.KTMoE(E, 2, H, I, weight_format="int4_affine").load_weights(q13, q2, gate_up_scale=s13)
    one = torch_ktmoe.KTMoE(E, 2, H, I, weight_format="int4_affine", group_size=32, numa_parts=1)
    one.load_expert(0, q13[0], q2[0], gate_up_scale=s13[0], down_scale=s2[0])
    with pytest.raises(ValueError, match="expert 1 comes with .*down_zero.* the experts before it with"):
        one.load_expert(1, q13[1], q2[1], gate_up_scale=s13[1], down_scale=s2[1],
                        down_zero=torch.zeros(H, 5, dtype=torch.uint8))
