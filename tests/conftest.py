"""Shared test setup: import path, seeds, the ISA fixture (helpers the tests import: tests/helpers/)."""
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch_ktmoe  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(params=torch_ktmoe.available_isas())
def isa(request):
    """Runs the test once per ISA this CPU and build can run (this thread's calls only; the default is untouched)."""
    with torch_ktmoe.isa_scope(request.param):
        yield request.param
