"""The avx2_vnni ISA (avx2's table with AVX-VNNI's vpdpbusd int8 / int4 gemms): offered exactly where
the CPU has AVX-VNNI, picked by ``auto`` only without AVX-512, refused by name elsewhere.

Its kernels run here only on a CPU with AVX-VNNI; tests/native/test_avx2_vnni.cpp checks their bits
against generic's on every AVX-512 host too (a build of them with the EVEX vpdpbusd).
"""
import os
import subprocess
import sys

import pytest
import torch

import torch_ktmoe
from torch_ktmoe import _C, ops
from tests.helpers import random_experts, random_routing

HAS_AVX2_VNNI = "avx2_vnni" in torch_ktmoe.available_isas()
REFUSAL = r"cannot use ISA 'avx2_vnni': this CPU lacks (AVX-VNNI|AVX2\+FMA\+F16C)\. Available: generic"


def _cpu_flags():
    """The flags of /proc/cpuinfo's first processor (what the kernel read from cpuid), or None."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def test_offered_exactly_where_proc_cpuinfo_lists_avx_vnni():
    flags = _cpu_flags()
    if flags is None:
        pytest.skip("no /proc/cpuinfo flags line to compare the cpuid detection with")
    assert HAS_AVX2_VNNI == ({"avx2", "fma", "f16c", "avx_vnni"} <= flags), torch_ktmoe.available_isas()


def test_auto_picks_it_only_without_avx512():
    names = torch_ktmoe.available_isas()
    if HAS_AVX2_VNNI:
        assert names.index("avx2") < names.index("avx2_vnni")
        wider = [isa for isa in ("amx", "avx512") if isa in names]  # auto's order: amx, avx512, avx2_vnni
        assert _C.default_isa() == (wider[0] if wider else "avx2_vnni")
    else:
        assert _C.default_isa() != "avx2_vnni"


def test_chosen_by_name_or_refused_naming_what_the_cpu_lacks():
    if HAS_AVX2_VNNI:
        with torch_ktmoe.isa_scope("avx2_vnni"):
            assert torch_ktmoe.active_isa() == "avx2_vnni"
    else:
        with pytest.raises(RuntimeError, match=REFUSAL), torch_ktmoe.isa_scope("avx2_vnni"):
            pass


def test_ktmoe_isa_avx2_vnni_in_the_environment_and_info():
    """KTMOE_ISA=avx2_vnni runs it (and `info` lists it), or every entry point fails naming what is missing."""
    env = dict(os.environ, KTMOE_ISA="avx2_vnni")
    r = subprocess.run([sys.executable, "-m", "torch_ktmoe", "info"], env=env, capture_output=True, text=True,
                       timeout=120)
    if HAS_AVX2_VNNI:
        assert r.returncode == 0 and "ISA         avx2_vnni" in r.stdout and "avx2_vnni" in r.stdout.split(
            "available:")[1], r.stdout + r.stderr
    else:
        assert r.returncode != 0 and "cannot use ISA 'avx2_vnni': this CPU lacks" in r.stderr, r.stdout + r.stderr


@pytest.mark.skipif(not HAS_AVX2_VNNI, reason="this CPU has no AVX-VNNI (tests/native runs these kernels' EVEX "
                                              "build on AVX-512 hosts)")
@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("tokens", [1, 40])
def test_forward_has_avx2s_bits(fmt, tokens):
    """Same table but the int gemms, which give generic's bits as avx2's do: the forward is avx2's to the bit."""
    gate_up, down = random_experts(6, 160, 96)
    w13, w2 = ops.pack_experts(gate_up, down, fmt)
    x = torch.randn(tokens, 160)
    ids, w = random_routing(tokens, 6, 2)
    with torch_ktmoe.isa_scope("avx2"):
        want = ops.moe_forward(x, ids, w, w13, w2)
    with torch_ktmoe.isa_scope("avx2_vnni"):
        got = ops.moe_forward(x, ids, w, w13, w2)
    assert torch.equal(got, want)
