"""The package's import layering, read from its import statements (an AST walk over every file, imports inside
functions included; a check of ``sys.modules`` after an import misses those):

* the core (``torch_ktmoe/*.py``, the residency subsystem among it) imports no wing, no ``checkpoint/`` and no
  command line, nor transformers or sglang;
* ``checkpoint/`` imports the core only: no wing, no command line, nor transformers or sglang;
* a wing (``hf/``, ``sglang/``) imports the core and ``checkpoint/``, never another wing or the command line
  (``sglang/`` never transformers);
* the command line (``cli/``, ``__main__.py``) is the application over all of them;
* the residency subsystem (reading ahead: the ``residency/`` package) is core and imports no ``layer``;
* no two modules import each other, directly or around a circle (imports inside functions included).
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


def _module_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a name resolved to the longest module it names; a package's
    ``__init__`` is its own node, and importing a submodule is not counted as importing its package)."""
    files = {".".join(_module_of(p)): p for p in PACKAGE.rglob("*.py")}
    native = {"torch_ktmoe._C"}  # the extension: a leaf
    graph = {}
    for name, path in files.items():
        targets = set()
        for _, imported in imports(path):
            parts = imported.split(".")
            while parts and ".".join(parts) not in files and ".".join(parts) not in native:
                parts.pop()
            if parts and ".".join(parts) != name:
                targets.add(".".join(parts))
        graph[name] = targets
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_no_import_circles():
    assert import_circles(_module_graph()) == []


def test_the_circle_finder_finds_a_circle():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []
