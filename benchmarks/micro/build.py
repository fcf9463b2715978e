"""The one build of the benchmarks' C++ programs: native_build's ninja driver and flags table.

    python -m benchmarks.micro.build avx2_decode_micro [--isa avx2]     -> prints the executable's path

A program (a .cpp of benchmarks/) is compiled with the flags of an ISA row of csrc/isa_flags.json
(as a source of csrc/kernels/<isa>/ would be: native_build.Recompiled), OpenMP on, and linked, alone or
with library sources, into build/bench/<name>-<isa>/. Only what changed is rebuilt.
"""
import argparse
from pathlib import Path

from native_build import ROOT, Recompiled, ninja_build

# name -> (source, the ISA whose flags it needs by default: what the host it measures runs)
PROGRAMS = {
    "avx2_decode_micro": (ROOT / "benchmarks" / "micro" / "avx2_decode_micro.cpp", "avx2"),
    "fp8_decode_micro": (ROOT / "benchmarks" / "micro" / "fp8_decode_micro.cpp", "avx512"),
    "avx2_vnni_gemm": (ROOT / "benchmarks" / "micro" / "avx2_vnni_gemm.cpp", "generic"),  # calls the kernels
    "roof_probes": (ROOT / "benchmarks" / "baselines" / "roof_probes.cpp", "generic"),
}


def build(name: str, isa: str = "", library_sources=(), shared: bool = False) -> Path:
    """Builds program `name` with `isa`'s flags (its default if ""), linked with `library_sources` (as the
    extension compiles them), as an executable or a shared library; returns its path."""
    source, default_isa = PROGRAMS[name]
    isa = isa or default_isa
    out_dir = ROOT / "build" / "bench" / f"{name}-{isa}"
    binary = f"lib{name}.so" if shared else name
    ninja_build(out_dir, [*library_sources, Recompiled(source, isa)], executable=binary,
                link_flags=["-fopenmp", "-pthread", *(["-shared"] if shared else [])], extra_flags=["-fopenmp"],
                capture=True)  # quiet (stdout is the path); the compiler's output is in the error on failure
    return out_dir / binary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", choices=sorted(PROGRAMS))
    ap.add_argument("--isa", default="", help="the isa_flags.json row to compile with (default: the program's)")
    args = ap.parse_args(argv)
    print(build(args.name, args.isa))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
