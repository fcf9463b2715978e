"""The torch-free native build, shared by setup.py (the extension's objects) and tests/test_native_kernels.py.

One flags table: every source gets TORCH_FREE_FLAGS, and a source under csrc/kernels/<isa>/
also that ISA's flags from csrc/isa_flags.json (nothing else gets any), so the extension
imports on any x86-64 CPU and picks kernels at run time. A ``Recompiled(source, isa)`` in a
source list compiles a source a second time with another entry's flags (the native tests build
csrc/kernels/avx2_vnni/ also as avx2_vnni_evex). One driver: ``ninja_build`` writes a
build.ninja and runs ninja, which rebuilds an object only when its source, a header it
includes or its command line changed, and shows one status line (updated in place on a
terminal). The compiler's output of each object is kept in OBJ.log and printed only when
the compile fails (GCC 12 warns hundreds of times inside its own AVX-512 intrinsics headers).
"""
import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"

ISA_FLAGS = {k: v for k, v in json.loads((CSRC / "isa_flags.json").read_text()).items() if not k.startswith("_")}
TORCH_FREE_FLAGS = ["-O3", "-std=c++17", "-fPIC", "-Wall", "-Wno-unused-function", "-fno-math-errno"]
ISA_ORDER = ["generic", *ISA_FLAGS]  # link order: generic first


class NinjaBuildError(RuntimeError):
    """A ninja build failed; the message holds its output when it was captured."""


class Recompiled(NamedTuple):
    """`source` compiled with the flags of ISA entry `isa` instead of its directory's, into its own
    object (NAME.<isa>.o), beside the ordinary one."""
    source: Path
    isa: str


def isa_of(source) -> str:
    """"avx2" / "avx2_vnni" / "avx512" / "amx" for a source under csrc/kernels/<isa>/, a Recompiled's
    isa, else "generic"."""
    if isinstance(source, Recompiled):
        return source.isa
    parts = source.relative_to(CSRC).parts if source.is_relative_to(CSRC) else ()
    return parts[1] if len(parts) > 2 and parts[0] == "kernels" and parts[1] in ISA_FLAGS else "generic"


def compile_flags(source):
    return TORCH_FREE_FLAGS + ISA_FLAGS.get(isa_of(source), []) + ["-I", str(CSRC)]


def _object_name(source) -> Path:
    """csrc/kernels/pack.cpp -> csrc/kernels/pack.o; Recompiled(x.cpp, isa) -> x.<isa>.o."""
    if isinstance(source, Recompiled):
        return source.source.relative_to(ROOT).with_suffix(f".{source.isa}.o")
    return source.relative_to(ROOT).with_suffix(".o")


def torch_free_sources():
    """Every .cpp of csrc/common, csrc/arena and csrc/kernels (the extension's torch-free part)."""
    return sorted(p for d in ("common", "arena", "kernels") for p in (CSRC / d).rglob("*.cpp"))


def link_order(sources):
    """Generic sources first: the linker keeps the first copy of an inline function emitted by
    several objects, which must never be an ISA-flagged one."""
    return sorted(sources, key=lambda p: ISA_ORDER.index(isa_of(p)))


def _esc(text) -> str:
    return str(text).replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def ninja_file_text(build_dir: Path, sources, executable=None, link_flags=(), extra_flags=()):
    """(build.ninja text, objects in link order) compiling `sources` into build_dir (each with its flags from
    the table, then `extra_flags`), linking `executable` if given."""
    cxx = os.environ.get("CXX", "g++")
    lines = ["ninja_required_version = 1.3", f"cxx = {_esc(cxx)}", "",
             "rule cxx",  # the compiler's output goes to OBJ.log, shown when the compile fails
             "  command = $cxx -MMD -MF $out.d $flags -c $in -o $out 2> $out.log || { cat $out.log; exit 1; }",
             "  depfile = $out.d",
             "  deps = gcc",
             "  description = CXX $src",
             "",
             "rule link",
             "  command = $cxx -o $out $in $link_flags",
             "  description = LINK $out", ""]
    objects = []
    for unit in link_order(sources):
        src = unit.source if isinstance(unit, Recompiled) else unit
        obj = build_dir / _object_name(unit)
        objects.append(obj)
        lines += [f"build {_esc(obj)}: cxx {_esc(src)}",
                  "  flags = " + " ".join(shlex.quote(f) for f in [*compile_flags(unit), *extra_flags])
                  .replace("$", "$$"),
                  f"  src = {_esc(src.relative_to(ROOT))}" + (f"$ as$ {unit.isa}" if src is not unit else "")]
    if executable is not None:
        lines += [f"build {_esc(build_dir / executable)}: link " + " ".join(_esc(o) for o in objects),
                  "  link_flags = " + " ".join(shlex.quote(f) for f in link_flags).replace("$", "$$")]
    return "\n".join(lines) + "\n", objects


def run_ninja(build_dir: Path, capture=False) -> None:
    """Runs ninja in build_dir (MAX_JOBS jobs when set, as torch's builds read it, else ninja's default).

    capture=False: ninja's output goes to this process's stdout; capture=True: it is kept and
    put in the NinjaBuildError raised on failure.
    """
    jobs = ["-j", os.environ["MAX_JOBS"]] if os.environ.get("MAX_JOBS") else []
    res = subprocess.run(["ninja", *jobs], cwd=build_dir, capture_output=capture, text=True)
    if res.returncode != 0:
        raise NinjaBuildError(f"the build in {build_dir} failed" + (f":\n{res.stdout}{res.stderr}" if capture else
                                                                    " (see above)"))


def ninja_build(build_dir: Path, sources, executable=None, link_flags=(), capture=False, extra_flags=()):
    """Compiles `sources` with the flags table into build_dir (and links `executable`); returns the objects.

    Objects are named after their path in the repository (csrc/kernels/pack.cpp ->
    build_dir/csrc/kernels/pack.o) and listed in link order.
    """
    build_dir.mkdir(parents=True, exist_ok=True)
    text, objects = ninja_file_text(build_dir, sources, executable, link_flags, extra_flags)
    ninja_file = build_dir / "build.ninja"
    if not ninja_file.exists() or ninja_file.read_text() != text:
        ninja_file.write_text(text)
    run_ninja(build_dir, capture)
    return [str(o) for o in objects]
