"""Limits on one tool-backend call: a wall-clock limit, argument bounds, and process-wide numeric state restored.

A backend runs model-chosen arguments through real code. Some arguments make a call run for hours or fill
memory (BFCL's ``power(base=10, exponent=100000000)``, ``square_root(number=2, precision=100000000)``), and
some calls change process-wide state (``decimal.getcontext().prec``, ``mpmath.mp.dps``) that every later
computation in the process inherits. `run_limited` runs one call under a `CallLimits`:

1. ``seconds``: a wall-clock limit, enforced with ``SIGALRM`` (``signal.setitimer``) when the call runs on
   the main thread of the main interpreter (elsewhere the limit cannot interrupt, and only the bounds
   apply). The alarm interrupts Python code; a single C-level operation (a huge ``Decimal.sqrt``) finishes
   first, which is why suites also bound the arguments that drive such operations (``max_precision`` and
   ``max_result_digits`` below, checked by the suite's backend before the call).
2. ``max_precision``: the largest ``precision``-like argument (decimal digits) a backend accepts.
3. ``max_result_digits``: the largest integer result (in decimal digits) an exponentiation may produce.
4. The ``decimal`` context and ``mpmath.mp`` precision are saved before and restored after every call.

A call over a limit raises `CallLimitExceeded`, which backends turn into an error observation (the env and
the verifier replay see the same error, since both run calls through the same backend code).
"""

from __future__ import annotations

import decimal
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

__all__ = ["CallLimits", "CallLimitExceeded", "run_limited", "DEFAULT_LIMITS"]

T = TypeVar("T")


@dataclass(frozen=True)
class CallLimits:
    """Per-call limits of a tool backend (see the module docstring).

    Attributes:
        seconds: wall-clock limit per call, > 0 (default 5.0 s; a BFCL call takes microseconds to milliseconds).
        max_precision: the largest precision argument in decimal digits (default 10,000).
        max_result_digits: the largest integer power result in decimal digits (default 100,000).
    """

    seconds: float = 5.0
    max_precision: int = 10_000
    max_result_digits: int = 100_000

    def __post_init__(self) -> None:
        if not self.seconds > 0 or self.max_precision < 1 or self.max_result_digits < 1:
            raise ValueError(f"CallLimits need seconds > 0 and max_precision, max_result_digits >= 1, got {self}")


DEFAULT_LIMITS = CallLimits()


class CallLimitExceeded(RuntimeError):
    """A backend call went over one of its `CallLimits` (the message says which, fit to show the model)."""


def _alarm(signum: int, frame: Any) -> None:
    raise CallLimitExceeded("the call ran past its time limit")


def run_limited(fn: Callable[[], T], limits: CallLimits = DEFAULT_LIMITS) -> T:
    """``fn()`` under `limits`: the time limit (main thread only) and the numeric state restored afterwards.

    Raises:
        CallLimitExceeded: the call ran longer than ``limits.seconds``.
        Exception: whatever ``fn`` raises.
    """
    context = decimal.getcontext().copy()
    mp = sys.modules.get("mpmath")
    dps = mp.mp.dps if mp is not None else None
    timed = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    previous = None
    if timed:
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, limits.seconds)
    try:
        return fn()
    except CallLimitExceeded:
        raise CallLimitExceeded(f"the call ran past its time limit of {limits.seconds:g} s") from None
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
        decimal.setcontext(context)
        mp = sys.modules.get("mpmath")
        if mp is not None:
            mp.mp.dps = dps if dps is not None else 15
