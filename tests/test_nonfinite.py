"""Non-finite numbers: a NaN/Inf activation row gives a non-finite output row in every format and
ISA (as bf16 does), other rows are untouched; non-finite weights are refused at pack time."""
import pytest
import torch

from torch_ktmoe import ops
from tests.helpers import random_experts, random_routing

E, K, H, I, T = 6, 2, 96, 64, 5


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("fmt", ops.WEIGHT_FORMATS)
def test_nonfinite_activation_row_stays_nonfinite(isa, fmt, bad):
    gate_up, down = random_experts(E, H, I)
    w13, w2 = ops.pack_experts(gate_up, down, fmt)
    ids, w = random_routing(T, E, K)
    x = torch.randn(T, H)
    clean = ops.moe_forward(x, ids, w, w13, w2)
    x[2, 17] = bad
    out = ops.moe_forward(x, ids, w, w13, w2)
    assert not torch.isfinite(out[2]).all(), f"{isa}/{fmt}: token 2 came out finite"
    others = [0, 1, 3, 4]
    assert torch.isfinite(out[others]).all()
    assert torch.equal(out[others], clean[others])


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("fmt", ops.WEIGHT_FORMATS)
@pytest.mark.parametrize("which", ["gate_up", "down"])
def test_nonfinite_weight_refused_at_pack_time(fmt, bad, which):
    gate_up, down = random_experts(E, H, I)
    (gate_up if which == "gate_up" else down)[3, 5, 7] = bad
    with pytest.raises(RuntimeError, match=r"non-finite .*expert 3"):
        ops.pack_experts(gate_up, down, fmt)


def test_nonfinite_weight_refused_in_separate_up():
    gate_up, down = random_experts(E, H, I)
    gate, up = gate_up[:, :I].clone(), gate_up[:, I:].clone()
    up[1, 0, 0] = float("nan")
    with pytest.raises(RuntimeError, match=r"non-finite .*expert 1"):
        ops.pack_experts(gate, down, "int8", up=up)
