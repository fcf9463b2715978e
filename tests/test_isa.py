"""ISA selection: isa_scope (this thread's calls only) beside the process-wide set_isa; auto picks the best, amx included."""
import os
import subprocess
import sys
import threading

import pytest
import torch

import torch_ktmoe
from torch_ktmoe import _C, ops, reference
from tests.helpers import QUANTIZED_REFERENCE_TOLERANCE, random_experts, random_routing

HAS_AMX = "amx" in torch_ktmoe.available_isas()


def test_isa_scope_is_per_thread_nests_and_restores():
    default = torch_ktmoe.active_isa()
    seen = {}
    with torch_ktmoe.isa_scope("generic"):
        assert torch_ktmoe.active_isa() == "generic"
        t = threading.Thread(target=lambda: seen.setdefault("other", torch_ktmoe.active_isa()))
        t.start()
        t.join()
        with torch_ktmoe.isa_scope(_C.default_isa()) as best:
            assert torch_ktmoe.active_isa() == best
        assert torch_ktmoe.active_isa() == "generic"
        with pytest.raises(ZeroDivisionError), torch_ktmoe.isa_scope("auto"):
            1 / 0
        assert torch_ktmoe.active_isa() == "generic"
    assert seen["other"] == default
    assert torch_ktmoe.active_isa() == default


def test_isa_scope_overrides_set_isa_on_its_thread_only():
    default = torch_ktmoe.active_isa()
    try:
        torch_ktmoe.set_isa("generic")
        with torch_ktmoe.isa_scope("auto"):
            assert torch_ktmoe.active_isa() == _C.default_isa()
        assert torch_ktmoe.active_isa() == "generic"
    finally:
        torch_ktmoe.set_isa(default)


def test_isa_scope_refuses_an_unknown_isa():
    with pytest.raises(RuntimeError, match="unknown ISA 'sse9'.*Available: generic"):
        with torch_ktmoe.isa_scope("sse9"):
            pass


def test_auto_picks_the_best_available_amx_included():
    names = torch_ktmoe.available_isas()
    assert _C.default_isa() == names[-1] and (names[-1] == "amx") == HAS_AMX
    with torch_ktmoe.isa_scope("auto"):
        assert torch_ktmoe.active_isa() == names[-1]


def test_amx_is_chosen_by_name_or_names_what_the_cpu_lacks():
    if HAS_AMX:
        with torch_ktmoe.isa_scope("amx"):
            assert torch_ktmoe.active_isa() == "amx"
    else:
        with pytest.raises(RuntimeError, match=r"cannot use ISA 'amx': this CPU lacks (AMX-|AVX-512|OS-saved|"
                                               r"permission for AMX).*Available: generic"):
            with torch_ktmoe.isa_scope("amx"):
                pass


def test_ktmoe_isa_amx_in_the_environment():
    """KTMOE_ISA=amx (as bench_moe and every entry point read it) runs amx, or fails naming what is missing."""
    env = dict(os.environ, KTMOE_ISA="amx")
    r = subprocess.run([sys.executable, "-c", "import torch_ktmoe; print(torch_ktmoe.active_isa())"],
                       env=env, capture_output=True, text=True, timeout=120)
    if HAS_AMX:
        assert r.returncode == 0 and r.stdout.strip() == "amx", r.stderr
    else:
        assert r.returncode != 0 and "cannot use ISA 'amx': this CPU lacks" in r.stderr, r.stderr


@pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX (the tile kernels run on the emulator in tests/native)")
@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4"])
def test_amx_prefill_forward_meets_the_quantized_reference(fmt):
    """96 tokens over 4 experts, top-2: every expert gets far more than 16 rows, so its gemms run on tiles."""
    H, I = 192, 160
    gate_up, down = random_experts(4, H, I)
    w13, w2 = ops.pack_experts(gate_up, down, fmt)
    x = torch.randn(96, H)
    ids, w = random_routing(96, 4, 2)
    with torch_ktmoe.isa_scope("amx"):
        out = ops.moe_forward(x, ids, w, w13, w2)
    row = next(r for r in _C.weight_formats() if r["name"] == fmt)
    used = row["default_group"] or 32
    quantized = reference.moe_reference(x, ids, w, reference.quantize_weights(gate_up, fmt, used),
                                        reference.quantize_weights(down, fmt, used),
                                        reference.format_activations(fmt, used))
    assert reference.relative_error(out, quantized) <= QUANTIZED_REFERENCE_TOLERANCE
