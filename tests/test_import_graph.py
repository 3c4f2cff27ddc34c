"""The product packages import each other without cycles, and in one direction (docs/design.md §2):
`envace_gym` imports none of the others, `wrappers` and `benchmarks` only `envace_gym`. Every import
statement counts, those inside functions included: a cycle hidden in a function is still a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("envace_gym", "wrappers", "agents", "benchmarks")
# Scripts (speed benchmarks, experiment protocols, the results page) drive everything, like a user's script would;
# no package module imports them.
SCRIPTS = ("benchmarks.perf", "benchmarks.experiments", "benchmarks.results")


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the product modules it imports (``from package import submodule`` is an edge to the submodule)."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in mods:
                subs = {f"{node.module}.{a.name}" for a in node.names} & mods.keys()
                names = {a.name for a in node.names if f"{node.module}.{a.name}" not in mods}
                graph[name] |= subs | ({node.module} if names else set())
        graph[name].discard(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_product_packages():
    assert cycles(import_graph()) == []


def test_no_package_module_imports_a_script():
    users = [
        f"{m} imports {t}"
        for m, ts in import_graph().items()
        if not m.startswith(SCRIPTS)
        for t in ts
        if t.startswith(SCRIPTS)
    ]
    assert users == []


def runnable(path: Path) -> bool:
    """Whether the module runs as a script (``python -m ...``): it has an ``if __name__ == "__main__":`` block."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)


def test_no_script_imports_another_script():
    """Scripts share code only through modules that are not scripts themselves (`benchmarks.stats`,
    `benchmarks.perf.scripted_rollouts`, ...), so each script can change without breaking another."""
    mods = modules()
    scripts = {m for m, path in mods.items() if m.startswith(SCRIPTS) and runnable(path)}
    assert {"benchmarks.perf.rollout_tokens", "benchmarks.experiments.lab_ablations", "benchmarks.results"} <= scripts
    users = [f"{m} imports {t}" for m, ts in import_graph().items() if m in scripts for t in ts if t in scripts]
    assert users == []


def test_no_module_touches_sys_path():
    """Every script runs as ``python -m benchmarks.<folder>.<script>`` from the repository root, so no module puts
    a folder on ``sys.path`` (one that did would import a second copy of whatever that folder holds)."""
    found = [
        f"{name}:{node.lineno}"
        for name, path in modules().items()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and ast.unparse(node.func.value) == "sys.path"
        and node.func.attr in ("insert", "append", "extend")
    ]
    assert found == []


def test_imports_go_one_way():
    allowed = {
        "envace_gym": {"envace_gym"},
        "wrappers": {"envace_gym", "wrappers"},
        "benchmarks": {"envace_gym", "benchmarks"},
        "agents": set(PACKAGES),
    }
    wrong = [
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        if not module.startswith(SCRIPTS)
        for target in targets
        if target.split(".")[0] not in allowed[module.split(".")[0]]
    ]
    assert wrong == []
