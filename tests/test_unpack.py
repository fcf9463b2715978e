"""The packer (csrc/kernels/pack.cpp), the format decoder (torch_ktmoe/unpack.py) and the
Python reference quantizer (torch_ktmoe/reference.py) agree bit for bit: unpacking what
the layer packed gives exactly reference.quantize_weights of the dense experts."""
import pytest
import torch

from torch_ktmoe import KTMoE, reference
from torch_ktmoe.ops import WEIGHT_FORMATS
from torch_ktmoe.unpack import packed_header, unpack_experts

E, K = 3, 2


def heavy_tailed_experts(H, I):
    """Student-t(3) weights (outliers of either sign), plus an all-zero expert row and group."""
    t = torch.distributions.StudentT(3.0)
    gate_up, down = t.sample((E, 2 * I, H)) / H ** 0.5, t.sample((E, H, I)) / I ** 0.5
    gate_up[0, 1] = 0.0
    down[1, :, :32] = 0.0
    return gate_up, down


@pytest.mark.parametrize("fmt", WEIGHT_FORMATS)
@pytest.mark.parametrize("H, I, group", [(64, 48, 32), (72, 40, 32), (128, 80, 64)])
def test_unpacked_weights_equal_the_reference_quantizer(fmt, H, I, group):
    gate_up, down = heavy_tailed_experts(H, I)
    layer = KTMoE(E, K, H, I, weight_format=fmt, group_size=group)
    layer.load_weights(gate_up, down)
    got_gu, got_dn, got_fmt = unpack_experts([(layer.w13_0, layer.w2_0)])
    assert got_fmt == fmt
    assert torch.equal(got_gu.float(), reference.quantize_weights(gate_up, fmt, group))
    assert torch.equal(got_dn.float(), reference.quantize_weights(down, fmt, group))


def test_int4_uses_both_signs_of_the_scale():
    """The codebook reaches -64 but only +56: a group whose largest weight is positive is
    stored with d < 0, so that weight lands on the long side; a negative one with d > 0."""
    H, I = 64, 32
    gate_up = torch.randn(E, 2 * I, H) * 0.01
    gate_up[:, :, 5] = 1.0  # the largest weight of its group, positive
    down = torch.randn(E, H, I) * 0.01
    down[:, :, 7] = -1.0  # negative
    layer = KTMoE(E, K, H, I, weight_format="int4")
    layer.load_weights(gate_up, down)

    def first_scale(w):  # d of packed row 0 (HF row 0), group 0, every expert
        s0 = packed_header(w)["scale_offset"]
        return w[:, s0:s0 + 2].contiguous().view(torch.bfloat16).float().flatten()

    assert (first_scale(layer.w13_0) < 0).all() and (first_scale(layer.w2_0) > 0).all()
    got_gu, got_dn, _ = unpack_experts([(layer.w13_0, layer.w2_0)])
    assert torch.equal(got_gu, reference.quantize_weights(gate_up, "int4"))
    assert ((got_gu[:, :, 5] - 1).abs() < 0.05).all() and ((got_dn[:, :, 7] + 1).abs() < 0.05).all()


def test_a_format_id_no_row_has_is_a_clear_error():
    layer = KTMoE(E, K, 64, 32, weight_format="int8")
    layer.load_weights(*heavy_tailed_experts(64, 32))
    forged = layer.w13_0.clone()
    forged[:, 6] = 9  # PackedMatrixHeader::format
    with pytest.raises(ValueError, match="format id 9, which this build does not know"):
        unpack_experts([(forged, layer.w2_0)])
