"""The mxfp4 format: an MXFP4 checkpoint's e2m1 codes and E8M0 scales packed exactly (ktmoe::pack_experts with exact),
dense weights rounded as OCP MX does (the reference's quantize_mxfp4), unpacked back to the dequantized values,
forwarded on every ISA within the bf16 bound of the dequantized reference (exact weights: only the activations'
rounding and the summation order are left); its refusals. (The row's table-driven checks: test_moe_forward_formats.)"""
import pytest
import torch

import torch_ktmoe
from torch_ktmoe import ops, reference, unpack
from torch_ktmoe.checkpoint.mxfp4 import dequantize_mxfp4, split_nibbles
from tests.helpers import FORMAT_TOLERANCE, QUANTIZED_REFERENCE_TOLERANCE, random_routing

E, H, I = 6, 320, 96  # I = 3 groups of 32; H = 10


def random_checkpoint(seed=0, inter=I, extremes=False):
    """gpt-oss-style experts: (blocks [E, rows, k/32, 16], scales [E, rows, k/32]) uint8 of gate_up and down;
    scales around 2^-4 (``extremes``: two groups at 2^-127 and 2^127), codes uniform over all 16 (±0, ±6 too)."""
    g = torch.Generator().manual_seed(seed)

    def matrix(rows, k):
        blocks = torch.randint(0, 256, (E, rows, k // 32, 16), generator=g, dtype=torch.uint8)
        scales = torch.randint(120, 127, (E, rows, k // 32), generator=g, dtype=torch.uint8)
        return blocks, scales
    gate_up, down = matrix(2 * inter, H), matrix(H, inter)
    if extremes:
        gate_up[1][0, 0, 0], gate_up[1][0, 1, 0] = 0, 254
    return gate_up, down


def packed_from(gate_up, down):
    return _pack(split_nibbles(gate_up[0]), split_nibbles(down[0]), gate_up[1], down[1])


def _pack(q13, q2, s13, s2, **kwargs):
    return ops.pack_experts(q13, q2, "mxfp4", gate_up_scale=s13, down_scale=s2, **kwargs)


def test_pack_from_checkpoint_bytes_keeps_codes_and_scales():
    gate_up, down = random_checkpoint(extremes=True)
    w13, w2 = packed_from(gate_up, down)
    h13 = unpack.packed_header(w13)
    assert (h13["format"], h13["group"], h13["kp"]) == ("mxfp4", 32, H)
    assert w13.shape[1] == ops._C.packed_matrix_bytes("mxfp4", "gate_up", 2 * I, H, 0)
    # the codes at their nibbles, the scale bytes in their records (packed row order: gate / up blocks interleaved)
    rows = torch.arange(2 * I).reshape(2, I // 16, 16).transpose(0, 1).reshape(-1)  # packed row -> dense row
    codes = unpack._codes(w13, h13, 4)
    assert torch.equal(codes, split_nibbles(gate_up[0])[:, rows])
    assert torch.equal(unpack._scales(w13, h13, ops.FORMAT_TRAITS["mxfp4"]),
                       unpack.e8m0_values(gate_up[1][:, rows]))
    got_gu, got_dn, fmt = unpack.unpack_experts([(w13, w2)])
    assert fmt == "mxfp4"
    assert torch.equal(got_gu, dequantize_mxfp4(*gate_up)) and torch.equal(got_dn, dequantize_mxfp4(*down))
    # separate gate / up tensors pack the same bytes
    gate, up = split_nibbles(gate_up[0]).split(I, 1)
    sg, su = gate_up[1].split(I, 1)
    sep = _pack(gate, split_nibbles(down[0]), sg, down[1], up=up, up_scale=su)
    assert torch.equal(sep[0], w13) and torch.equal(sep[1], w2)


@pytest.mark.parametrize("group", [32, 64])
def test_pack_from_dense_rounds_as_ocp_mx_and_repacks_to_itself(group):
    g = torch.Generator().manual_seed(1)
    gate_up = torch.randn(E, 2 * I, H, generator=g) * torch.logspace(-6, 3, H, base=2)  # groups of every scale
    down = torch.randn(E, H, I, generator=g) * 0.05
    gate_up[0, 0, :32] = 0  # an all-zero group
    w13, w2 = ops.pack_experts(gate_up, down, "mxfp4", group_size=group)
    got_gu, got_dn, _ = unpack.unpack_experts([(w13, w2)])
    assert torch.equal(got_gu, reference.quantize_mxfp4(gate_up, group))
    assert torch.equal(got_dn, reference.quantize_mxfp4(down, group))
    again = ops.pack_experts(got_gu, got_dn, "mxfp4", group_size=group)  # its values are on the grid: the same bytes
    assert torch.equal(again[0], w13) and torch.equal(again[1], w2)


def test_reference_rounds_ties_to_even_and_saturates():
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 7.0, 0.3, 0.0] + [0.0] * 21)
    x[-1] = 4.0  # max 7: scale 2^0; values as written
    got = reference.quantize_mxfp4(x[None])[0, :11]
    assert got.tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0, 6.0, 0.5, 0.0]


def test_forward_matches_the_dequantized_reference(isa):
    gate_up, down = random_checkpoint(seed=3)
    w13, w2 = packed_from(gate_up, down)
    gu, dn = dequantize_mxfp4(*gate_up), dequantize_mxfp4(*down)
    for T in (1, 5, 40):
        x = torch.randn(T, H)
        ids, w = random_routing(T, E, 2, seed=T)
        out = ops.moe_forward(x, ids, w, w13, w2)
        assert reference.relative_error(out, reference.moe_reference(x, ids, w, gu, dn, "bf16")) \
            <= QUANTIZED_REFERENCE_TOLERANCE
        assert reference.relative_error(out, reference.moe_reference(x, ids, w, gu, dn)) <= FORMAT_TOLERANCE["bf16"]


def test_refusals_name_the_problem():
    gate_up, down = random_checkpoint()
    q13, q2 = split_nibbles(gate_up[0]), split_nibbles(down[0])
    s13, s2 = gate_up[1], down[1]
    bad = s2.clone()
    bad[2, 7, 1] = 0xFF
    with pytest.raises(RuntimeError, match=r"expert 2: row 7: scale of k-group 1 is the E8M0 NaN \(0xff\) \(down\)"):
        _pack(q13, q2, s13, bad)
    bad = q13.clone()
    bad[4, 40, 3] = 16
    with pytest.raises(RuntimeError, match=r"expert 4: row 40, column 3: code 16 is not a 4-bit e2m1 code"):
        _pack(bad, q2, s13, s2)
    with pytest.raises(RuntimeError, match=r"down_scale must be \[6, 320, 3\] \(one per row and k-group of 32 inputs\)"):
        _pack(q13, q2, s13, s2[..., :2])
    with pytest.raises(RuntimeError, match=r"gate_up must be uint8 \(one e2m1 code 0..15 per byte\), got Float"):
        _pack(q13.float(), q2, s13, s2)
    with pytest.raises(RuntimeError, match=r"down_scale must be uint8 \(E8M0 scale bytes\), got Int"):
        _pack(q13, q2, s13, s2.int())


def test_opcheck_pack_experts_exact():
    gate_up, down = random_checkpoint()
    args = (split_nibbles(gate_up[0][:2]), None, split_nibbles(down[0][:2]), "mxfp4", 0,
            [gate_up[1][:2], None, down[1][:2]])
    torch.library.opcheck(torch.ops.ktmoe.pack_experts.default, args)


@pytest.mark.parametrize("numa_parts", [1, 2])
def test_layer_loads_mxfp4_experts_exactly(numa_parts, tmp_path):
    inter = 128  # two parts of 64: each starts a group
    gate_up, down = random_checkpoint(seed=5, inter=inter)
    q13, q2 = split_nibbles(gate_up[0]), split_nibbles(down[0])
    layer = torch_ktmoe.KTMoE(E, 2, H, inter, weight_format="mxfp4", numa_parts=numa_parts, mmap_experts_dir=tmp_path)
    for e in range(E):  # streamed expert by expert, as checkpoint.load_experts does
        layer.load_expert(e, q13[e], q2[e], gate_up_scale=gate_up[1][e], down_scale=down[1][e])
    got_gu, got_dn, fmt = unpack.unpack_experts(layer.packed_tensors())
    assert fmt == "mxfp4"
    assert torch.equal(got_gu, dequantize_mxfp4(*gate_up)) and torch.equal(got_dn, dequantize_mxfp4(*down))
    again = torch_ktmoe.KTMoE(E, 2, H, inter, weight_format="mxfp4", numa_parts=numa_parts, mmap_experts_dir=tmp_path)
    assert again.try_load_cached(layer.cache_fingerprint)


def test_the_e8m0_nan_byte_is_refused_by_every_mxfp4_reader(tmp_path):
    """A _scales byte 0xFF (NaN) in a gpt-oss checkpoint: the dequantizing reader (gpt-oss's default, bf16) refuses
    it naming the tensor, as the exact path does; before, a block of zero codes loaded as zeros and one of ±0.5
    codes as ±2^127."""
    from safetensors.torch import save_file

    from torch_ktmoe.checkpoint import Mxfp4Experts, SafetensorsCheckpoint

    gate_up, down = random_checkpoint()
    scales = gate_up[1].clone()
    scales[1, 5, 2] = 0xFF
    prefix = "model.layers.0.mlp.experts"
    save_file({f"{prefix}.gate_up_proj_blocks": gate_up[0], f"{prefix}.gate_up_proj_scales": scales,
               f"{prefix}.down_proj_blocks": down[0], f"{prefix}.down_proj_scales": down[1]},
              str(tmp_path / "model.safetensors"))
    with SafetensorsCheckpoint(str(tmp_path)) as ckpt:
        reader = Mxfp4Experts.find(ckpt, prefix, H, I)
        list(reader.experts([0]))  # expert 0 is fine
        for read in (reader.experts, reader.mxfp4_experts):
            with pytest.raises(ValueError, match=rf"{prefix}\.gate_up_proj_scales: E8M0 scale byte 0xFF \(NaN\)"):
                list(read([1]))
    with pytest.raises(ValueError, match=r"MXFP4 scales: E8M0 scale byte 0xFF \(NaN\) at \[1, 5, 2\]"):
        dequantize_mxfp4(gate_up[0], scales)
