"""The weight format table (_C.weight_formats(), csrc/kernels/weight_formats.cpp) against reality:
every row's sizes are the bytes pack_experts writes, its codes and scales decode (unpack) to the
reference quantizer's weights, its activations are what its gemm multiplies, and it meets its bound."""
import pytest
import torch

import torch_ktmoe
from torch_ktmoe import ops, reference
from torch_ktmoe.unpack import packed_header, unpack_experts
from tests.helpers import FORMAT_TOLERANCE, QUANTIZED_REFERENCE_TOLERANCE, random_experts, random_routing

ROWS = torch_ktmoe._C.weight_formats()


def test_rows_are_the_formats_everyone_lists():
    names = [row["name"] for row in ROWS]
    assert [row["id"] for row in ROWS] == list(range(len(ROWS)))
    assert tuple(names) == ops.WEIGHT_FORMATS == tuple(FORMAT_TOLERANCE)
    assert len(set(names)) == len(names) and all(0 < len(n) < 16 for n in names)  # the cache key's char[16]
    for row in ROWS:
        assert (row["scales"] == "none") == (row["scale_bytes"] == 0)
        assert (row["codes"] == "codebook") == (len(row["codebook"]) == 1 << row["code_bits"])
        assert row["gemm"] == "gemm_" + row["name"]
        assert 0 < row["accuracy_bound"] < 1


def test_exact_rows_name_their_checkpoint_inputs():
    """A row's ``exact`` says what a checkpoint's exact codes come with; ops.exact_names lays out the op's list."""
    exact = {row["name"]: row["exact"] for row in ROWS if row["exact"] is not None}
    assert tuple(exact) == ops.EXACT_FORMATS == ("fp8", "int4_affine", "mxfp4")
    assert [exact[f]["codes"] for f in exact] == [["float8_e4m3fn"], ["uint8"], ["uint8"]]
    assert exact["int4_affine"]["inputs"] == [
        {"name": "scale", "dtypes": ["float32", "bfloat16", "float16"], "optional": False},
        {"name": "zero", "dtypes": ["integer"], "optional": True}]
    assert exact["mxfp4"]["inputs"] == [{"name": "scale", "dtypes": ["uint8"], "optional": False}]
    assert ops.exact_names("fp8") == ("gate_up_scale", "up_scale", "down_scale")
    assert ops.exact_names("int4_affine") == ("gate_up_scale", "up_scale", "down_scale", "gate_up_zero", "up_zero",
                                              "down_zero")
    assert all(ops.exact_names(f) == () for f in ops.WEIGHT_FORMATS if f not in exact)


def test_an_unknown_format_names_the_known_ones():
    gate_up, down = random_experts(2, 64, 32)
    known = ", ".join(f"'{n}'" for n in ops.WEIGHT_FORMATS[:-1]) + f" or '{ops.WEIGHT_FORMATS[-1]}'"
    with pytest.raises(RuntimeError, match=f"weight_format must be {known}, got 'fp4'"):
        ops.pack_experts(gate_up, down, "fp4")


def _expected_bytes(row, role, n, k, group):
    """The blob size the row's fields imply (packed_format.h): header, data, scales, each 64-aligned."""
    g = 0 if row["group"] == "none" else group or row["default_group"]
    kp = -(-k // (g or 32)) * (g or 32)
    np_ = 2 * -(-(n // 2) // 16) * 16 if role == "gate_up" else -(-n // 16) * 16
    data = np_ * kp * row["code_bits"] // 8
    scales = 0 if row["scales"] == "none" else np_ * (kp // (g or kp)) * row["scale_bytes"]
    up64 = lambda b: -(-b // 64) * 64  # noqa: E731
    return up64(up64(64 + data) + scales), kp, g


@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
@pytest.mark.parametrize("H, I, group", [(100, 72, 0), (128, 96, 64)])
def test_each_row_packs_decodes_and_forwards_as_it_says(row, H, I, group):
    fmt = row["name"]
    gate_up, down = random_experts(6, H, I)
    w13, w2 = ops.pack_experts(gate_up, down, fmt, group_size=group or None)  # 0 here: the format's default
    for w, role, n, k in ((w13, "gate_up", 2 * I, H), (w2, "down", H, I)):
        total, kp, g = _expected_bytes(row, role, n, k, group)
        h = packed_header(w)
        assert (h["format"], h["total_bytes"], w.shape[1], h["kp"], h["group"]) == (fmt, total, total, kp, g)
    used = group or row["default_group"] or None
    got_gu, got_dn, got_fmt = unpack_experts([(w13, w2)])
    assert got_fmt == fmt
    assert torch.equal(got_gu.float(), reference.quantize_weights(gate_up, fmt, used))
    assert torch.equal(got_dn.float(), reference.quantize_weights(down, fmt, used))

    x = torch.randn(9, H)
    ids, w = random_routing(9, 6, 2)
    out = ops.moe_forward(x, ids, w, w13, w2)
    quantized = reference.moe_reference(x, ids, w, reference.quantize_weights(gate_up, fmt, used),
                                        reference.quantize_weights(down, fmt, used),
                                        reference.format_activations(fmt, used))
    assert reference.relative_error(out, quantized) <= QUANTIZED_REFERENCE_TOLERANCE
    assert reference.relative_error(out, reference.moe_reference(x, ids, w, gate_up, down)) <= row["accuracy_bound"]


@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
def test_bits_per_weight_is_what_a_large_matrix_costs(row):
    """Blob bytes per weight of an aligned matrix packed at the row's default group: its bits_per_weight."""
    n, k = 256, 1024
    blob = torch_ktmoe._C.packed_matrix_bytes(row["name"], "plain", n, k, row["default_group"])
    assert blob * 8 / (n * k) == pytest.approx(row["bits_per_weight"], abs=64 * 8 / (n * k))
