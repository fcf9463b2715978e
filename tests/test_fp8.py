"""The fp8 format from an FP8 checkpoint (ktmoe::pack_experts with exact): e4m3 bytes and block / per-row scales
packed exactly, forwarded on every ISA within the bf16 bound of the dequantized reference; its refusals.
(fp8 packed from dense weights is one more row of the format table: test_moe_forward_formats.)"""
import pytest
import torch

import torch_ktmoe
from torch_ktmoe import ops, reference
from torch_ktmoe.checkpoint import dequantize_fp8, group_scales
from torch_ktmoe.unpack import packed_header, unpack_experts
from tests.helpers import FORMAT_TOLERANCE, QUANTIZED_REFERENCE_TOLERANCE, random_routing
from tests.helpers.fp8 import dequantize_blocks, quantize_rows, random_fp8_experts

E, H, I = 6, 300, 160  # partial 128-blocks along both dimensions


def _group_form(experts, group):
    """gate / up / down as ops.pack_experts takes an FP8 checkpoint's: e4m3 and scales per (row, k-group)."""
    out = {}
    for name, (q, s) in experts.items():
        n, k = q.shape[1:]
        out[name] = (q, torch.stack([group_scales(s[e], n, k, group) for e in range(q.shape[0])]))
    return out


def _dequantized(experts):
    deq = {name: torch.stack([dequantize_blocks(q[e], s[e]) for e in range(q.shape[0])])
           for name, (q, s) in experts.items()}
    return torch.cat([deq["gate"], deq["up"]], 1), deq["down"]


@pytest.mark.parametrize("group", [128, 64, 32])
def test_pack_is_exact_and_unpacks_to_the_dequantized_weights(group):
    ck = random_fp8_experts(E, H, I)
    gf = _group_form(ck, group)
    w13, w2 = ops.pack_experts(gf["gate"][0], gf["down"][0], "fp8", gate_up_scale=gf["gate"][1],
                               down_scale=gf["down"][1], up=gf["up"][0], up_scale=gf["up"][1], group_size=group)
    h13, h2 = packed_header(w13), packed_header(w2)
    assert (h13["format"], h13["group"], h2["group"]) == ("fp8", group, group)
    assert w13.shape[1] == ops._C.packed_matrix_bytes("fp8", "gate_up", 2 * I, H, group)
    gate_up, down, fmt = unpack_experts([(w13, w2)])
    want_gu, want_dn = _dequantized(ck)
    assert fmt == "fp8" and torch.equal(gate_up, want_gu) and torch.equal(down, want_dn)
    # the fused HF layout packs the same bytes
    fused = ops.pack_experts(torch.cat([gf["gate"][0], gf["up"][0]], 1), gf["down"][0], "fp8",
                             gate_up_scale=torch.cat([gf["gate"][1], gf["up"][1]], 1), down_scale=gf["down"][1],
                             group_size=group)
    assert torch.equal(fused[0], w13) and torch.equal(fused[1], w2)


def test_forward_matches_the_dequantized_reference(isa):
    ck = random_fp8_experts(E, H, I, seed=3)
    gf = _group_form(ck, 128)
    w13, w2 = ops.pack_experts(gf["gate"][0], gf["down"][0], "fp8", gate_up_scale=gf["gate"][1],
                               down_scale=gf["down"][1], up=gf["up"][0], up_scale=gf["up"][1])
    gate_up, down = _dequantized(ck)
    for T in (1, 5, 40):
        x = torch.randn(T, H)
        ids, w = random_routing(T, E, 2, seed=T)
        out = ops.moe_forward(x, ids, w, w13, w2)
        ref_bf16 = reference.moe_reference(x, ids, w, gate_up, down, "bf16")
        assert reference.relative_error(out, ref_bf16) <= QUANTIZED_REFERENCE_TOLERANCE
        assert reference.relative_error(out, reference.moe_reference(x, ids, w, gate_up, down)) \
            <= FORMAT_TOLERANCE["bf16"]


def test_per_channel_scales_repeat_over_the_groups():
    q, s = quantize_rows(torch.randn(40, 300))
    scales = group_scales(s, 40, 300, 128, block=None)
    assert scales.shape == (40, 3) and torch.equal(scales, s.expand(40, 3))
    assert torch.equal(dequantize_fp8(q, scales, 128), q.float() * s)


def test_a_group_across_two_checkpoint_blocks_is_refused():
    with pytest.raises(ValueError, match="group_size 256 does not divide the checkpoint's 128-input scale blocks"):
        group_scales(torch.ones(1, 3), 16, 300, 256)


def _one_expert(dtype=torch.float8_e4m3fn):
    gate_up = torch.ones(1, 64, 128).to(dtype)
    down = torch.ones(1, 128, 32).to(dtype)
    return gate_up, down, torch.ones(1, 64, 1), torch.ones(1, 128, 1)


