"""The torch-free native test programs (tests/native/, tests/native_arena/): build one with
native_build.ninja_build (the extension's own flags table and driver) into build/<name>, so a
rerun compiles only what changed, and run it: one line per check, the last "N passed, M failed"."""
import shutil
import subprocess

import pytest

from native_build import ROOT, NinjaBuildError, ninja_build


def build_native_program(name: str, sources, executable: str) -> str:
    """The path of ``executable`` built from ``sources`` in build/<name> (skips without g++ or ninja)."""
    for tool in ("g++", "ninja"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not found: the native tests need it")
    build_dir = ROOT / "build" / name
    try:
        ninja_build(build_dir, sources, executable=executable, link_flags=["-pthread"], capture=True)
    except NinjaBuildError as exc:
        pytest.fail(f"building the native tests failed: {exc}")
    return str(build_dir / executable)


def run_native_program(argv, timeout: int = 300) -> None:
    """Runs a native test program; fails with its FAIL lines unless it ends in " 0 failed". SKIP lines are
    printed (shown with -rA / -s)."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    output = r.stdout + r.stderr
    lines = output.strip().splitlines()
    failures = "\n".join(line for line in lines if line.startswith("FAIL"))
    assert r.returncode == 0 and lines and lines[-1].endswith(" 0 failed"), (
        f"native tests failed (exit {r.returncode}):\n{failures}\n\n--- full output ---\n{output}")
    for line in lines:
        if line.startswith("SKIP"):
            print(line)
