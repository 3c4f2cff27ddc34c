"""`agents/__init__.py`: the public names resolve to their modules' objects, lazily (``import agents`` stays cheap),
and the list type checkers read agrees with the one used at run time."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import agents

INIT = Path(agents.__file__)


def test_every_public_name_is_its_modules_object():
    assert sorted(agents.__all__) == sorted(agents.PUBLIC)
    for name, module in agents.PUBLIC.items():
        assert getattr(agents, name) is getattr(importlib.import_module(module), name), name
    assert set(agents.__all__) <= set(dir(agents))


def test_an_unknown_name_is_an_attribute_error():
    try:
        agents.no_such_name  # noqa: B018
    except AttributeError as err:
        assert "no_such_name" in str(err)
    else:
        raise AssertionError("agents.no_such_name resolved")


def test_the_type_checking_imports_are_the_public_names():
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    imported = {a.name: node.module for node in block.body if isinstance(node, ast.ImportFrom) for a in node.names}
    assert imported == agents.PUBLIC


def test_importing_agents_loads_neither_torch_nor_transformers():
    code = "import sys, agents; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=INIT.parents[1])
    assert out.stdout.strip() == "[]"
