"""Benchmarks never run under pytest, so their imports are checked here: every project module
(torch_ktmoe, ktmoe_harness, benchmarks) that a benchmark or harness file imports, at any depth
(imports inside functions included), must exist and hold the names taken from it. The programs a
benchmark runs in a child process (module-level strings of Python source) must compile, and their
project imports resolve the same way."""
import ast
import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
OURS = ("torch_ktmoe", "ktmoe_harness", "benchmarks")
FILES = sorted([*ROOT.glob("benchmarks/**/*.py"), *ROOT.glob("ktmoe_harness/**/*.py")])


def _project_imports(path: pathlib.Path, source: str = None):
    """(module, name or None, line) for every import of a project module in the file (or in `source`, a
    program the file holds: relative imports resolve against the file's package)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS:
                    yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: resolve against the file's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            if module.split(".")[0] in OURS:
                for alias in node.names:
                    yield module, alias.name, node.lineno


def _child_programs(path: pathlib.Path):
    """(name, source) of each module-level string of the file's module that is a Python program (a line that
    starts with import or from ... import)."""
    module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    for name, value in vars(module).items():
        if isinstance(value, str) and re.search(r"^(import \S|from \S+ import )", value, re.M):
            yield name, value


def _check_imports(path: pathlib.Path, source: str = None):
    for module, name, line in _project_imports(path, source):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            pytest.fail(f"{path.name}:{line}: imports {module}, which does not exist ({e})")
        if name is not None and name != "*" and not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")  # a submodule
            except ModuleNotFoundError:
                pytest.fail(f"{path.name}:{line}: from {module} import {name}: no such name")


@pytest.mark.parametrize("path", FILES, ids=[str(f.relative_to(ROOT)) for f in FILES])
def test_project_imports_resolve(path):
    _check_imports(path)


def test_child_programs_compile():
    programs = [(path, name, source) for path in FILES for name, source in _child_programs(path)]
    assert any(name == "CHILD" for _, name, _ in programs)  # the search finds them
    for path, name, source in programs:
        try:
            compile(source, f"{path.name}:{name}", "exec")
        except SyntaxError as e:
            pytest.fail(f"{path.name}: the child program {name} does not compile: {e}")
        _check_imports(path, source)