def test_refusals_name_the_problem():
    gate_up, down, s13, s2 = _one_expert()
    with pytest.raises(RuntimeError, match=r"down_scale must be \[1, 128, 1\] \(one per row and k-group of "
                                           r"128 inputs\), got \[1, 128, 2\]"):
        ops.pack_experts(gate_up, down, "fp8", gate_up_scale=s13, down_scale=torch.ones(1, 128, 2))
    with pytest.raises(RuntimeError, match="gate_up must be float8_e4m3fn .* got BFloat16; dense float weights are "
                                           "packed by pack_experts"):
        ops.pack_experts(gate_up.bfloat16(), down, "fp8", gate_up_scale=s13, down_scale=s2)
    with pytest.raises(RuntimeError, match="gate_up must be float32, bfloat16 or float16, got Float8_e4m3fn \\(a "
                                           "checkpoint's exact codes come with their companions in exact: 'fp8'\\)"):
        ops.pack_experts(gate_up, down.float(), "fp8")
    bad = gate_up.clone()
    bad.view(torch.uint8)[0, 40, 3] = 0x7F
    with pytest.raises(RuntimeError, match="expert 0: row 40, column 3 is an e4m3 NaN byte .* \\(gate_up\\)"):
        ops.pack_experts(bad, down, "fp8", gate_up_scale=s13, down_scale=s2)
    inf_scale = s2.clone()
    inf_scale[0, 7, 0] = float("inf")
    with pytest.raises(RuntimeError, match="expert 0: row 7: scale of k-group 0 is not finite \\(down\\)"):
        ops.pack_experts(gate_up, down, "fp8", gate_up_scale=s13, down_scale=inf_scale)


def test_exact_argument_refusals():
    """The op's ``exact`` list is checked against the format's row: its length and order, the inputs a format
    needs, up_<x> only with up, and none at all for a format that packs dense weights only."""
    gate_up, down, s13, s2 = _one_expert()
    pack = torch.ops.ktmoe.pack_experts
    with pytest.raises(RuntimeError, match=r"weight_format 'fp8' takes exact = \[gate_up_scale, up_scale, "
                                           r"down_scale\] \(3 tensors, None where absent\), got 2"):
        pack(gate_up, None, down, "fp8", 0, [s13, s2])
    with pytest.raises(RuntimeError, match=r"weight_format 'fp8' needs down_scale \(None given\)"):
        pack(gate_up, None, down, "fp8", 0, [s13, None, None])
    with pytest.raises(RuntimeError, match="up_scale without up"):
        pack(gate_up, None, down, "fp8", 0, [s13, s13, s2])
    with pytest.raises(RuntimeError, match="up and up_scale come together"):
        pack(gate_up[:, :32], gate_up[:, 32:], down, "fp8", 0, [s13[:, :32], None, s2])
    with pytest.raises(RuntimeError, match="gate_scale must be float32, got Double"):
        pack(gate_up[:, :32], gate_up[:, 32:], down, "fp8", 0, [s13[:, :32].double(), s13[:, 32:], s2])
    with pytest.raises(RuntimeError, match="weight_format 'int8' packs dense weights only, so exact must be empty "
                                           "\\(got 3 tensors\\); a checkpoint's exact codes are packed by 'fp8', "
                                           "'int4_affine' or 'mxfp4'"):
        pack(gate_up.float(), None, down.float(), "int8", 0, [s13, None, s2])
    with pytest.raises(ValueError, match="weight_format 'int8' packs dense weights only"):
        ops.pack_experts(gate_up.float(), down.float(), "int8", gate_up_scale=s13, down_scale=s2)
    with pytest.raises(ValueError, match="'fp8' takes the companions .* got \\['down_scale', 'down_zero', "
                                         "'gate_up_scale'\\]"):
        ops.pack_experts(gate_up, down, "fp8", gate_up_scale=s13, down_scale=s2, down_zero=s2)
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['grup_size'\\]"):
        ops.pack_experts(gate_up, down, "fp8", grup_size=32)
    with pytest.raises(RuntimeError, match="down_scale must be float32, got Int"):  # before an arena is touched
        ops._C.packed_sizes(gate_up, None, down, "fp8", 0, [s13, None, s2.int()])
    with pytest.raises(RuntimeError, match=r"weight_format 'fp8' needs down_scale \(None given\)"):
        ops.pack_experts(gate_up, down, "fp8", gate_up_scale=s13)


