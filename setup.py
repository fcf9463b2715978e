"""Build of torch_ktmoe._C.

Two kinds of sources:
* torch-free sources (csrc/common, csrc/arena, csrc/kernels/**) are compiled by
  native_build.py (the flags table and ninja driver the native tests share): each
  with the flags of its ISA directory only, csrc/kernels/avx2/* AVX2 flags,
  csrc/kernels/avx512/* AVX-512 flags, everything else none, so the extension
  imports on any x86-64 CPU and picks kernels at run time;
* ATen glue (csrc/*.cpp: the op registrations and the Python module; csrc/ops/*) is compiled by torch's
  BuildExtension (ninja) and linked with the objects above.
Both go through ninja, which rebuilds an object only when its source, a header it
includes or its command changed. native_build.py shows one status line per object;
torch's BuildExtension runs `ninja -v` and prints each ATen compile command.

Each torch version gets its own directory for the ATen objects
(build/temp-torch-<version>), so a build against another torch (e.g. sglang's,
`make test-sglang`) never links objects compiled against this one; the torch-free
objects (build/torch_free) include no torch header and are shared. The torch version
is written next to the built module (torch_ktmoe/_C.torch-version);
torch_ktmoe/_native.py compares it with the running torch before importing it.
"""
import sys
from pathlib import Path

from setuptools import setup
import torch
from torch.utils.cpp_extension import BuildExtension, CppExtension

sys.path.insert(0, str(Path(__file__).resolve().parent))  # a PEP 517 build does not put it there
from native_build import CSRC, ROOT, NinjaBuildError, ninja_build, torch_free_sources  # noqa: E402


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
        try:
            objects = ninja_build(ROOT / "build" / "torch_free", torch_free_sources())
            headers = [str(p) for p in CSRC.rglob("*.h")]
            for ext in self.extensions:
                ext.extra_objects = objects + list(ext.extra_objects or [])
                ext.depends = list(ext.depends or []) + objects + headers  # relink when any changed
            super().build_extensions()
        except NinjaBuildError as exc:
            raise SystemExit(f"torch_ktmoe: {exc}") from None


aten_sources = [str(p.relative_to(ROOT)) for p in [*sorted(CSRC.glob("*.cpp")), *sorted((CSRC / "ops").glob("*.cpp"))]]

setup(
    ext_modules=[
        CppExtension(
            "torch_ktmoe._C",
            aten_sources,
            include_dirs=[str(CSRC)],
            # hidden: pybind11 declares its own types hidden; ours must match (no -Wattributes noise)
            extra_compile_args={"cxx": ["-O3", "-fopenmp", "-fvisibility=hidden"]},
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExt.with_options(use_ninja=True)},
)
