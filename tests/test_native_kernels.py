"""Builds and runs the torch-free native kernel tests (tests/native/: main.cpp and one file per kernel family).

The program checks the packed format, every ISA micro-kernel table the CPU can
run (generic always; avx2 / avx512 when cpuid says so and the table is complete)
and the MoE driver, and prints one line per check and "N passed, M failed".
It is compiled by native_build.ninja_build, the extension's own flags table and
driver (setup.py): each csrc/kernels/<isa>/ gets its ISA flags, everything else
none; into build/native_tests, so a rerun compiles only what changed.
"""
import shutil
import subprocess

import pytest

from native_build import CSRC, ROOT, NinjaBuildError, Recompiled, isa_of, ninja_build, torch_free_sources


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
    for tool in ("g++", "ninja"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not found: the native kernel tests need it")
    build_dir = ROOT / "build" / "native_tests"
    try:
        ninja_build(build_dir, _sources(), executable="test_kernels", link_flags=["-pthread"], capture=True)
    except NinjaBuildError as exc:
        pytest.fail(f"building the native tests failed: {exc}")
    return str(build_dir / "test_kernels")


def test_native_kernels(native_test_binary):
    r = subprocess.run([native_test_binary], capture_output=True, text=True, timeout=300)
    output = r.stdout + r.stderr
    lines = output.strip().splitlines()
    failures = "\n".join(l for l in lines if l.startswith("FAIL"))
    assert r.returncode == 0 and lines and lines[-1].endswith(" 0 failed"), (
        f"native kernel tests failed (exit {r.returncode}):\n{failures}\n\n--- full output ---\n{output}")
    # Skipped ISAs (incomplete tables, or not supported by this CPU) are shown with -rA / -s.
    for line in lines:
        if line.startswith("SKIP"):
            print(line)
