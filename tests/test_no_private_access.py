"""The packages use each other only through public names: no ``obj._name`` read or written on another
module's object (the contract is the documented API, not private state)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("envace_gym", "agents", "wrappers", "benchmarks")
# Private names of third-party objects that are used on purpose, with the reason.
ALLOWED = {
    "_exit": "os._exit ends a forked child without running the parent's exit handlers",
    "_version": "torch.Tensor._version, the in-place update counter the prefix KV cache fingerprints",
    "_forward_hooks": "torch.nn.Module's hook registry; no public call tells whether a module is hooked, and the "
    "lean decode step must not skip somebody's hook (it runs the model's own forward then)",
    "_forward_pre_hooks": "the same registry, for pre-forward hooks",
    "_np_random": "gymnasium.spaces.Space keeps its generator there, None until first used; a space copied from a "
    "shared prototype must start with its own (envace_gym.spaces)",
    "_last_lr": "torch LR schedulers keep the current rate there; restored with the scheduler state",
    "_load_scenario": "bfcl-eval's classes take a task's initial state only there (its own harness calls it)",
    "_generate_single_turn": "TRL 1.16's GRPOTrainer generates (vLLM or Transformers) only there; the TRL adapter "
    "needs TRL's own engine for every ACT message (TRL is pinned)",
}


def _defined_here(tree: ast.Module) -> set[str]:
    """Private attribute names this module defines: assigned on any object, or defs and class attributes."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def private_accesses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own = _defined_here(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in ("self", "cls"):
            continue
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
            continue
        if node.attr in own or node.attr in ALLOWED:
            continue
        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
    return found


def test_no_module_reads_or_writes_private_state_of_another():
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    assert len(files) > 40
    found = [hit for p in files for hit in private_accesses(p)]
    assert found == [], "private attributes of another module's objects:\n" + "\n".join(found)


def test_the_check_finds_a_private_access(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(env):\n    return env._turn\n")
    good = tmp_path / "good.py"
    good.write_text(
        "class A:\n    def __init__(self):\n        self._n = 0\n\n"
        "    def same(self, other):\n        return other._n\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert private_accesses(bad) == ["bad.py:2: ._turn"] and private_accesses(good) == []
    finally:
        ROOT = saved