def test_exact_companions_on_meta():
    """The fake kernel (also the Meta kernel) names a companion on another device and traces all-meta inputs."""
    gate_up, down, s13, s2 = _one_expert()
    with pytest.raises(RuntimeError, match="pack_experts: down_scale is on meta but gate_up is on cpu"):
        ops.pack_experts(gate_up, down, "fp8", gate_up_scale=s13, down_scale=s2.to("meta"))
    meta = [t.to("meta") for t in (gate_up, down, s13, s2)]
    w13, w2 = ops.pack_experts(meta[0], meta[1], "fp8", gate_up_scale=meta[2], down_scale=meta[3])
    want = ops.pack_experts(gate_up, down, "fp8", gate_up_scale=s13, down_scale=s2)
    assert w13.device.type == "meta" and w13.shape == want[0].shape and w2.shape == want[1].shape


def test_opcheck_pack_experts_exact():
    """opcheck's schema test multiplies its inputs, which torch cannot do in float8: the others run."""
    gate_up, down, s13, s2 = _one_expert()
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.ktmoe.pack_experts.default, (gate_up, None, down, "fp8", 0, [s13, None, s2]),
                          test_utils=utils)
    w13, w2 = (torch.empty(s, dtype=torch.uint8) for s in ops._C.packed_sizes(gate_up, None, down, "fp8", 0,
                                                                               [s13, None, s2]))
    torch.library.opcheck(torch.ops.ktmoe.pack_experts_out.default,
                          (gate_up, None, down, "fp8", 0, [s13, None, s2], w13, w2), test_utils=utils)
    torch.ops.ktmoe.pack_experts_out(gate_up, None, down, "fp8", 0, [s13, None, s2], w13, w2)  # on copies above
    want = ops.pack_experts(gate_up, down, "fp8", gate_up_scale=s13, down_scale=s2)
    assert torch.equal(w13, want[0]) and torch.equal(w2, want[1])


def _layer_inputs(seed=0, inter=I):
    ck = random_fp8_experts(E, H, inter, seed=seed)
    gf = _group_form(ck, 128)
    gate_up = torch.cat([gf["gate"][0], gf["up"][0]], 1)
    gate_up_scale = torch.cat([gf["gate"][1], gf["up"][1]], 1)
    return ck, gate_up, gf["down"][0], gate_up_scale, gf["down"][1]


@pytest.mark.parametrize("numa_parts", [1, 2])
def test_layer_loads_fp8_experts_exactly(numa_parts, tmp_path):
    inter = 256  # two parts of 128: each starts a group
    ck, gate_up, down, s13, s2 = _layer_inputs(inter=inter)
    layer = torch_ktmoe.KTMoE(E, 2, H, inter, weight_format="fp8", numa_parts=numa_parts,
                              mmap_experts_dir=tmp_path)
    for e in range(E):  # streamed expert by expert, as checkpoint.load_experts does
        layer.load_expert(e, gate_up[e], down[e], gate_up_scale=s13[e], down_scale=s2[e])
    want_gu, want_dn = _dequantized(ck)
    got_gu, got_dn, fmt = unpack_experts(layer.packed_tensors())
    assert fmt == "fp8" and torch.equal(got_gu, want_gu) and torch.equal(got_dn, want_dn)
    x = torch.randn(5, H)
    ids, w = random_routing(5, E, 2)
    ref = reference.moe_reference(x, ids, w, want_gu, want_dn, "bf16")
    assert reference.relative_error(layer(x, ids, w), ref) <= QUANTIZED_REFERENCE_TOLERANCE
    again = torch_ktmoe.KTMoE(E, 2, H, inter, weight_format="fp8", numa_parts=numa_parts, mmap_experts_dir=tmp_path)
    assert again.try_load_cached(layer.cache_fingerprint)  # the cache key holds format and group: files just work


def test_layer_refusals():
    _, gate_up, down, s13, s2 = _layer_inputs()
    with pytest.raises(ValueError, match="NUMA part bounds \\[0, 80, 160\\] split a group of 128 inputs"):
        torch_ktmoe.KTMoE(E, 2, H, I, weight_format="fp8", numa_parts=2).load_weights(
            gate_up, down, gate_up_scale=s13, down_scale=s2)
    with pytest.raises(ValueError, match="gate_up_scale, down_scale come with a quantized checkpoint's exact codes "
                                         "and a weight_format that packs them \\('fp8': float8_e4m3fn codes with "
                                         "gate_up_scale, down_scale; .*, not 'bf16'"):
        torch_ktmoe.KTMoE(E, 2, H, I).load_weights(gate_up, down, gate_up_scale=s13, down_scale=s2)
    with pytest.raises(ValueError, match=r"down_scale must have shape \(6, 300, 2\)"):
        torch_ktmoe.KTMoE(E, 2, H, I, weight_format="fp8", numa_parts=1).load_weights(
            gate_up, down, gate_up_scale=s13, down_scale=s2[..., :1])
