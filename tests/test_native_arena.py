"""Builds and runs the torch-free native tests of csrc/arena (tests/native_arena/main.cpp): anonymous and
file-backed allocation, commit then reopen of a kept file, refusals, the prefaulter. Linked with
csrc/arena and csrc/common only (no kernels, no torch); it works in a scratch directory on the same
filesystem as pytest's tmp_path."""
from native_build import CSRC, ROOT, torch_free_sources
from tests.helpers.native_program import build_native_program, run_native_program


def test_native_arena(tmp_path):
    sources = [s for s in torch_free_sources() if s.is_relative_to(CSRC / "arena") or s.is_relative_to(CSRC / "common")]
    binary = build_native_program("native_arena_tests", sources + sorted((ROOT / "tests" / "native_arena").glob("*.cpp")),
                                  "test_arena")
    run_native_program([binary, str(tmp_path)], timeout=120)
