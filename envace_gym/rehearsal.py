"""The `Rehearser` interface: the policy's REHEARSE role seen from the environment (docs/design.md §1).

`envace_gym` holds no model code. A rehearser is anything with a ``tokenizer`` and a batched
``rehearse(requests) -> responses``; `agents.policy.PolicyRehearser` implements it with the shared policy
model. Environments name a rehearser implementation by a ``"module:factory"`` string, resolved lazily
(like a Gymnasium entry point), so importing `envace_gym` loads no model.

Two prompt modes:

* ``inline`` (default): the request carries the trajectory's token ids, ending with the template ids that
  open a tool message; the rehearsal is the model's own continuation of that sequence up to its
  end-of-message token. ACT and REHEARSE segments live in one sequence (one training row).
* ``separate`` (the reference implementation's layout): the rehearser builds a dedicated simulator prompt
  (an instruction to act as the tool, the tool schemas, the history, the call); the completion is its own
  training row, and its text becomes the tool message of the ACT history.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from envace_gym.registry import resolve_entry_point
from envace_gym.types import Message, ToolCall, ToolSpec

__all__ = [
    "PromptMode",
    "RehearseRequest",
    "RehearseResponse",
    "Rehearser",
    "register_rehearser",
    "make_rehearser",
    "requests_by_setting",
]

PromptMode = Literal["inline", "separate"]


@dataclass
class RehearseRequest:
    """One tool call to rehearse.

    Attributes:
        tools: the tool schemas visible at this point of the episode.
        messages: the chat history, ending with the assistant message that holds `call`.
        call: the tool call whose response is wanted.
        context_ids: inline mode: the trajectory's token ids so far, `(T,)` int, ending with the ids that open
            a tool message; None in separate mode.
        seed: seed of this rehearsal's sampling (drawn from the env's ``np_random``), so the same env seed
            gives the same rehearsal.
        max_new_tokens: cap on the generated tokens.
        temperature: sampling temperature; 0 means greedy.
    """

    tools: list[ToolSpec]
    messages: list[Message]
    call: ToolCall
    context_ids: list[int] | None = None
    seed: int | None = None
    max_new_tokens: int = 256
    temperature: float = 1.0


@dataclass
class RehearseResponse:
    """A rehearsed tool response.

    Attributes:
        text: the decoded response (the tool message content), without the end-of-message token.
        token_ids: the generated ids, `(C,)`, including the end-of-message token when generation stopped on it.
        logprobs: the sampling policy's logprob of each generated id, `(C,)` float.
        prompt_ids: separate mode: the simulator prompt's ids `(P,)` (its own training row); None inline.
        stopped: True when generation ended on an end-of-message token (False: hit ``max_new_tokens``).
    """

    text: str
    token_ids: list[int]
    logprobs: list[float]
    prompt_ids: list[int] | None = None
    stopped: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Rehearser(Protocol):
    """The REHEARSE role: batched generation of tool responses (see the module docstring)."""

    tokenizer: Any
    prompt_mode: PromptMode

    def rehearse(self, requests: Sequence[RehearseRequest]) -> list[RehearseResponse]:
        """Answer every request in one batched model call; the output is in request order."""
        ...


def requests_by_setting(requests: Sequence[RehearseRequest]) -> dict[tuple[int, float], list[int]]:
    """The positions of `requests` grouped by ``(max_new_tokens, temperature)``, in first-seen order: the
    requests one batched generate call can answer together."""
    groups: dict[tuple[int, float], list[int]] = {}
    for i, r in enumerate(requests):
        groups.setdefault((r.max_new_tokens, r.temperature), []).append(i)
    return groups


_REHEARSERS: dict[str, str | Callable[..., Rehearser]] = {"policy": "agents.policy:make_policy_rehearser"}


def register_rehearser(name: str, entry_point: str | Callable[..., Rehearser]) -> None:
    """Register a rehearser factory under `name` (a ``"module:attr"`` string is imported on first use)."""
    _REHEARSERS[name] = entry_point


def make_rehearser(name: str = "policy", **kwargs: Any) -> Rehearser:
    """Build the rehearser registered as `name` with `kwargs` (e.g. ``model``, ``prompt_mode``).

    Raises:
        ValueError: no rehearser has that name.
    """
    if name not in _REHEARSERS:
        raise ValueError(f"unknown rehearser {name!r}; registered: {sorted(_REHEARSERS)}")
    return resolve_entry_point(_REHEARSERS[name])(**kwargs)
