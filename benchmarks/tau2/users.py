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

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from envace_gym.types import Message, Trajectory

__all__ = [
    "UserSimulator",
    "ScriptedUser",
    "ModelUser",
    "STOP_SIGNALS",
    "FIRST_AGENT_MESSAGE",
    "instructions_text",
    "opening_text",
    "ends_conversation",
    "user_system_prompt",
]

STOP_SIGNALS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
"""τ²'s user-simulator tokens that end a conversation (``tau2.user.user_simulator``)."""

FIRST_AGENT_MESSAGE = "Hi! How can I help you today?"
"""τ²'s opening agent message (``tau2.orchestrator.orchestrator.DEFAULT_FIRST_AGENT_MESSAGE``): the simulated
user's first message answers it."""


@runtime_checkable
class UserSimulator(Protocol):
    """`envace_gym.suites.UserTurns` for one τ² task: ``opening()`` and ``reply(trajectory)``."""

    def opening(self) -> list[Message]: ...

    def reply(self, trajectory: Trajectory) -> list[Message] | None: ...


def ends_conversation(text: str) -> bool:
    """Whether a user message ends the conversation (it contains one of `STOP_SIGNALS`)."""
    return any(signal in text for signal in STOP_SIGNALS)


def instructions_text(scenario: dict[str, Any]) -> str:
    """The τ² user instructions as one text (``reason_for_call``, ``known_info``, ``unknown_info``,
    ``task_instructions``, each under its name; a plain-string instruction as it is)."""
    instructions: Any = scenario.get("instructions")  # a string, or a mapping of its parts
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
    instructions: Any = scenario.get("instructions")  # a string, or a mapping of its parts
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


def user_system_prompt(scenario: dict[str, Any]) -> str:
    """τ²'s user-simulator system prompt: the package's global simulation guidelines
    (``data/tau2/user_simulator/simulation_guidelines.md``) and the task's instructions in ``<scenario>``
    tags, as ``tau2.user.user_simulator.SYSTEM_PROMPT`` lays them out."""
    from tau2.utils.utils import DATA_DIR

    guidelines = (DATA_DIR / "tau2" / "user_simulator" / "simulation_guidelines.md").read_text().strip()
    return f"{guidelines}\n\n<scenario>\n{instructions_text(scenario)}\n</scenario>"


class ModelUser:
    """A language model plays the user (τ²'s user simulator, with a local model).

    The model sees τ²'s user system prompt (`user_system_prompt`) and the conversation with the roles
    flipped, as τ²'s simulator does: the agent's text messages (and `FIRST_AGENT_MESSAGE` first) as
    ``user`` messages, its own earlier messages as ``assistant`` messages; tool calls and tool results are
    not shown to it. Its first message answers the greeting. A message with one of `STOP_SIGNALS` ends the
    conversation; after ``max_turns`` messages without one it gives up (``gave_up``: the env truncates the
    episode, R = 0, as τ² scores a simulation that hit its step limit).

    Args:
        scenario: the τ² task's ``user_scenario`` dict.
        generate: ``(messages, seed) -> str``: the model's reply to the chat (`envace_gym.types.Message` list,
            system first), sampled with `seed` (e.g. `agents.users.policy_user_generator`).
        seed: seeds reply k with ``seed + k``, so a conversation's user is reproducible.
        max_turns: messages the user may write, the opening included.

    Raises:
        ValueError: ``max_turns < 1``.
    """

    def __init__(
        self,
        scenario: dict[str, Any],
        generate: Callable[[Sequence[Message], int], str],
        seed: int = 0,
        max_turns: int = 10,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.system = user_system_prompt(scenario)
        self.generate = generate
        self.seed = seed
        self.max_turns = max_turns
        self.said = 0
        self.gave_up = False

    def _say(self, conversation: list[Message]) -> str:
        text = self.generate([Message("system", self.system), *conversation], self.seed + self.said).strip()
        self.said += 1
        return text

    def opening(self) -> list[Message]:
        text = self._say([Message("user", FIRST_AGENT_MESSAGE)])
        return [Message("user", text or "Hello.")]

    def reply(self, trajectory: Trajectory) -> list[Message] | None:
        if self.said >= self.max_turns:
            self.gave_up = True
            return None
        flipped = [Message("user", FIRST_AGENT_MESSAGE)]
        for m in trajectory.messages:
            if m.role == "user":
                flipped.append(Message("assistant", m.content))
            elif m.role == "assistant" and not m.tool_calls and m.content.strip():
                flipped.append(Message("user", m.content))
        text = self._say(flipped)
        return None if ends_conversation(text) else [Message("user", text)]
