"""Builds and runs the torch-free native kernel tests (tests/native/: main.cpp and one file per kernel family).

The program checks the packed format, every ISA micro-kernel table the CPU can
run (generic always; avx2 / avx512 when cpuid says so and the table is complete)
and the MoE driver, and prints one line per check and "N passed, M failed".
It is compiled by native_build.ninja_build, the extension's own flags table and
driver (setup.py): each csrc/kernels/<isa>/ gets its ISA flags, everything else
none; into build/native_tests, so a rerun compiles only what changed.
"""
import pytest

from native_build import CSRC, ROOT, Recompiled, isa_of, torch_free_sources
from tests.helpers.native_program import build_native_program, run_native_program


def _sources():
    """The torch-free code the native test links (kernels and cpu features, no arena), the avx2_vnni
    kernels a second time with vpdpbusd's EVEX form (they run on AVX-512 hosts without AVX-VNNI:
    tests/native/test_avx2_vnni.cpp), and the tests."""
    kernels = [s for s in torch_free_sources()
               if s.is_relative_to(CSRC / "kernels") or s == CSRC / "common" / "cpu_features.cpp"]
    evex = [Recompiled(s, "avx2_vnni_evex") for s in kernels if isa_of(s) == "avx2_vnni"]
    return kernels + evex + sorted((ROOT / "tests" / "native").glob("*.cpp"))


@pytest.fixture(scope="module")
def native_test_binary():
    return build_native_program("native_tests", _sources(), "test_kernels")


def test_native_kernels(native_test_binary):
    run_native_program([native_test_binary])
