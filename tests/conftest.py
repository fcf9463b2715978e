"""Shared test setup: import path, seeds, the accuracy table, the ISA fixture."""
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch_ktmoe  # noqa: E402

# mean|out - ref| / mean|ref| against the fp32 reference on random Gaussian
# experts (weights ~ N(0, 1/fan_in)): the bound each format must meet.
FORMAT_TOLERANCE = {"bf16": 0.01, "int8": 0.03, "int4": 0.15}
# Against the reference fed the format's own rounding of weights and activations
# (reference.quantize_weights / format_activations): only summation order is left.
QUANTIZED_REFERENCE_TOLERANCE = 1e-3


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(params=torch_ktmoe.available_isas())
def isa(request):
    """Runs the test once per ISA this CPU and build can run (this thread's calls only; the default is untouched)."""
    with torch_ktmoe.isa_scope(request.param):
        yield request.param


def random_experts(experts, hidden, inter, dtype=torch.float32, seed=0):
    """gate_up [E, 2I, H], down [E, H, I] ~ N(0, 1/fan_in)."""
    g = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5
    down = torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5
    return gate_up.to(dtype), down.to(dtype)


def random_routing(tokens, experts, top_k, seed=0, masked=0.0):
    """Distinct expert ids per token (a fraction `masked` set to -1) and softmax weights."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]) \
        if tokens else torch.empty(0, top_k, dtype=torch.long)
    if masked and tokens:
        ids[torch.rand(ids.shape, generator=g) < masked] = -1
    weights = torch.softmax(torch.randn(tokens, top_k, generator=g), dim=-1)
    return ids, weights
