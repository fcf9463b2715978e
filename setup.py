"""Build of torch_ktmoe._C.

Two kinds of sources:
* torch-free sources (csrc/common, csrc/arena, csrc/kernels/**) are compiled here
  with g++, each with the flags of its ISA directory only: csrc/kernels/avx2/*
  get AVX2 flags, csrc/kernels/avx512/* AVX-512 flags, everything else none, so
  the extension imports on any x86-64 CPU and picks kernels at run time;
* ATen glue (csrc/bindings.cpp, csrc/ops/*) is compiled by torch's
  BuildExtension (ninja) and linked with the objects above.
Both go through ninja, which rebuilds an object only when its source, a header it
includes or its command changed, and shows one status line (updated in place on a
terminal) instead of every compiler command.

Each torch version gets its own directory for the ATen objects
(build/temp-torch-<version>), so a build against another torch (e.g. sglang's,
`make test-sglang`) never links objects compiled against this one; the torch-free
objects (build/torch_free) include no torch header and are shared. The torch version
is written next to the built module (torch_ktmoe/_C.torch-version);
torch_ktmoe/_native.py compares it with the running torch before importing it.
"""
import contextlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from setuptools import setup
import torch
from torch.utils import cpp_extension
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"

# Flags per ISA directory: csrc/isa_flags.json (tests/test_native_kernels.py reads it too).
ISA_FLAGS = {k: v for k, v in json.loads((CSRC / "isa_flags.json").read_text()).items() if not k.startswith("_")}
TORCH_FREE_FLAGS = ["-O3", "-std=c++17", "-fPIC", "-Wall", "-Wno-unused-function", "-fno-math-errno"]


def isa_of(source: Path) -> str:
    parts = source.relative_to(CSRC).parts
    return parts[1] if len(parts) > 2 and parts[0] == "kernels" and parts[1] in ISA_FLAGS else "generic"


def torch_free_sources():
    # Generic code first: the linker keeps the first copy of an inline function
    # emitted by several objects, which must never be an ISA-flagged one.
    srcs = sorted(p for d in ("common", "arena", "kernels") for p in (CSRC / d).rglob("*.cpp"))
    return sorted(srcs, key=lambda p: ["generic", "avx2", "avx512"].index(isa_of(p)))


def compile_flags(source: Path):
    return TORCH_FREE_FLAGS + ISA_FLAGS.get(isa_of(source), []) + ["-I", str(CSRC)]


def _ninja_escape(text: str) -> str:
    return text.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def run_ninja(build_dir: Path) -> None:
    """Runs ninja in build_dir: one status line that updates in place on a terminal, not every command.

    Jobs: MAX_JOBS when set (as torch's builds read it), else ninja's default. A failed
    compile prints its command and the compiler's output.
    """
    jobs = ["-j", os.environ["MAX_JOBS"]] if os.environ.get("MAX_JOBS") else []
    sys.stdout.flush()
    if subprocess.run(["ninja", *jobs], cwd=build_dir).returncode != 0:
        raise SystemExit(f"torch_ktmoe: the build in {build_dir} failed (see above)")


def build_torch_free_objects(build_dir: Path):
    """Compiles the torch-free sources with ninja (build_dir/build.ninja); returns the objects in link order.

    Ninja rebuilds an object when its source, a header it includes (the compiler's depfile) or
    its command line changed. As before ninja, warnings stay out of the build's output (GCC 12
    warns hundreds of times inside its own AVX-512 intrinsics headers): each object's compiler
    output is kept in OBJ.log, and printed when the compile fails.
    """
    cxx = os.environ.get("CXX", "g++")
    lines = ["ninja_required_version = 1.3", f"cxx = {_ninja_escape(cxx)}", "",
             "rule cxx",  # the compiler's output goes to OBJ.log, shown when the compile fails
             "  command = $cxx -MMD -MF $out.d $flags -c $in -o $out 2> $out.log || { cat $out.log; exit 1; }",
             "  depfile = $out.d",
             "  deps = gcc",
             "  description = CXX $src", ""]
    objects = []
    for src in torch_free_sources():
        obj = build_dir / src.relative_to(CSRC).with_suffix(".o")
        objects.append(str(obj))
        lines += [f"build {_ninja_escape(str(obj))}: cxx {_ninja_escape(str(src))}",
                  "  flags = " + " ".join(shlex.quote(f) for f in compile_flags(src)).replace("$", "$$"),
                  f"  src = {_ninja_escape(str(src.relative_to(ROOT)))}"]
    build_dir.mkdir(parents=True, exist_ok=True)
    ninja_file = build_dir / "build.ninja"
    text = "\n".join(lines) + "\n"
    if not ninja_file.exists() or ninja_file.read_text() != text:
        ninja_file.write_text(text)
    run_ninja(build_dir)
    return objects


