"""Demonstrations for supervised warm-start: real executions of a suite's reference solutions, and
recorded rollouts filtered by reward (rejection-sampling fine-tuning), as token-level `Trajectory` objects.

Both sources give trajectories in the policy's own token format (the one `envace_gym.envs.tool_use.ToolUseEnv`
builds and `agents.rollout.build_batch` trains on), relabelled so that `agents.training.sft` can train both roles:

* ACT segments: the assistant messages (tool calls and closing messages) are ACT targets.
* Real tool results (OBSERVATION segments answering a tool call) become REHEARSE targets: the world model
  learns the real dynamics. Parse-error observations (a tool message without a call id) and prompt,
  template and user-turn tokens stay untrained.

## Demonstrations from real executions (`build_demonstrations`)

For each task of a suite that gives a reference solution (``Suite.ground_truth``; BFCL: every task) a
`ToolUseEnv` answered by `envace_gym.responders.RealBackend` (`demonstration_env`: every tool call goes to
a fresh, isolated real backend of the suite, BFCL ``long_context`` backends included) is driven with text
actions, turn by turn:

1. Each reference call of the turn (BFCL: `benchmarks.bfcl.verify.ground_truth_tool_calls`, positional
   arguments bound) is one ACT message in Hermes format, ``format_tool_calls([call], "hermes")``
   (``calls_per_message="one"``, the default: every later call is conditioned on the real result of the
   previous one, as a model acting step by step would be). ``calls_per_message="all"`` puts all the turn's
   calls in one message (fewer messages, BFCL's 20-step limit never binds; the results then follow as
   consecutive tool messages).
2. The real backend's result is the tool message (recorded by the env as an OBSERVATION segment).
3. One closing assistant message without a tool call ends the user turn (the env then opens the next
   user turn; for ``miss_func`` tasks the env reveals the held-out tools in that message, as BFCL's
   harness does). The closing text is a fixed template (`closing_message`): ``"Done."`` after a turn with
   calls, and `NO_CALL_MESSAGE` after a turn whose ground truth is empty (BFCL ``miss_func`` /
   ``miss_param`` turns where the right behaviour is to not call: the function is missing or a parameter
   is unknown). BFCL scores calls and state only, so the closing text does not change the reward; it
   teaches the policy to end a turn. A suite whose reward reads the reply (a question answered in it)
   gives the reference reply itself (``Suite.reference_reply(task, turn)``), which replaces the template.

Every action is passed as a `GeneratedText` whose ids are the content ids plus the ids a model writes to
end an assistant message (`ChatRenderer.generation_end_ids`: ``<|im_end|>`` in ChatML and Qwen), so the ACT
segment ends with the stop token exactly as a generated one does (the model learns to stop); its logprobs
are None. Tool results are relabelled the same way: the closing template up to its stop token (ChatML
``<|im_end|>``; Qwen ``\n</tool_response><|im_end|>``) moves into the REHEARSE segment, as the policy
generates it when it rehearses inline. The episode's verifier reward (BFCL's state and response checks replaying the ACT
calls) must be 1.0; otherwise the demonstration is skipped and counted (`DemoStats.skipped_reward`).

## Error demonstrations (``build_demonstrations(..., mutations=k)``)

Reference solutions never fail, so a world model trained on them alone never sees an error output and
cannot foresee a mistake. With ``mutations=k`` each task whose reference solution scores 1 also gives up
to ``k`` *error demonstrations* (each capped by the same length rule as the reference one, which may drop it
alone): the same reference solution with one mistaken call played right before one
reference call, in the same `demonstration_env` (the real backend answers it). The suite proposes the
mistakes (``Suite.mutations(task, calls, rng) -> [(position, ToolCall)]``, `calls` the reference calls
flattened over the turns; the lab: a move onto a shelf that is full at that point, a ship of a label no
box has, a call naming an unknown item, the last move or ship made again); ``k`` of them are drawn with
``random.Random(f"{seed}/{task.id}")``,
which also seeds the suite's draws, so a seed gives the same demonstrations. The real backend decides what
each one is (its snapshot before and after the call):

* the output is not an error (`wrappers.fidelity.is_error_output`): not a mistake; skipped and counted
  (`DemoStats.skipped_mutation`), as is a call at which the episode ends.
* an error and the state unchanged (a wrong label, an unknown item, a repeated call): the demonstration goes on with the
  reference call it preceded and ends as the reference one does. Its verifier reward is kept, not required
  to be 1.0 (the lab's verifier gives 0: a failed call counts against an episode).
* an error and the state changed (an item broke): nothing can undo it, so the demonstration ends right after
  the error output, with no further ACT message and no closing message.

The mistaken call is one ACT message of its own (with ``calls_per_message="all"`` the turn's message is
split around it). Its ACT tokens carry no loss: the policy must not learn to make the mistake. They are
relabelled `Role.PROMPT`, the role of text the policy reads but did not write (the user turns in the
middle of a sequence are PROMPT too), so role masks, the SFT loss and stored trajectories need no new role
(OBSERVATION would say a tool wrote them, TEMPLATE the chat template). Its tool output is a real result
like any other, so `relabel_for_sft` makes it a REHEARSE target: the world model learns the error. The
task of an error demonstration is a copy whose ``metadata["mutation"]`` is ``{"position": int, "call":
OpenAI call dict, "output": str, "breaks": bool}``.

## Length cap (`cap_length`)

BFCL prompts alone are 3.5k to 7.7k tokens with the SmolLM2 tokenizer (the tool schemas are in the system
prompt). ``overflow="truncate"`` (default) keeps the first ``max_tokens`` tokens: a causal LM's targets in
a prefix are exactly the targets of the full sequence there, so a prefix is a valid (shorter)
demonstration; a demo left with no ACT token is dropped (counted). ``overflow="drop"`` drops every demo
longer than ``max_tokens``.

## Memory-conditioned demonstrations (`record_memory_demonstrations`)

A policy that rehearses at test time (`wrappers.TestTimeRehearsal`) reads a memory message it never saw in
training. A memory-conditioned demonstration is a reference execution (as above, on the real backend) in which,
before the first ACT message of every user turn, the test-time-rehearsal wrapper has run a policy's own
``n`` rehearsal attempts of that turn (failed ones kept) and inserted their memory as a user message, exactly
as at test time. The target is still the reference: the policy learns to act well after reading what its own
world model imagined, including when the imagination was wrong (or, with ``attempt_outputs="real"``, after
reading true outcomes: a diagnosis of whether reading can be learned at all). The memory is a user message, so it
carries no loss. They are written as ``RecordTrajectories(include_tokens=True)`` records, so `agents.training.sft` mixes
them with plain demonstrations through its ``data`` sources (a suite name and the JSONL file).

## Recorded rollouts (`load_recorded_trajectories`)

Reads the JSONL written by ``wrappers.RecordTrajectories(include_tokens=True)``, keeps records with
``reward >= min_reward`` (rejection sampling), rebuilds each `Trajectory` with ``Trajectory.from_dict``,
applies the same relabelling (real tool results become REHEARSE targets; rehearsed ones already are) and
the same length cap.

Sources: EnvACE (Xu et al., 2026, arXiv 2608.06197) as docs/design.md §1 describes it (one policy, two roles);
BFCL v4 multi-turn data, backends and checkers from ``bfcl-eval`` (docs/design.md §4); rejection-sampling
fine-tuning as in Yuan et al., 2023 ("Scaling relationship on learning mathematical reasoning with LLMs").
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from envace_gym.parsing import format_tool_calls
from envace_gym.rendering import ChatRenderer
from envace_gym.suites import DONE_MESSAGE, NO_CALL_MESSAGE, proposes_mistakes
from envace_gym.types import GeneratedText, Role, Segment, Task, ToolCall, Trajectory

__all__ = [
    "DemoStats",
    "NO_CALL_MESSAGE",
    "DONE_MESSAGE",
    "closing_message",
    "relabel_for_sft",
    "cap_length",
    "build_demonstrations",
    "demonstration_for_task",
    "error_demonstration",
    "demonstration_env",
    "load_recorded_trajectories",
    "record_memory_demonstrations",
    "MULTI_TURN_CATEGORIES",
]

MULTI_TURN_CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")

Overflow = Literal["truncate", "drop"]
CallsPerMessage = Literal["one", "all"]


@dataclass
class DemoStats:
    """What a builder kept and skipped.

    Attributes:
        considered: tasks (or JSONL records) looked at.
        kept: demonstrations returned (error demonstrations included).
        skipped_reward: skipped because the verifier reward was not 1.0 (demos) or below ``min_reward`` (JSONL).
        skipped_no_tokens: JSONL records without a ``trajectory`` (written without ``include_tokens``).
        dropped_length: dropped by the length cap (``overflow="drop"``, or nothing left to train after truncation).
        truncated: kept after truncation to ``max_tokens``.
        skipped_error: tasks whose ground truth could not be played (an exception while building; the
            messages are in ``errors``).
        tokens_per_role: total kept tokens keyed by role name.
        errors: ``"task_id: message"`` of each skipped_error.
        error_demos: of ``kept``, the error demonstrations (``mutations``; module docstring).
        error_demos_breaking: of ``error_demos``, those that end at an irreversible error.
        skipped_mutation: mistakes the suite proposed that could not be played as one: the real backend
            answered without an error, or the episode ended at the call.
    """

    considered: int = 0
    kept: int = 0
    skipped_reward: int = 0
    skipped_no_tokens: int = 0
    dropped_length: int = 0
    truncated: int = 0
    skipped_error: int = 0
    tokens_per_role: dict[str, int] = field(default_factory=lambda: {r.name: 0 for r in Role})
    errors: list[str] = field(default_factory=list)
    error_demos: int = 0
    error_demos_breaking: int = 0
    skipped_mutation: int = 0

    def add_tokens(self, traj: Trajectory) -> None:
        """Add `traj`'s tokens to ``tokens_per_role``."""
        for k, v in traj.tokens_per_role().items():
            self.tokens_per_role[k] += v

    def cap_and_count(self, traj: Trajectory, max_tokens: int | None, overflow: Overflow) -> Trajectory | None:
        """`cap_length` plus the bookkeeping every builder does: count a drop, a truncation or a kept demo.

        Returns the (possibly truncated) demonstration, or None when the cap dropped it.
        """
        capped, was_cut = cap_length(traj, max_tokens, overflow)
        if capped is None:
            self.dropped_length += 1
            return None
        self.truncated += int(was_cut)
        self.kept += 1
        self.add_tokens(capped)
        return capped

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible dict."""
        return dict(self.__dict__, tokens_per_role=dict(self.tokens_per_role), errors=list(self.errors))


def closing_message(calls: Sequence[ToolCall]) -> str:
    """The templated closing ACT message of a user turn: `DONE_MESSAGE` if the turn made calls, else
    `NO_CALL_MESSAGE`."""
    return DONE_MESSAGE if calls else NO_CALL_MESSAGE


def _closing(suite: Any, task: Task, turn: int, calls: Sequence[ToolCall]) -> str:
    """The suite's reference reply for the turn (``Suite.reference_reply``) when it gives one, else
    `closing_message`."""
    reply = getattr(suite, "reference_reply", None)
    text = reply(task, turn) if callable(reply) else None
    return text if text is not None else closing_message(calls)


# ---------------------------------------------------------------------------------------------------------
# Relabelling and the length cap
# ---------------------------------------------------------------------------------------------------------


def relabel_for_sft(traj: Trajectory, stop_ids: Sequence[int]) -> Trajectory:
    """A copy of `traj` whose real tool results are REHEARSE targets (the roles still partition the tokens).

    An OBSERVATION segment becomes REHEARSE when it is the content of a tool message that answers a call
    (a tool message with a ``tool_call_id``; parse-error messages have none and stay OBSERVATION). In an
    env trajectory every tool message is exactly one OBSERVATION or REHEARSE segment, so those segments and
    the tool messages are matched in order (relabelling twice changes nothing); the ids of the TEMPLATE segment
    right after a relabelled segment, up to and including its first stop id, move into it (ChatML:
    ``<|im_end|>``; a Qwen tool close: ``\\n</tool_response><|im_end|>``), so the REHEARSE target ends exactly
    as an inline rehearsal generated by the policy does (`ChatRenderer.generation_end_ids`). ACT and
    REHEARSE segments are kept as they are (logprobs included). The token ids and their order never change.

    Args:
        traj: a trajectory from `RehearseEnv` (inline mode).
        stop_ids: the end-of-message ids (`ChatRenderer.stop_token_ids`).

    Returns:
        Trajectory: a new object (segments copied; task and messages shared).

    Raises:
        ValueError: the trajectory has more OBSERVATION segments than tool messages (not an env trajectory).
    """
    stops = set(int(i) for i in stop_ids)
    tool_msgs = [m for m in traj.messages if m.role == "tool"]
    content_count = sum(1 for s in traj.segments if s.role in (Role.OBSERVATION, Role.REHEARSE))
    if content_count > len(tool_msgs):
        raise ValueError(
            f"{content_count} OBSERVATION/REHEARSE segments but only {len(tool_msgs)} tool messages; cannot match them"
        )
    # separate-mode rehearsed responses are OBSERVATION too and have call ids; they are model text, not real
    # results, but a record cannot tell them apart: the docstring of load_recorded_trajectories says so.
    out: list[Segment] = []
    obs_index = 0
    move_stop = False
    for seg in traj.segments:
        seg = Segment(seg.role, list(seg.token_ids), list(seg.logprobs) if seg.logprobs is not None else None, seg.text)
        if move_stop and seg.role == Role.TEMPLATE:
            k = next((i for i, t in enumerate(seg.token_ids) if t in stops), None)
            if k is not None:  # the close up to its stop token is what a rehearsal writes (ChatML: <|im_end|>)
                out[-1].token_ids.extend(seg.token_ids[: k + 1])
                seg.token_ids = seg.token_ids[k + 1 :]
        move_stop = False
        if seg.role in (Role.OBSERVATION, Role.REHEARSE):
            msg = tool_msgs[obs_index]
            obs_index += 1
            if seg.role == Role.OBSERVATION and msg.tool_call_id is not None:
                seg = Segment(Role.REHEARSE, seg.token_ids, None, seg.text)
                move_stop = not (seg.token_ids and seg.token_ids[-1] in stops)
        if seg.token_ids:
            out.append(seg)
    return Trajectory(
        task=traj.task,
        segments=out,
        messages=traj.messages,
        reward=traj.reward,
        terminated=traj.terminated,
        truncated=traj.truncated,
        turn_info=traj.turn_info,
    )


def cap_length(
    traj: Trajectory, max_tokens: int | None, overflow: Overflow = "truncate"
) -> tuple[Trajectory | None, bool]:
    """Apply the length cap (module docstring, "Length cap").

    Args:
        traj: a trajectory.
        max_tokens: the cap in tokens; None means no cap.
        overflow: ``"truncate"`` keeps the first `max_tokens` tokens (segments cut at the boundary); ``"drop"``
            returns None for a longer trajectory.

    Returns:
        ``(trajectory or None, truncated)``: None when the trajectory is dropped (too long with ``"drop"``,
        or no ACT token left after truncation).

    Raises:
        ValueError: ``max_tokens < 1`` or an unknown `overflow`.
    """
    if overflow not in ("truncate", "drop"):
        raise ValueError(f"overflow must be 'truncate' or 'drop', got {overflow!r}")
    if max_tokens is None:
        return traj, False
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 (or None), got {max_tokens}")
    total = sum(len(s) for s in traj.segments)
    if total <= max_tokens:
        return traj, False
    if overflow == "drop":
        return None, False
    kept: list[Segment] = []
    left = max_tokens
    for s in traj.segments:
        if left <= 0:
            break
        n = min(left, len(s))
        kept.append(
            Segment(
                s.role,
                s.token_ids[:n],
                s.logprobs[:n] if s.logprobs is not None else None,
                s.text if n == len(s) else "",
            )
        )
        left -= n
    if not any(s.role == Role.ACT for s in kept):
        return None, False
    return (
        Trajectory(
            task=traj.task,
            segments=kept,
            messages=traj.messages,
            reward=traj.reward,
            terminated=traj.terminated,
            truncated=True,
            turn_info=traj.turn_info,
        ),
        True,
    )


# ---------------------------------------------------------------------------------------------------------
# Demonstrations from reference solutions
# ---------------------------------------------------------------------------------------------------------


def _action(renderer: ChatRenderer, text: str) -> GeneratedText:
    """The action as the policy would have generated it: content ids then the ids that end an assistant
    message (`ChatRenderer.generation_end_ids`; ChatML ``<|im_end|>``), no logprobs."""
    return GeneratedText(text, renderer.content_ids(text) + renderer.generation_end_ids("assistant"), None)


def _reference(env: Any, task: Task) -> list[list[ToolCall]]:
    base = env.unwrapped
    reference = getattr(base.suite, "ground_truth", None)
    gt = reference(task) if callable(reference) else None
    if gt is None:
        raise ValueError(f"{task.id}: suite {base.suite.name!r} gives no reference solution (Suite.ground_truth)")
    return gt


def demonstration_for_task(
    env: Any, task: Task, calls_per_message: CallsPerMessage = "one", seed: int | None = None
) -> tuple[Trajectory, float]:
    """Play `task`'s reference solution in `env` (`demonstration_env`) and return ``(trajectory, reward)``.

    The reference is the suite's ``ground_truth(task)`` (turns × calls; BFCL: its ``possible_answer`` calls,
    positional arguments bound). The trajectory is the env's own (not yet relabelled); see the module
    docstring for the message layout. A single-step task (``task.metadata["single_step"]``, BFCL single-turn)
    is one ACT message holding all of its calls. `seed` goes to ``env.reset`` (it seeds wrappers that sample,
    such as `wrappers.TestTimeRehearsal`; the real backend does not).

    Raises:
        ValueError: `calls_per_message` is unknown, or the env's suite gives no reference solution for `task`.
        RuntimeError: the episode ended before the last user turn was answered (e.g. the step limit).
    """
    if calls_per_message not in ("one", "all"):
        raise ValueError(f"calls_per_message must be 'one' or 'all', got {calls_per_message!r}")
    base = env.unwrapped
    renderer = base.renderer
    gt = _reference(env, task)
    env.reset(seed=seed, options={"task_id": task.id})
    if task.metadata.get("single_step"):
        calls = [c for turn in gt for c in turn]
        _, reward, terminated, truncated, _ = env.step(
            _action(renderer, format_tool_calls(calls, "hermes") if calls else closing_message(calls))
        )
        return base.trajectory, float(reward)
    trajectory, reward, _ = _play(env, task, gt, calls_per_message, None)
    return trajectory, reward


def _groups(
    calls: Sequence[ToolCall], start: int, calls_per_message: CallsPerMessage, cut: int | None
) -> list[tuple[int, list[ToolCall]]]:
    """A turn's ACT messages as ``(flat index of the first call, calls)``; `cut` (a flat index inside the turn)
    starts a new message, so a mistake can be played right before that call."""
    if calls_per_message == "one":
        return [(start + i, [c]) for i, c in enumerate(calls)]
    bounds = [0] + ([cut - start] if cut is not None and start < cut < start + len(calls) else []) + [len(calls)]
    return [(start + a, list(calls[a:b])) for a, b in zip(bounds, bounds[1:]) if b > a]


def _play(
    env: Any,
    task: Task,
    gt: list[list[ToolCall]],
    calls_per_message: CallsPerMessage,
    mistake: tuple[int, ToolCall] | None,
) -> tuple[Trajectory, float, dict[str, Any] | None]:
    """Play the reference turns of a reset env, with `mistake` ``(flat position, call)`` played right before
    that reference call. Returns ``(trajectory, reward, played)``; ``played`` is None without a mistake, else
    ``{"start": token offset of the mistaken ACT message, "output": its real output, "breaks": bool}``."""
    base = env.unwrapped
    renderer = base.renderer
    reward, done, played, start = 0.0, False, None, 0
    for t, calls in enumerate(gt):
        for first, group in _groups(calls, start, calls_per_message, mistake[0] if mistake else None):
            if mistake is not None and played is None and first == mistake[0]:
                played = _play_mistake(env, task, mistake[1])
                if played["breaks"]:
                    return base.trajectory, 0.0, played
            _, _, terminated, truncated, _ = env.step(_action(renderer, format_tool_calls(group, "hermes")))
            if terminated or truncated:
                raise RuntimeError(f"{task.id}: the episode ended during the calls of turn {t}")
        start += len(calls)
        _, reward, terminated, truncated, _ = env.step(_action(renderer, _closing(base.suite, task, t, calls)))
        done = terminated or truncated
        if done and t + 1 < len(gt):
            raise RuntimeError(f"{task.id}: the episode ended after turn {t} of {len(gt)}")
    if not done:
        raise RuntimeError(f"{task.id}: the episode did not end after the last user turn")
    return base.trajectory, float(reward), played


class _NotAMistake(ValueError):
    """The real backend answered a proposed mistake without an error."""


def _play_mistake(env: Any, task: Task, call: ToolCall) -> dict[str, Any]:
    from wrappers.fidelity import is_error_output

    base = env.unwrapped
    backend = base.backend
    if backend is None:
        raise ValueError(f"{task.id}: the env has no real backend to play a mistake on")
    before = backend.snapshot()
    start = sum(len(s) for s in base.trajectory.segments)
    _, _, terminated, truncated, _ = env.step(_action(base.renderer, format_tool_calls([call], "hermes")))
    output = base.trajectory.messages[-1].content
    if terminated or truncated:
        raise RuntimeError(f"{task.id}: the episode ended at the mistaken call {call.name}")
    if not is_error_output(output):
        raise _NotAMistake(
            f"{task.id}: {call.name}({call.arguments}) is not a mistake: the real backend answered {output[:200]!r}"
        )
    return {"start": start, "output": output, "breaks": backend.snapshot() != before}


def error_demonstration(
    env: Any, task: Task, position: int, call: ToolCall, calls_per_message: CallsPerMessage = "one"
) -> tuple[Trajectory, dict[str, Any]]:
    """Play `task`'s reference solution in `env` (`demonstration_env`) with the mistaken `call` played right
    before reference call `position` (module docstring, "Error demonstrations").

    Args:
        env: a `demonstration_env`.
        task: a multi-step task of the env's suite.
        position: index into the reference calls flattened over the turns, ``0 <= position < len(calls)``.
        call: the mistaken call (one ACT message of its own).
        calls_per_message: as `demonstration_for_task`.

    Returns:
        ``(trajectory, mutation)``: the env's trajectory (not relabelled; the mistaken ACT message is still ACT,
        `build_demonstrations` silences it) and ``{"position", "call", "output", "breaks", "start"}``:
        ``start`` the token offset where the mistaken ACT message begins, ``output`` its real output,
        ``breaks`` whether it changed the backend's state (the trajectory then ends after that output).

    Raises:
        ValueError: an unknown `calls_per_message`, no reference solution, a single-step task, `position` out
            of range, or the real backend answered `call` without an error (not a mistake).
        RuntimeError: the episode ended early (as `demonstration_for_task`).
    """
    if calls_per_message not in ("one", "all"):
        raise ValueError(f"calls_per_message must be 'one' or 'all', got {calls_per_message!r}")
    gt = _reference(env, task)
    if task.metadata.get("single_step"):
        raise ValueError(f"{task.id}: a single-step task is one message; it has no place for a mistaken call")
    n = sum(len(turn) for turn in gt)
    if not 0 <= position < n:
        raise ValueError(f"{task.id}: mistake position {position} outside the {n} reference calls")
    env.reset(options={"task_id": task.id})
    trajectory, _, played = _play(env, task, gt, calls_per_message, (position, call))
    assert played is not None  # every position in range is reached before the episode ends
    return trajectory, {"position": position, "call": call.to_openai(), **played}


def _silence_mistake(traj: Trajectory, start: int, mutation: dict[str, Any]) -> Trajectory:
    """`traj` with the ACT segment that begins at token offset `start` relabelled PROMPT (no loss) and its
    task a copy whose ``metadata["mutation"]`` is `mutation` (its keys but ``start``).

    Raises:
        ValueError: no ACT segment begins at `start`.
    """
    segments, offset, found = [], 0, False
    for seg in traj.segments:
        if offset == start and seg.role == Role.ACT and not found:
            seg, found = Segment(Role.PROMPT, list(seg.token_ids), None, seg.text), True
        segments.append(seg)
        offset += len(seg)
    if not found:
        raise ValueError(f"{traj.task.id}: no ACT segment starts at token {start}")
    meta = {k: v for k, v in mutation.items() if k != "start"}
    task = dataclasses.replace(traj.task, metadata={**traj.task.metadata, "mutation": meta})
    return Trajectory(
        task=task,
        segments=segments,
        messages=traj.messages,
        reward=traj.reward,
        terminated=traj.terminated,
        truncated=traj.truncated,
        turn_info=traj.turn_info,
    )


def demonstration_env(tokenizer: Any, suite: str, **kwargs: Any) -> Any:
    """The env that plays reference solutions: a `ToolUseEnv` of `suite` answered by its real backend
    (`envace_gym.responders.RealBackend`), tokens in `tokenizer`'s format, no rehearser (no model is loaded),
    and no step limit (BFCL's 20-step limit counts ACT messages; with one call per message a long reference
    turn needs more). `kwargs` go to the env (``categories``, ``split`` or ``tasks``)."""
    from envace_gym.envs.tool_use import ToolUseEnv
    from envace_gym.responders import RealBackend

    return ToolUseEnv(suite=suite, tokenizer=tokenizer, responder=RealBackend(), max_steps_per_turn=10_000, **kwargs)


def build_demonstrations(
    tokenizer: Any,
    suite: str = "bfcl",
    categories: Sequence[str] | None = None,
    split: str = "train",
    *,
    task_ids: Sequence[str] | None = None,
    limit: int | None = None,
    max_tokens: int | None = 4096,
    overflow: Overflow = "truncate",
    calls_per_message: CallsPerMessage = "one",
    progress: bool = False,
    mutations: int = 0,
    seed: int = 0,
) -> tuple[list[Trajectory], DemoStats]:
    """Demonstrations from real executions of a suite's reference solutions (module docstring).

    Any registered suite with ``ground_truth(task)`` yields demonstrations; a task without one is skipped
    and counted in ``stats.skipped_error``. With `mutations`, each kept reference demonstration is followed
    by up to `mutations` error demonstrations of its task (module docstring, "Error demonstrations").

    Args:
        tokenizer: the policy's tokenizer (its chat template renders the prompt and the message pieces).
        suite: a registered suite name (`envace_gym.suites.registered_suites`); default BFCL.
        categories: the suite's categories (None: its default); BFCL: e.g. `MULTI_TURN_CATEGORIES`.
        split: ``"train"`` (default), ``"test"`` or ``"all"``.
        task_ids: only these tasks (in this order); None: every task of the categories and split.
        limit: stop after this many kept demonstrations (None: all).
        max_tokens: the length cap in tokens (None: no cap); see `cap_length`.
        overflow: ``"truncate"`` or ``"drop"`` (see `cap_length`).
        calls_per_message: ``"one"`` or ``"all"`` calls per ACT message.
        progress: show a tqdm bar.
        mutations: error demonstrations per task, at most (0: none, the default; the suite must then give
            ``mutations(task, calls, rng)``). `limit` counts them too.
        seed: seeds the draw of each task's mistakes (``random.Random(f"{seed}/{task.id}")``).

    Returns:
        ``(demos, stats)``: relabelled trajectories in task order, each task's reference demonstration
        (reward 1.0) followed by its error demonstrations (``task.metadata["mutation"]`` set; reward as the
        verifier gave it, 0.0 on the lab, and 0.0 for one that ended at a broken item), and the counts of
        `DemoStats`.

    Raises:
        ValueError: an unknown suite or category, a task id not in the categories and split, an invalid
            `overflow` / `calls_per_message`, ``mutations < 0``, `mutations` with a suite that has no
            ``mutations`` hook, or a hook position outside the task's reference calls.
    """
    from tqdm.auto import tqdm

    if overflow not in ("truncate", "drop"):
        raise ValueError(f"overflow must be 'truncate' or 'drop', got {overflow!r}")
    if calls_per_message not in ("one", "all"):
        raise ValueError(f"calls_per_message must be 'one' or 'all', got {calls_per_message!r}")
    if isinstance(mutations, bool) or not isinstance(mutations, int) or mutations < 0:
        raise ValueError(f"mutations must be an int >= 0 (error demonstrations per task), got {mutations!r}")
    env = demonstration_env(tokenizer, suite, categories=None if categories is None else list(categories), split=split)
    base = env.unwrapped
    propose = getattr(base.suite, "mutations", None)
    if mutations and not proposes_mistakes(base.suite):
        env.close()
        raise ValueError(
            f"suite {suite!r} proposes no mistakes (no Suite.mutations(task, calls, rng)); "
            "error demonstrations need one"
        )
    pool = {t.id: t for t in base.tasks}
    if task_ids is not None:
        missing = [i for i in task_ids if i not in pool]
        if missing:
            raise ValueError(f"task ids not in {suite} {categories}/{split}: {missing[:5]}")
        tasks = [pool[i] for i in task_ids]
    else:
        tasks = list(base.tasks)
    stops = base.renderer.stop_token_ids
    stats = DemoStats()
    demos: list[Trajectory] = []
    for task in tqdm(tasks, desc="demos", disable=not progress, unit="task"):
        if limit is not None and len(demos) >= limit:
            break
        stats.considered += 1
        try:
            traj, reward = demonstration_for_task(env, task, calls_per_message)
        except (RuntimeError, ValueError) as err:
            stats.skipped_error += 1
            stats.errors.append(f"{task.id}: {err}")
            continue
        if reward != 1.0:
            stats.skipped_reward += 1
            continue
        capped = stats.cap_and_count(relabel_for_sft(traj, stops), max_tokens, overflow)
        if capped is not None:
            demos.append(capped)
        if mutations and not task.metadata.get("single_step"):
            demos += _error_demos(
                env,
                task,
                propose,
                mutations,
                seed,
                calls_per_message,
                stops,
                max_tokens,
                overflow,
                stats,
                None if limit is None else limit - len(demos),
            )
    env.close()
    return demos, stats


def _error_demos(
    env: Any,
    task: Task,
    propose: Any,
    k: int,
    seed: int,
    calls_per_message: CallsPerMessage,
    stops: Sequence[int],
    max_tokens: int | None,
    overflow: Overflow,
    stats: DemoStats,
    room: int | None,
) -> list[Trajectory]:
    """Up to `k` (and at most `room`) relabelled error demonstrations of `task` (module docstring)."""
    calls = [c for turn in _reference(env, task) for c in turn]
    rng = random.Random(f"{seed}/{task.id}")
    proposed = list(propose(task, calls, rng))
    bad = [p for p, _ in proposed if not 0 <= p < len(calls)]
    if bad:
        raise ValueError(f"{task.id}: Suite.mutations gave positions {bad} outside the {len(calls)} reference calls")
    chosen = sorted(rng.sample(range(len(proposed)), min(k, len(proposed))))
    out: list[Trajectory] = []
    for i in chosen:
        if room is not None and len(out) >= room:
            break
        position, call = proposed[i]
        try:
            traj, mutation = error_demonstration(env, task, position, call, calls_per_message)
        except (_NotAMistake, RuntimeError):
            stats.skipped_mutation += 1
            continue
        silenced = _silence_mistake(relabel_for_sft(traj, stops), mutation["start"], mutation)
        capped = stats.cap_and_count(silenced, max_tokens, overflow)
        if capped is not None:
            out.append(capped)
            stats.error_demos += 1
            stats.error_demos_breaking += int(mutation["breaks"])
    return out


def record_memory_demonstrations(
    policy: Any,
    path: str | os.PathLike[str],
    suite: str = "lab",
    categories: Sequence[str] | None = None,
    split: str = "train",
    *,
    task_ids: Sequence[str] | None = None,
    limit: int | None = None,
    n: int = 2,
    mode: Literal["parallel", "sequential"] = "parallel",
    memory_tokens: int = 256,
    attempt_max_steps: int = 8,
    max_new_tokens: int = 40,
    attempt_temperature: float = 1.0,
    attempt_outputs: Literal["rehearsed", "null", "real"] = "rehearsed",
    restate_request: bool = False,
    memory: Literal["trace", "outcomes"] = "trace",
    seed: int = 0,
    batch: int = 64,
    progress: bool = False,
) -> dict[str, Any]:
    """Write memory-conditioned demonstrations (module docstring) of `policy`'s own rehearsals to `path`.

    Each task's reference solution is played (`demonstration_for_task`, one call per ACT message) in a
    `demonstration_env` wrapped in ``TestTimeRehearsal(policy, n, mode, memory=memory)`` and
    ``RecordTrajectories(path, include_tokens=True)``; a task whose reference fails (reward < 1) or cannot be
    played is skipped and counted. `batch` tasks play at once, their generate calls merged
    (`agents.engines.batching.BatchCoordinator`); each task's attempts are seeded from ``(seed, task id)``, so the
    demonstrations do not depend on `batch` (up to float rounding). Records are appended, one JSON line per
    task, in the order the tasks finish.

    Args:
        policy: an `agents.policy.Policy` with the suite env's tokenizer (it ACTs and REHEARSEs in the attempts).
        path: the JSONL file to append to.
        suite, categories, split, task_ids: the tasks, as in `build_demonstrations`.
        limit: play at most this many tasks (None: all); unlike `build_demonstrations`, it counts tasks played.
        n, mode, memory_tokens, attempt_max_steps, max_new_tokens, attempt_temperature: the wrapper's
            settings (`wrappers.TestTimeRehearsal`); the attempts are capped at `attempt_max_steps` ACT steps
            because the demonstration env has no step limit of its own.
        attempt_outputs: who answers the attempts' calls: ``"rehearsed"`` (`policy`'s REHEARSE role, the
            method), ``"null"`` (a constant: memories of calls without outcomes) or ``"real"`` (a copy of the real
            backend at the attempt's start: every memory then holds true outcomes, breaks included, so training on
            it asks only whether the policy can learn to read one).
        restate_request: the request again after the memory (the wrapper's option): train the layout an
            evaluation with ``restate_request`` plays.
        memory: the memory's layout (the wrapper's ``"trace"`` or ``"outcomes"``; an evaluation reads the
            layout its policy trained on).
        seed: seeds the attempts' sampling.
        batch: tasks played together (>= 1).
        progress: show a tqdm bar.

    Returns:
        counts: ``tasks`` (considered), ``written``, ``skipped`` (with ``errors``, the first 20 reasons),
        ``memories`` (rehearsed user turns), ``attempts``, ``attempt_error_outputs`` (attempts' outputs
        that are errors), ``memory_tokens_mean`` and ``generated_tokens`` (ACT + REHEARSE tokens of the attempts).

    Raises:
        ValueError: ``n < 1``, ``batch < 1`` or another `memory`; a task id not in the suite's categories and
            split; and the errors of `wrappers.TestTimeRehearsal` for bad settings or a policy whose vocabulary
            differs.
    """
    import functools

    from tqdm.auto import tqdm

    from agents.engines.batching import BatchCoordinator, coalesced
    from wrappers.fidelity import is_error_output
    from wrappers.record_trajectories import RecordTrajectories
    from wrappers.test_time_rehearsal import TestTimeRehearsal

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1 (a memory needs rehearsal attempts), got {n!r}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch!r}")
    if memory not in ("trace", "outcomes"):
        raise ValueError(f"memory must be 'trace' or 'outcomes' (a layout built from the attempts), got {memory!r}")

    class CountingRehearsal(TestTimeRehearsal):
        """Keeps every rehearsal record (`TestTimeRehearsal.rehearse`'s ``info["rehearsal"]``) for the counts."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.records: list[dict[str, Any]] = []

        def rehearse(self) -> dict[str, Any]:
            record = super().rehearse()
            self.records.append(record)
            return record

    def make_env() -> Any:
        base = demonstration_env(
            policy.tokenizer, suite, categories=None if categories is None else list(categories), split=split
        )
        rehearsing = CountingRehearsal(
            base,
            policy,
            n=n,
            mode=mode,
            memory=memory,
            memory_tokens=memory_tokens,
            attempt_max_steps=attempt_max_steps,
            max_new_tokens=max_new_tokens,
            attempt_temperature=attempt_temperature,
            attempt_outputs=attempt_outputs,
            restate_request=restate_request,
        )
        return RecordTrajectories(rehearsing, path, include_tokens=True)

    envs = [make_env()]
    pool = {t.id: t for t in envs[0].unwrapped.tasks}
    missing = [i for i in task_ids or [] if i not in pool]
    if missing:
        envs[0].close()
        raise ValueError(f"task ids not in {suite} {categories}/{split}: {missing[:5]}")
    tasks = [pool[i] for i in task_ids] if task_ids is not None else list(pool.values())
    if limit is not None:
        tasks = tasks[:limit]
    envs += [make_env() for _ in range(min(batch, len(tasks)) - 1)]
    counts: dict[str, Any] = dict.fromkeys(("tasks", "written", "skipped"), 0)
    counts["errors"] = []

    def play(env: Any, task: Task) -> float | str:
        try:
            _, reward = demonstration_for_task(env, task, seed=random.Random(f"{seed}/{task.id}").randrange(2**31))
        except (RuntimeError, ValueError) as err:
            return f"{task.id}: {err}"
        return reward

    batcher = BatchCoordinator()
    bar = tqdm(total=len(tasks), desc="memory demos", disable=not progress, unit="task")
    try:
        for start in range(0, len(tasks), len(envs)):
            chunk = tasks[start : start + len(envs)]
            with coalesced([policy], batcher):
                outcomes = batcher.run([functools.partial(play, env, task) for env, task in zip(envs, chunk)])
            for outcome in outcomes:
                counts["tasks"] += 1
                if outcome == 1.0:
                    counts["written"] += 1
                else:  # an error, or written by RecordTrajectories with its reward (SFT's min_reward drops it)
                    counts["skipped"] += 1
                    if isinstance(outcome, str) and len(counts["errors"]) < 20:
                        counts["errors"].append(outcome)
            bar.update(len(chunk))
    finally:
        bar.close()
        for env in envs:
            env.close()
    records = [r for env in envs for r in env.env.records]  # RecordTrajectories -> CountingRehearsal
    counts["memories"] = len(records)
    counts["attempts"] = sum(len(r["attempts"]) for r in records)
    counts["generated_tokens"] = sum(r["generated_tokens"] for r in records)
    counts["attempt_error_outputs"] = sum(
        is_error_output(m.get("content") or "")
        for r in records
        for a in r["attempts"]
        for m in a["messages"]
        if m.get("role") == "tool"
    )
    counts["memory_tokens_mean"] = sum(r["memory_tokens"] for r in records) / len(records) if records else 0.0
    return counts


# ---------------------------------------------------------------------------------------------------------
# Recorded rollouts (rejection sampling)
# ---------------------------------------------------------------------------------------------------------


def _records(paths: Iterable[str | os.PathLike[str]]) -> Iterable[dict[str, Any]]:
    from agents.training.run_folder import read_jsonl

    for path in paths:
        if not os.path.isfile(path):
            raise ValueError(f"no JSONL file at {path!r}")
        yield from read_jsonl(path)  # a cut last line (a killed writer) is skipped with a warning


def load_recorded_trajectories(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    stop_ids: Sequence[int],
    *,
    min_reward: float = 1.0,
    max_tokens: int | None = 4096,
    overflow: Overflow = "truncate",
    relabel_observations: bool = True,
) -> tuple[list[Trajectory], DemoStats]:
    """Trajectories recorded by ``RecordTrajectories(include_tokens=True)`` with ``reward >= min_reward``.

    Rejection-sampling fine-tuning: keep the rollouts whose verifier reward clears the threshold and train
    on them like demonstrations. Records without a ``trajectory`` key (written without ``include_tokens``)
    are skipped and counted. With `relabel_observations`, real tool results become REHEARSE targets
    (`relabel_for_sft`); note that a ``separate``-mode rollout's rehearsed responses are OBSERVATION segments
    with call ids too and would be relabelled as well (they are the policy's own text, not real results), so
    use ``relabel_observations=False`` for those.

    Args:
        paths: one JSONL file or several.
        stop_ids: the end-of-message ids of the tokenizer the rollouts were recorded with.
        min_reward: the threshold on the record's ``reward``.
        max_tokens, overflow: the length cap (`cap_length`).
        relabel_observations: turn real tool results into REHEARSE targets.

    Returns:
        ``(trajectories, stats)``.

    Raises:
        ValueError: a line is not JSON, or a record's ``trajectory`` is malformed.
        OSError: a file cannot be read.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    stats = DemoStats()
    out: list[Trajectory] = []
    for rec in _records(paths):
        stats.considered += 1
        if float(rec.get("reward", 0.0)) < min_reward:
            stats.skipped_reward += 1
            continue
        if "trajectory" not in rec:
            stats.skipped_no_tokens += 1
            continue
        try:
            traj = Trajectory.from_dict(rec["trajectory"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"record of task {rec.get('task_id')!r} holds a malformed trajectory: {err}") from err
        if relabel_observations:
            traj = relabel_for_sft(traj, stop_ids)
        capped = stats.cap_and_count(traj, max_tokens, overflow)
        if capped is not None:
            out.append(capped)
    return out, stats
