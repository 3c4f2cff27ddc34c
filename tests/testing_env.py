"""A scripted stub suite shared by the env and wrapper tests (Gymnasium's `tests/testing_env.py` habit).

`ScriptedSuite` has a few hand-made tasks over two deterministic tools (``add`` keeps a running total,
``echo`` returns its text) and a verifier that replays the ACT calls on a fresh backend and checks the
final state and that each turn made its expected calls. Registered as suite ``"scripted"``.
"""

from __future__ import annotations

import json

from envace_gym.suites import VerifierResult, register_suite
from envace_gym.types import Message, Task, ToolCall, ToolSpec

ADD = ToolSpec(
    "add",
    "Add an integer to the running total and return the new total.",
    {"type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"]},
)
ECHO = ToolSpec(
    "echo",
    "Return the given text.",
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)


class ScriptedBackend:
    """Deterministic two-tool backend: ``add(value)`` accumulates, ``echo(text)`` returns text."""

    def __init__(self, start: int = 0) -> None:
        self.total = start
        self.log: list[str] = []

    def execute(self, call: ToolCall) -> str:
        if call.name == "add":
            value = call.arguments.get("value")
            if not isinstance(value, int) or isinstance(value, bool):
                return json.dumps({"error": f"value must be an integer, got {value!r}"})
            self.total += value
            self.log.append(f"add {value}")
            return json.dumps({"total": self.total})
        if call.name == "echo":
            self.log.append("echo")
            return json.dumps({"text": str(call.arguments.get("text", ""))})
        return json.dumps({"error": f"unknown tool {call.name!r}"})

    def snapshot(self) -> bytes:
        return json.dumps({"total": self.total, "log": self.log}).encode()


REFERENCE: dict[str, list[list[ToolCall]]] = {}
"""A reference solution per task id (what `ScriptedSuite.ground_truth` returns)."""


def _task(i: int, turns: list[str], target: int, reference: list[list[ToolCall]]) -> Task:
    REFERENCE[f"scripted_{i}"] = reference
    return Task(
        id=f"scripted_{i}",
        suite="scripted",
        turns=[[Message("user", t)] for t in turns],
        tools=[ADD, ECHO],
        verifier="scripted.total",
        metadata={"target_total": target, "start": 0},
    )


def _add(value: int) -> ToolCall:
    return ToolCall("add", {"value": value})


TASKS = [
    _task(0, ["Add 2 to the total."], 2, [[_add(2)]]),
    _task(1, ["Add 3 to the total.", "Now add 4."], 7, [[_add(3)], [_add(4)]]),
    _task(2, ["Echo 'hi'.", "Add 5.", "Add -1."], 4, [[ToolCall("echo", {"text": "hi"})], [_add(5)], [_add(-1)]]),
]


class ScriptedSuite:
    """The stub suite; `verify` replays the calls and compares the final total to the task's target."""

    name = "scripted"

    def tasks(self, categories=None, split="train"):
        return list(TASKS)

    def make_backend(self, task: Task) -> ScriptedBackend:
        return ScriptedBackend(task.metadata.get("start", 0))

    def ground_truth(self, task: Task) -> list[list[ToolCall]] | None:
        return REFERENCE.get(task.id)

    def verify(self, trajectory, backend=None) -> VerifierResult:
        task, calls_per_turn = trajectory.task, trajectory.calls_per_turn()
        backend = self.make_backend(task)
        for turn in calls_per_turn:
            for step in turn:
                for call in step:
                    backend.execute(call)
        ok = len(calls_per_turn) == task.num_turns and backend.total == task.metadata["target_total"]
        return VerifierResult(reward=1.0 if ok else 0.0, valid=ok, details={"total": backend.total})


register_suite("scripted", ScriptedSuite)


class LengthRewardSuite(ScriptedSuite):
    """The scripted tasks with a shaped reward that varies across random samples, so trainer tests see
    non-zero advantages: R = (total characters of the final responses mod 11) / 10, like the shared TRL
    benchmark's length term. Registered as suite ``"scripted-length"``."""

    name = "scripted-length"

    def verify(self, trajectory, backend=None) -> VerifierResult:
        chars = sum(len(r) for r in trajectory.final_responses())
        reward = (chars % 11) / 10
        return VerifierResult(reward=reward, valid=True, details={"chars": chars})


register_suite("scripted-length", LengthRewardSuite)


class AddUntilUser:
    """A simulated user (`envace_gym.suites.UserTurns`): asks to add 1 until the agent has closed
    ``rounds`` turns, then ends the conversation; its replies depend on the history, not on fixed turns."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def opening(self) -> list[Message]:  # not the task's fixed first turn: the env must record this one
        return [Message("user", "Please add 1 to the total.")]

    def reply(self, trajectory) -> list[Message] | None:
        closed = len(trajectory.final_responses())
        return [Message("user", f"Add 1 again ({closed} done).")] if closed < self.rounds else None


class SimulatedUserSuite(ScriptedSuite):
    """One task played with `AddUntilUser` (3 rounds). The verifier reads the episode's real backend in its
    final state when there is one (total must be 3) and replays the calls otherwise (a rehearsed episode).
    Registered as suite ``"scripted-user"``."""

    name = "scripted-user"
    TASK = Task(
        id="user_0",
        suite="scripted-user",
        turns=[[Message("user", "Add 1 to the total.")]],
        tools=[ADD, ECHO],
        verifier="scripted.user",
        metadata={"start": 0, "rounds": 3},
    )

    def tasks(self, categories=None, split="train"):
        return [self.TASK]

    def user(self, task: Task) -> AddUntilUser:
        return AddUntilUser(task.metadata["rounds"])

    def ground_truth(self, task: Task) -> list[list[ToolCall]] | None:
        return [[_add(1)] for _ in range(task.metadata["rounds"])]

    def verify(self, trajectory, backend=None) -> VerifierResult:
        if backend is None:
            backend = self.make_backend(trajectory.task)
            for call in (c for turn in trajectory.calls_per_turn() for step in turn for c in step):
                backend.execute(call)
        ok = backend.total == trajectory.task.metadata["rounds"]
        return VerifierResult(reward=1.0 if ok else 0.0, valid=ok, details={"total": backend.total})


register_suite("scripted-user", SimulatedUserSuite)
