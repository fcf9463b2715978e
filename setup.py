"""Build of torch_ktmoe._C.

Two kinds of sources:
* torch-free sources (csrc/common, csrc/arena, csrc/kernels/**) are compiled here
  with g++, each with the flags of its ISA directory only: csrc/kernels/avx2/*
  get AVX2 flags, csrc/kernels/avx512/* AVX-512 flags, everything else none, so
  the extension imports on any x86-64 CPU and picks kernels at run time;
* ATen glue (csrc/*.cpp: the op registrations and the Python module; csrc/ops/*) is compiled by torch's
  BuildExtension (ninja) and linked with the objects above.
Objects are rebuilt only when a source or a header it includes changed.

Each torch version gets its own directory for the ATen objects
(build/temp-torch-<version>), so a build against another torch (e.g. sglang's,
`make test-sglang`) never links objects compiled against this one; the torch-free
objects (build/torch_free) include no torch header and are shared. The torch version
is written next to the built module (torch_ktmoe/_C.torch-version);
torch_ktmoe/_native.py compares it with the running torch before importing it.
"""
import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import setup
import torch
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


def _stale(obj: Path, dep: Path) -> bool:
    if not obj.exists() or not dep.exists():
        return True
    deps = dep.read_text().replace("\\\n", " ").split(":", 1)[-1].split()
    t = obj.stat().st_mtime
    return any(not Path(d).exists() or Path(d).stat().st_mtime > t for d in deps)


def build_torch_free_objects(build_dir: Path, jobs: int = 2):
    cxx = os.environ.get("CXX", "g++")
    objects, todo = [], []
    for src in torch_free_sources():
        obj = build_dir / src.relative_to(CSRC).with_suffix(".o")
        dep = obj.with_suffix(".d")
        objects.append(str(obj))
        if _stale(obj, dep):
            obj.parent.mkdir(parents=True, exist_ok=True)
            todo.append([cxx, *compile_flags(src), "-MMD", "-MF", str(dep), "-c", str(src), "-o", str(obj)])

    def run(cmd):
        print(" ".join(shlex.quote(c) for c in cmd), flush=True)
        return subprocess.run(cmd, capture_output=True, text=True)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for cmd, res in zip(todo, pool.map(run, todo)):
            if res.returncode != 0:
                sys.stderr.write(res.stdout + res.stderr)
                raise SystemExit(f"torch_ktmoe: compiling {cmd[-3]} failed")
    return objects


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
        objects = build_torch_free_objects(ROOT / "build" / "torch_free", jobs=os.cpu_count() or 2)
        headers = [str(p) for p in CSRC.rglob("*.h")]
        for ext in self.extensions:
            ext.extra_objects = objects + list(ext.extra_objects or [])
            ext.depends = list(ext.depends or []) + objects + headers  # relink when any changed
        super().build_extensions()


aten_sources = [str(p.relative_to(ROOT)) for p in [*sorted(CSRC.glob("*.cpp")), *sorted((CSRC / "ops").glob("*.cpp"))]]

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
