"""The user side of a τ² conversation: the `UserSimulator` interface and a scripted user.

τ² conversations need a user who knows the task's instructions (``user_scenario``) and answers the agent.
A user simulator is an `envace_gym.suites.UserTurns` (``opening()`` for the first user turn, ``reply(trajectory)``
after the agent closes each turn, None to end the conversation) built per episode for one τ² task. Its
messages are PROMPT tokens for the policy: the env renders them as user turns and no user token is trained.

τ²'s user simulator ends the conversation by writing one of `STOP_SIGNALS` (``###STOP###`` when the task
is done, ``###TRANSFER###`` after a transfer to a human, ``###OUT-OF-SCOPE###``): a reply containing one
ends the episode (``reply`` returns None), which the suite's verifier scores as τ²'s ``USER_STOP``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from envace_gym.types import Message, Trajectory

__all__ = ["UserSimulator", "ScriptedUser", "STOP_SIGNALS", "instructions_text", "opening_text", "ends_conversation"]

STOP_SIGNALS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
"""τ²'s user-simulator tokens that end a conversation (``tau2.user.user_simulator``)."""


@runtime_checkable
class UserSimulator(Protocol):
    """`envace_gym.suites.UserTurns` for one τ² task: ``opening()`` and ``reply(trajectory)``."""

    def opening(self) -> list[Message]:
        ...

    def reply(self, trajectory: Trajectory) -> list[Message] | None:
        ...


def ends_conversation(text: str) -> bool:
    """Whether a user message ends the conversation (it contains one of `STOP_SIGNALS`)."""
    return any(signal in text for signal in STOP_SIGNALS)


def instructions_text(scenario: dict[str, Any]) -> str:
    """The τ² user instructions as one text (``reason_for_call``, ``known_info``, ``unknown_info``,
    ``task_instructions``, each under its name; a plain-string instruction as it is)."""
    instructions = scenario.get("instructions")
    if isinstance(instructions, str):
        return instructions
    parts = []
    for key in ("reason_for_call", "known_info", "unknown_info", "task_instructions"):
        if instructions.get(key):
            parts.append(f"{key.replace('_', ' ').capitalize()}: {instructions[key].strip()}")
    return "\n".join(parts)


def opening_text(scenario: dict[str, Any]) -> str:
    """A first user message made from the instructions without a model: the reason for calling and what
    the user knows (a plain-string instruction as it is). The scripted user and the SFT demonstrations open
    with it."""
    instructions = scenario.get("instructions")
    if isinstance(instructions, str):
        return instructions.strip()
    parts = [instructions.get("reason_for_call"), instructions.get("known_info")]
    return " ".join(" ".join(p.split()) for p in parts if p)


class ScriptedUser:
    """A user without a model: opens with `opening_text`, then says each of `replies` in turn after the
    agent closes a turn, then ends the conversation.

    Args:
        scenario: the τ² task's ``user_scenario`` (a dict, as `tau2.data_model.tasks.UserScenario.model_dump`).
        replies: the texts of the later user turns; a reply with a stop signal ends the conversation.
    """

    def __init__(self, scenario: dict[str, Any], replies: list[str] | None = None) -> None:
        self.scenario = scenario
        self.replies = list(replies or [])
        self.said = 0

    def opening(self) -> list[Message]:
        return [Message("user", opening_text(self.scenario))]

    def reply(self, trajectory: Trajectory) -> list[Message] | None:
        if self.said >= len(self.replies):
            return None
        text = self.replies[self.said]
        self.said += 1
        return None if ends_conversation(text) else [Message("user", text)]
