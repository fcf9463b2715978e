"""Builds and runs the torch-free native kernel tests (tests/native/: main.cpp and one file per kernel family).

The program checks the packed format, every ISA micro-kernel table the CPU can
run (generic always; avx2 / avx512 when cpuid says so and the table is complete)
and the MoE driver, and prints one line per check and "N passed, M failed".
It is compiled here with g++ and the same per-directory ISA flags as the
extension: csrc/kernels/avx2/ and csrc/kernels/avx512/ get their ISA flags,
everything else none.
"""
import concurrent.futures
import glob
import json
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")

with open(os.path.join(CSRC, "isa_flags.json")) as _f:
    ISA_FLAGS = json.load(_f)
AVX2_FLAGS, AVX512_FLAGS = ISA_FLAGS["avx2"], ISA_FLAGS["avx512"]


def _sources():
    """(source, ISA flags) of the torch-free code the native test links."""
    k = os.path.join(CSRC, "kernels")
    plain = ([os.path.join(CSRC, "common", "cpu_features.cpp")]
             + sorted(glob.glob(os.path.join(k, "*.cpp")))
             + sorted(glob.glob(os.path.join(k, "generic", "*.cpp")))
             + sorted(glob.glob(os.path.join(ROOT, "tests", "native", "*.cpp"))))
    return ([(s, []) for s in plain]
            + [(s, AVX2_FLAGS) for s in sorted(glob.glob(os.path.join(k, "avx2", "*.cpp")))]
            + [(s, AVX512_FLAGS) for s in sorted(glob.glob(os.path.join(k, "avx512", "*.cpp")))])


def _compile(cxx, src, flags, obj):
    cmd = [cxx, "-O2", "-std=c++17", "-I" + CSRC, *flags, "-c", src, "-o", obj]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return src, r.returncode, r.stderr


@pytest.fixture(scope="module")
def native_test_binary(tmp_path_factory):
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ not found: the native kernel tests need a C++17 compiler")
    out = tmp_path_factory.mktemp("native")
    jobs = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for i, (src, flags) in enumerate(_sources()):
            obj = str(out / f"{i:02d}_{os.path.basename(src)}.o")
            jobs.append((obj, pool.submit(_compile, cxx, src, flags, obj)))
    errors = [f"{src}:\n{err}" for _, f in jobs for src, rc, err in [f.result()] if rc != 0]
    assert not errors, "compiling the native tests failed:\n" + "\n".join(errors)
    exe = str(out / "test_kernels")
    r = subprocess.run([cxx, "-o", exe, *[obj for obj, _ in jobs], "-pthread"],
                       capture_output=True, text=True)
    assert r.returncode == 0, "linking the native tests failed:\n" + r.stderr
    return exe


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
