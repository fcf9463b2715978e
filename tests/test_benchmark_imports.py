"""Benchmarks never run under pytest, so their imports are checked here: every project module
(torch_ktmoe, ktmoe_harness, benchmarks) that a benchmark or harness file imports, at any depth
(imports inside functions included), must exist and hold the names taken from it, and every attribute read
off an imported project module (``packed_dir.EXPERTS_DIR``) must exist in it. The programs a
benchmark runs in a child process (module-level strings of Python source) must compile, and their
project imports resolve the same way."""
import ast
import importlib
import pathlib
import re
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
OURS = ("torch_ktmoe", "ktmoe_harness", "benchmarks")
FILES = sorted([*ROOT.glob("benchmarks/**/*.py"), *ROOT.glob("ktmoe_harness/**/*.py")])


def _project_imports(path: pathlib.Path, source: str = None):
    """(module, name or None, line, bound) for every import of a project module in the file (or in `source`,
    a program the file holds: relative imports resolve against the file's package); `bound` is the name the
    import binds where it names a module by it (import x.y as z, from x import y), else None."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS:
                    yield alias.name, None, node.lineno, alias.asname
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: resolve against the file's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            if module.split(".")[0] in OURS:
                for alias in node.names:
                    yield module, alias.name, node.lineno, alias.asname or alias.name


def _child_programs(path: pathlib.Path):
    """(name, source) of each module-level string of the file's module that is a Python program (a line that
    starts with import or from ... import)."""
    module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    for name, value in vars(module).items():
        if isinstance(value, str) and re.search(r"^(import \S|from \S+ import )", value, re.M):
            yield name, value


def _as_module(dotted: str):
    """The module `dotted` names, or None (a name inside a module, not a module)."""
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError:
        parent, _, name = dotted.rpartition(".")
        value = getattr(importlib.import_module(parent), name, None) if parent else None
        return value if isinstance(value, types.ModuleType) else None


def _check_imports(path: pathlib.Path, source: str = None):
    modules = {}  # names bound to project modules -> the module
    for module, name, line, bound in _project_imports(path, source):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            pytest.fail(f"{path.name}:{line}: imports {module}, which does not exist ({e})")
        if name is not None and name != "*" and not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")  # a submodule
            except ModuleNotFoundError:
                pytest.fail(f"{path.name}:{line}: from {module} import {name}: no such name")
        if bound is not None:
            found = _as_module(module if name is None else f"{module}.{name}")
            if found is not None:
                modules[bound] = found
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, str(path))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            if not hasattr(modules[node.value.id], node.attr):
                pytest.fail(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}: "
                            f"{modules[node.value.id].__name__} has no {node.attr}")


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
