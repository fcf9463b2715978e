"""Helpers the test modules share (a test module never imports another): tolerances, random inputs, markers.

* :mod:`tests.helpers.cache_layer` -- a small KTMoE with a cache directory, and how to drive it;
* :mod:`tests.helpers.hf_models` -- tiny random transformers MoE models and their comparisons.
* :mod:`tests.helpers.native_program` -- build and run a torch-free native test program;
* :mod:`tests.helpers.gguf_files` -- GGUF files written by the `gguf` package: random blocks, experts, splits.
"""
import os

import pytest

import torch_ktmoe
from ktmoe_harness.moe_inputs import random_experts, random_routing  # noqa: F401  (tests import them from here)

# mean|out - ref| / mean|ref| against the fp32 reference on random Gaussian
# experts (weights ~ N(0, 1/fan_in)): the bound each format must meet, from its
# row of the native format table (csrc/kernels/weight_formats.cpp).
FORMAT_TOLERANCE = {name: row["accuracy_bound"] for name, row in torch_ktmoe.ops.FORMAT_TRAITS.items()}
# Against the reference fed the format's own rounding of weights and activations
# (reference.quantize_weights / format_activations): only summation order is left.
QUANTIZED_REFERENCE_TOLERANCE = 1e-3

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown a file to another user")
