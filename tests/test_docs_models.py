"""docs/models.md is what docs/gen_models.py prints for the installed transformers (it is generated, never edited)."""
import importlib.util
import os

import pytest

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_docs_models_is_current():
    spec = importlib.util.spec_from_file_location("gen_models", os.path.join(ROOT, "docs", "gen_models.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    with open(os.path.join(ROOT, "docs", "models.md")) as f:
        kept = f.read()
    assert kept == gen.render(), "docs/models.md is stale: run `python docs/gen_models.py > docs/models.md`"
