"""fp16 activations in torch.ops.ktmoe.moe_forward (converted in the kernel's activation prep), per ISA,
against the independent fp32 reference; opcheck with fp16; the inference-only autograd formula."""
import pytest
import torch

from torch_ktmoe import ops, reference
from tests.helpers import QUANTIZED_REFERENCE_TOLERANCE, random_experts, random_routing

FORMATS = ops.WEIGHT_FORMATS


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tokens", [1, 7, 70])
def test_fp16_matches_reference_and_fp32_path(isa, fmt, tokens):
    gate_up, down = random_experts(6, 96, 48)
    w13, w2 = ops.pack_experts(gate_up, down, fmt)
    ids, w = random_routing(tokens, 6, 3, masked=0.2)
    x16 = torch.randn(tokens, 96).half()
    out = ops.moe_forward(x16, ids, w, w13, w2)
    assert out.dtype == torch.float16 and out.shape == x16.shape
    # fp16 -> fp32 is exact and the output is rounded once: the fp32 path on the same values, rounded
    assert torch.equal(out, ops.moe_forward(x16.float(), ids, w, w13, w2).half())
    ref = reference.moe_reference(x16.float(), ids, w, reference.quantize_weights(gate_up, fmt),
                                  reference.quantize_weights(down, fmt),
                                  activations=reference.format_activations(fmt))
    assert reference.relative_error(out.float(), ref) <= QUANTIZED_REFERENCE_TOLERANCE


def test_fp16_extremes_round_like_torch():
    # outputs beyond fp16's range become inf, as torch's own fp32 -> fp16 cast does
    gate_up, down = random_experts(2, 32, 16)
    w13, w2 = ops.pack_experts(gate_up * 40, down * 40, "bf16")
    x = (torch.randn(4, 32) * 100).half()
    ids, w = torch.tensor([[0, 1]] * 4), torch.ones(4, 2)
    out = ops.moe_forward(x, ids, w, w13, w2)
    assert torch.equal(out, ops.moe_forward(x.float(), ids, w, w13, w2).half())


@pytest.mark.parametrize("fmt", FORMATS)
def test_opcheck_fp16(fmt):
    gate_up, down = random_experts(4, 64, 32)
    w13, w2 = ops.pack_experts(gate_up, down, fmt)
    ids, w = random_routing(5, 4, 2, masked=0.2)
    torch.library.opcheck(torch.ops.ktmoe.moe_forward.default, (torch.randn(5, 64).half(), ids, w.half(), w13, w2))


def test_other_dtypes_rejected():
    gate_up, down = random_experts(2, 32, 16)
    w13, w2 = ops.pack_experts(gate_up, down, "bf16")
    with pytest.raises(RuntimeError, match="bfloat16, float16 or float32, got Double"):
        ops.moe_forward(torch.randn(2, 32, dtype=torch.float64), torch.zeros(2, 1, dtype=torch.long),
                        torch.ones(2, 1), w13, w2)


def test_pack_outputs_carry_no_gradient():
    gate_up, down = random_experts(2, 32, 16)
    gate_up.requires_grad_(True)
    w13, _ = ops.pack_experts(gate_up, down, "bf16")
    assert not w13.requires_grad  # integer outputs carry no gradient; nothing silently zero