@contextlib.contextmanager
def ninja_status_line():
    """BuildExtension's ATen compile through run_ninja: its status line, not ``ninja -v``'s every command.

    torch's BuildExtension always runs ``ninja -v`` (torch.utils.cpp_extension._run_ninja_build,
    private: checked with torch 2.13.0; its signature and ``ninja -v`` have stayed the same
    for years). While this is active it runs ninja as run_ninja does, with a short description
    per compile added to torch's build.ninja. Where that private function is missing, the
    build goes on as torch runs it.
    """
    original = getattr(cpp_extension, "_run_ninja_build", None)
    if original is None:
        yield
        return

    def run_quietly(build_directory, *args, **kwargs):
        ninja_file = Path(build_directory) / "build.ninja"
        text = ninja_file.read_text()
        if "rule compile\n" in text and "  description = " not in text:
            text = text.replace("rule compile\n", "rule compile\n  description = CXX $in\n", 1)
            ninja_file.write_text(text)
        run_ninja(Path(build_directory))

    cpp_extension._run_ninja_build = run_quietly
    try:
        yield
    finally:
        cpp_extension._run_ninja_build = original


TORCH_VERSION_FILE = "_C.torch-version"  # read by torch_ktmoe/_native.py


class BuildExt(BuildExtension):
    def finalize_options(self):
        super().finalize_options()
        # never share objects between torch versions (their ATen headers differ)
        self.build_temp = str(ROOT / "build" / f"temp-torch-{torch.__version__}")

    def build_extension(self, ext):
        out = Path(self.get_ext_fullpath(ext.name))
        stamp = out.with_name(TORCH_VERSION_FILE)
        if out.exists() and (not stamp.exists() or stamp.read_text().strip() != torch.__version__):
            out.unlink()  # linked against another torch (build/lib* is shared): relink, never "up to date"
        super().build_extension(ext)
        stamp.write_text(torch.__version__ + "\n")

    def copy_extensions_to_source(self):  # --inplace: the version file travels with the module
        super().copy_extensions_to_source()
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            inplace_file, regular_file = self._get_inplace_equivalent(build_py, ext)
            self.copy_file(str(Path(regular_file).with_name(TORCH_VERSION_FILE)),
                           str(Path(inplace_file).with_name(TORCH_VERSION_FILE)))

    def build_extensions(self):
        objects = build_torch_free_objects(ROOT / "build" / "torch_free")
        headers = [str(p) for p in CSRC.rglob("*.h")]
        for ext in self.extensions:
            ext.extra_objects = objects + list(ext.extra_objects or [])
            ext.depends = list(ext.depends or []) + objects + headers  # relink when any changed
        with ninja_status_line():
            super().build_extensions()


aten_sources = [str(p.relative_to(ROOT)) for p in [CSRC / "bindings.cpp", *sorted((CSRC / "ops").glob("*.cpp"))]]

setup(
    ext_modules=[
        CppExtension(
            "torch_ktmoe._C",
            aten_sources,
            include_dirs=[str(CSRC)],
            extra_compile_args={"cxx": ["-O3", "-fopenmp"]},
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExt.with_options(use_ninja=True)},
)
