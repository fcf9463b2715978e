"""The package's surface: ``import torch_ktmoe`` stays light, ``hf`` comes on demand, the demo dispatches,
and nothing in the package imports the harness (data flows down); compile caches are keyed by the ops' schemas."""
import ast
import pathlib
import re

from ktmoe_harness.child import run_python

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "torch_ktmoe"


def test_import_does_not_pull_transformers_and_hf_is_a_lazy_attribute():
    res = run_python("""
import sys
import torch_ktmoe
assert "transformers" not in sys.modules, "import torch_ktmoe imported transformers"
assert "hf" in dir(torch_ktmoe)
from_pretrained = torch_ktmoe.hf.from_pretrained  # PEP 562 __getattr__ imports it here
assert sys.modules["torch_ktmoe.hf"] is torch_ktmoe.hf
print("OK")
""", timeout=120)
    assert res.returncode == 0 and "OK" in res.stdout, res.stdout + res.stderr


def test_cli_demo_hands_its_flags_to_the_harness_demo():
    res = run_python("import runpy, sys; sys.argv = ['torch_ktmoe', 'demo', '--help']; "
                     "runpy.run_module('torch_ktmoe', run_name='__main__')", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "python -m torch_ktmoe demo" in res.stdout and "--layers" in res.stdout


def test_the_package_never_imports_the_harness():
    upward = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            upward += [f"{path.relative_to(PACKAGE)}:{node.lineno}" for n in names if n.split(".")[0] == "ktmoe_harness"]
    assert not upward, f"torch_ktmoe imports ktmoe_harness at {upward}"


def test_compile_caches_are_keyed_by_the_ops_schemas():
    """Inductor's FX graph cache does not key on a C++ op's schema: code compiled against another build (another
    moe_forward signature) was loaded from /tmp/torchinductor_* and failed. Importing the library tags the key
    with a hash of the ktmoe schemas, after the user's own tag."""
    r = run_python("import torch, torch_ktmoe; from torch_ktmoe import ops; print(torch.compiler.config.cache_key_tag); "
                   "ops._tag_compile_caches(); print(torch.compiler.config.cache_key_tag)", timeout=120,
                   env={"TORCH_COMPILE_CACHE_KEY_TAG": "mine"})
    assert r.returncode == 0, r.stderr
    first, again = r.stdout.split()
    assert first == again and re.fullmatch(r"mine\|ktmoe:[0-9a-f]{16}", first), r.stdout


def test_pyproject_installs_every_subpackage():
    """A non-editable install (the sglang venv's `pip install .`) ships only the packages pyproject lists: each
    directory of torch_ktmoe with an __init__.py must be one of them."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    present = {".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("__init__.py")
               if "__pycache__" not in p.parts}
    assert present <= listed, f"pyproject.toml's [tool.setuptools] packages lacks {sorted(present - listed)}"
