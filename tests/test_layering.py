"""The package's import layering, read from its import statements (an AST walk over every file, imports inside
functions included; a check of ``sys.modules`` after an import misses those):

* the core (``torch_ktmoe/*.py``, the residency subsystem among it) imports no wing, no ``checkpoint/`` and no
  command line, nor transformers or sglang;
* ``checkpoint/`` imports the core only: no wing, no command line, nor transformers or sglang;
* a wing (``hf/``, ``sglang/``) imports the core and ``checkpoint/``, never another wing or the command line
  (``sglang/`` never transformers);
* the command line (``cli/``, ``__main__.py``) is the application over all of them;
* the residency subsystem (reading ahead: the ``residency/`` package) is core and imports no ``layer``.
"""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "torch_ktmoe"
WINGS = ("hf", "sglang")


def _module_of(path: pathlib.Path) -> list[str]:
    """``torch_ktmoe/hf/patch.py`` -> ["torch_ktmoe", "hf", "patch"] (a package's ``__init__``: its own name)."""
    parts = ["torch_ktmoe", *path.relative_to(PACKAGE).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import statement in ``path``; ``from . import x`` names ``pkg.x``."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            stem = ".".join(base + ([node.module] if node.module else []))
            found += [(node.lineno, f"{stem}.{a.name}" if not node.module else stem) for a in node.names]
    return sorted(set(found))


def layer_of(path: pathlib.Path) -> str:
    rel = path.relative_to(PACKAGE).parts
    if rel[0] == "cli" or rel == ("__main__.py",):
        return "cli"
    return rel[0] if len(rel) > 1 and rel[0] != "residency" else "core"


def forbidden(layer: str, path: pathlib.Path) -> tuple[str, ...]:
    """Module prefixes ``path`` of ``layer`` must not import."""
    ours = {"core": ("torch_ktmoe.hf", "torch_ktmoe.sglang", "torch_ktmoe.cli", "torch_ktmoe.checkpoint",
                     "transformers", "sglang"),
            "checkpoint": ("torch_ktmoe.hf", "torch_ktmoe.sglang", "torch_ktmoe.cli", "transformers", "sglang"),
            "hf": ("torch_ktmoe.sglang", "torch_ktmoe.cli", "sglang"),
            "sglang": ("torch_ktmoe.hf", "torch_ktmoe.cli", "transformers"),
            "cli": ()}[layer]
    if path.relative_to(PACKAGE).parts[0] == "residency":
        ours += ("torch_ktmoe.layer",)
    return ours


def _hits(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_every_import_statement_keeps_the_layering():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        layer = layer_of(path)
        for line, name in imports(path):
            if _hits(name, forbidden(layer, path)):
                bad.append(f"{path.relative_to(PACKAGE)}:{line} ({layer}) imports {name}")
    assert not bad, "\n".join(bad)


def test_the_walk_sees_imports_inside_functions(tmp_path):
    """What the check reads: a function's relative import, resolved against the package."""
    names = [n for _, n in imports(PACKAGE / "cli" / "pack.py")]
    assert "torch_ktmoe.hf.packed_manifest" in names and "torch_ktmoe.hf" in names
    assert "torch_ktmoe.layer" not in [n for _, n in imports(PACKAGE / "residency" / "layer_reads.py")]
    assert _hits("torch_ktmoe.layer", forbidden("core", PACKAGE / "residency" / "predictor.py"))
    assert _hits("torch_ktmoe.hf.streaming", forbidden("core", PACKAGE / "layer.py"))
    assert not _hits("torch_ktmoe.hfx", ("torch_ktmoe.hf",))

