"""Shared test setup: import path, seeds, the accuracy table, the ISA fixture; random experts and routings."""
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch_ktmoe  # noqa: E402
from ktmoe_harness.moe_inputs import random_experts, random_routing  # noqa: E402,F401  (tests import them from here)

# mean|out - ref| / mean|ref| against the fp32 reference on random Gaussian
# experts (weights ~ N(0, 1/fan_in)): the bound each format must meet, from its
# row of the native format table (csrc/kernels/weight_formats.cpp).
FORMAT_TOLERANCE = {name: row["accuracy_bound"] for name, row in torch_ktmoe.ops.FORMAT_TRAITS.items()}
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
