"""Core types: tool specs, tool calls, chat messages, tasks, roles, segments and trajectories.

Every type here is a plain dataclass with a JSON round trip (`to_dict` / `from_dict`) so trajectories can be
written as JSON Lines and read back. Messages follow the OpenAI chat format (docs/design.md §1, §3).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "Role",
    "ToolSpec",
    "ToolCall",
    "Message",
    "Task",
    "Segment",
    "RehearsalRecord",
    "RealOutputRecord",
    "AttemptRecord",
    "TurnInfo",
    "Trajectory",
    "MessageRole",
    "GeneratedText",
]

MessageRole = Literal["system", "user", "assistant", "tool"]


class Role(enum.IntEnum):
    """Who produced a token of a trajectory (docs/design.md §3, "Role masks partition every sequence").

    The integer values are the ones stored in role masks (`role_mask (N, T) int64`).

    Attributes:
        PROMPT: system prompt, tool schemas and user turns. No loss.
        ACT: tokens the policy generated in its ACT role (tool calls, final answers). Carries loss.
        REHEARSE: tokens the policy generated as the environment's response to its own action. Carries loss.
        OBSERVATION: real tool output from a real backend. Never carries loss.
        TEMPLATE: chat-template pieces between segments (role headers, end-of-message). No loss.
    """

    PROMPT = 0
    ACT = 1
    REHEARSE = 2
    OBSERVATION = 3
    TEMPLATE = 4

    @property
    def trainable(self) -> bool:
        """True for the two roles that carry loss (ACT and REHEARSE)."""
        return self in (Role.ACT, Role.REHEARSE)


@dataclass(frozen=True)
class ToolSpec:
    """One tool in the OpenAI function-calling schema.

    Attributes:
        name: the function name as the model must emit it. Suites whose native names are not valid
            identifiers for every tool-call format (BFCL single-turn names such as ``"math.factorial"``)
            map them and say how in their own docs.
        description: free text shown to the model.
        parameters: a JSON Schema object (``{"type": "object", "properties": {...}, "required": [...]}``).
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_openai(self) -> dict[str, Any]:
        """The ``{"type": "function", "function": {...}}`` dict that chat templates take as ``tools``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @classmethod
    def from_openai(cls, spec: dict[str, Any]) -> ToolSpec:
        """Build from either the wrapped (``{"type": "function", "function": ...}``) or bare form.

        Raises:
            ValueError: the dict has no ``name``.
        """
        fn = spec.get("function", spec)
        if "name" not in fn:
            raise ValueError(f"tool spec has no 'name': {spec!r}")
        return cls(
            name=fn["name"],
            description=fn.get("description", ""),
            parameters=fn.get("parameters") or {"type": "object", "properties": {}},
        )

    def __hash__(self) -> int:  # parameters is a dict: hash by the canonical JSON
        return hash((self.name, self.description, json.dumps(self.parameters, sort_keys=True)))


@dataclass
class ToolCall:
    """A parsed tool call: a name plus literal arguments (never executable code; docs/design.md §3).

    Attributes:
        name: the function name.
        arguments: JSON-compatible keyword arguments.
        id: an optional call id, echoed in the tool message's ``tool_call_id``.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``tool_calls`` entry; ``arguments`` is a JSON string as that format requires."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }

    @classmethod
    def from_openai(cls, d: dict[str, Any]) -> ToolCall:
        """Inverse of `to_openai`; ``arguments`` may be a JSON string or a dict.

        Raises:
            ValueError: ``arguments`` is a string that is not a JSON object.
        """
        fn = d.get("function", d)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            args = json.loads(args) if args.strip() else {}
        if not isinstance(args, dict):
            raise ValueError(f"tool call arguments must be a JSON object, got {type(args).__name__}")
        return cls(name=fn["name"], arguments=args, id=d.get("id"))


@dataclass
class Message:
    """One chat message in the OpenAI format.

    Attributes:
        role: ``"system"``, ``"user"``, ``"assistant"`` or ``"tool"``.
        content: the text (for an assistant message with tool calls, the raw text the model emitted).
        tool_calls: the parsed calls of an assistant message, else None.
        tool_call_id: for a tool message, the id of the call it answers.
        name: for a tool message, the name of the tool that answered.
    """

    role: MessageRole
    content: str = ""
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """OpenAI chat dict; keys that are None are left out."""
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls is not None:
            d["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            d["name"] = self.name
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        """Inverse of `to_dict`.

        Raises:
            ValueError: the role is not one of the four chat roles.
        """
        role = d["role"]
        if role not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"unknown message role {role!r}; expected system, user, assistant or tool")
        calls = d.get("tool_calls")
        return cls(
            role=role,
            content=d.get("content") or "",
            tool_calls=[ToolCall.from_openai(c) for c in calls] if calls is not None else None,
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
        )


@dataclass
class Task:
    """One instruction of a suite: the user turns, the tools and how the outcome is verified.

    Attributes:
        id: unique within the suite, e.g. ``"multi_turn_base_0"``.
        suite: the suite name, e.g. ``"bfcl"``.
        turns: the user turns; each is a list of messages (usually one user message) that opens the turn.
        tools: the tools available from the first turn on.
        verifier: a reference to the verifier the suite applies, e.g. ``"bfcl.multi_turn"`` or ``"bfcl.ast"``.
        held_out_tools: tools revealed later, keyed by the turn index at which they become available
            (BFCL ``miss_func``); empty for most tasks.
        metadata: suite-specific data (category, initial backend config, ground truth, ...).
    """

    id: str
    suite: str
    turns: list[list[Message]]
    tools: list[ToolSpec]
    verifier: str
    held_out_tools: dict[int, list[ToolSpec]] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def num_turns(self) -> int:
        """Number of user turns."""
        return len(self.turns)

    def tools_at_turn(self, turn: int) -> list[ToolSpec]:
        """The tools visible at user turn `turn` (0-based): `tools` plus every held-out tool revealed so far."""
        out = list(self.tools)
        for t in sorted(self.held_out_tools):
            if t <= turn:
                out.extend(self.held_out_tools[t])
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible dict (metadata must itself be JSON-compatible)."""
        return {
            "id": self.id,
            "suite": self.suite,
            "turns": [[m.to_dict() for m in turn] for turn in self.turns],
            "tools": [t.to_openai() for t in self.tools],
            "verifier": self.verifier,
            "held_out_tools": {str(k): [t.to_openai() for t in v] for k, v in self.held_out_tools.items()},
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Task:
        """Inverse of `to_dict`."""
        return cls(
            id=d["id"],
            suite=d["suite"],
            turns=[[Message.from_dict(m) for m in turn] for turn in d["turns"]],
            tools=[ToolSpec.from_openai(t) for t in d["tools"]],
            verifier=d["verifier"],
            held_out_tools={
                int(k): [ToolSpec.from_openai(t) for t in v] for k, v in d.get("held_out_tools", {}).items()
            },
            metadata=d.get("metadata", {}),
        )


@dataclass
class Segment:
    """A contiguous run of tokens of one role inside a trajectory's token sequence.

    Attributes:
        role: who produced the tokens.
        token_ids: the ids, exactly as generated or consumed (token in, token out; docs/design.md §3).
        logprobs: for generated segments (ACT, REHEARSE), the logprob of each token under the sampling
            policy at generation time, same length as `token_ids`; None for non-generated segments.
        text: the decoded text, for humans and for parsing; never re-tokenized for training.
    """

    role: Role
    token_ids: list[int]
    logprobs: list[float] | None = None
    text: str = ""

    def __post_init__(self) -> None:
        self.role = Role(self.role)
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"segment has {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs; they must match"
            )

    def __len__(self) -> int:
        return len(self.token_ids)

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible dict with the role by name."""
        return {"role": self.role.name, "token_ids": list(self.token_ids), "logprobs": self.logprobs, "text": self.text}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Segment:
        """Inverse of `to_dict`."""
        return cls(
            role=Role[d["role"]], token_ids=list(d["token_ids"]), logprobs=d.get("logprobs"), text=d.get("text", "")
        )


@dataclass
class RehearsalRecord:
    """One rehearsed tool response, as `envace_gym.envs.tool_use.ToolUseEnv` recorded it.

    In the ``separate`` prompt mode this is its own training row (the simulator prompt, then the rehearsed
    completion); in ``inline`` mode the completion is also a REHEARSE segment of the trajectory.

    Attributes:
        call: the answered call in the OpenAI format (``{"type": "function", "function": {...}}``).
        text: the tool output the agent saw (the template's closing text stripped in ``inline`` mode).
        token_ids: the generated ids `(C,)`, the end-of-message id included when generation stopped on it.
        logprobs: their sampling logprobs `(C,)`.
        prompt_ids: the ``separate`` mode's simulator prompt `(P,)`; None in ``inline`` mode.
        stopped: False when the rehearsal hit its ``max_new_tokens`` (the output was cut).
    """

    call: dict[str, Any]
    text: str
    token_ids: list[int]
    logprobs: list[float]
    prompt_ids: list[int] | None = None
    stopped: bool = True

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RehearsalRecord:
        """Inverse of `to_dict`."""
        return cls(
            call=dict(d.get("call") or {}),
            text=str(d.get("text", "")),
            token_ids=list(d["token_ids"]),
            logprobs=list(d["logprobs"]),
            prompt_ids=list(d["prompt_ids"]) if d.get("prompt_ids") is not None else None,
            stopped=bool(d.get("stopped", True)),
        )


@dataclass
class RealOutputRecord:
    """One tool output that the real backend answered during an episode, kept as a world-model target.

    `envace_gym.envs.tool_use.ToolUseEnv` records one for every call its `envace_gym.responders.RealBackend` or
    `envace_gym.responders.Hybrid` answered from the backend; `agents.rollout.build_batch` can train the REHEARSE
    role on it by teacher forcing (``world_model=True``): the prompt the REHEARSE role would have seen for the call,
    the real output as the continuation it should have generated.

    Attributes:
        call: the answered call in the OpenAI format.
        text: the real output (the tool message content).
        token_ids: the target `(C,)`: the output's content ids followed by the ids a model writes to end the
            message (`envace_gym.rendering.ChatRenderer.generation_end_ids`): of a tool message in ``inline`` mode,
            where the target continues the trajectory, of an assistant message in ``separate`` mode, where it
            answers the simulator prompt.
        start: the position of the target's first id in the trajectory's token sequence (``inline``: the
            ids ``token_ids[start:start + C]`` of the trajectory are the target); None in ``separate`` mode.
        prompt_ids: ``separate`` mode: the simulator prompt `(P,)` the REHEARSE role would have answered; None
            in ``inline`` mode.
    """

    call: dict[str, Any]
    text: str
    token_ids: list[int]
    start: int | None = None
    prompt_ids: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RealOutputRecord:
        """Inverse of `to_dict`."""
        return cls(
            call=dict(d.get("call") or {}),
            text=str(d.get("text", "")),
            token_ids=list(d["token_ids"]),
            start=int(d["start"]) if d.get("start") is not None else None,
            prompt_ids=list(d["prompt_ids"]) if d.get("prompt_ids") is not None else None,
        )


@dataclass
class AttemptRecord:
    """One private rehearsal attempt of a user turn, kept as training rows (rehearsal-aware RL).

    `wrappers.TestTimeRehearsal` (``keep_attempt_rows=True``) records it; `agents.rollout.collect_rollouts`
    keeps it in the committed trajectory's `TurnInfo` and `agents.rollout.build_batch` trains it with the
    committed trajectory's reward: an attempt is judged by the outcome of the execution it informed.

    Attributes:
        segments: the attempt's whole token sequence as segments, from the first token of the episode: the
            committed context it was forked from carries no logprobs (context, never trained twice), the
            attempt's own ACT and (``inline`` mode) REHEARSE segments keep their sampling logprobs; it ends with
            the attempt's last generated segment.
        rehearsals: the attempt's ``separate``-mode rehearsal rows (empty in ``inline`` mode).
    """

    segments: list[Segment]
    rehearsals: list[RehearsalRecord] = field(default_factory=list)

    @property
    def generated_tokens(self) -> int:
        """ACT and REHEARSE tokens the attempt generated (its segments with logprobs and its rehearsal rows)."""
        inline = sum(len(s.token_ids) for s in self.segments if s.logprobs is not None)
        return inline + sum(len(r.token_ids) for r in self.rehearsals)

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible dict."""
        return {"segments": [s.to_dict() for s in self.segments], "rehearsals": [r.to_dict() for r in self.rehearsals]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AttemptRecord:
        """Inverse of `to_dict`."""
        return cls(
            segments=[Segment.from_dict(s) for s in d.get("segments", [])],
            rehearsals=[RehearsalRecord.from_dict(r) for r in d.get("rehearsals", [])],
        )


@dataclass
class TurnInfo:
    """What happened in one user turn of a trajectory (`agents.rollout.collect_rollouts` fills it).

    Attributes:
        turn: the 0-based user turn.
        steps: ACT messages played in the turn.
        empty_actions: how many of them were empty (the invalid-action penalty's count).
        rehearsals: the turn's ``separate``-mode rehearsal rows, in order (empty in ``inline`` mode).
        attempts: the private rehearsal attempts made before the turn's committed ACT steps (rehearsal-aware
            RL; empty otherwise).
        real_outputs: the turn's tool outputs answered by the real backend, in order (world-model targets; empty
            for a rehearsed or null rollout).
    """

    turn: int
    steps: int = 0
    empty_actions: int = 0
    rehearsals: list[RehearsalRecord] = field(default_factory=list)
    attempts: list[AttemptRecord] = field(default_factory=list)
    real_outputs: list[RealOutputRecord] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible dict."""
        return {
            "turn": self.turn,
            "steps": self.steps,
            "empty_actions": self.empty_actions,
            "rehearsals": [r.to_dict() for r in self.rehearsals],
            "attempts": [a.to_dict() for a in self.attempts],
            "real_outputs": [r.to_dict() for r in self.real_outputs],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TurnInfo:
        """Inverse of `to_dict`."""
        return cls(
            turn=int(d.get("turn", 0)),
            steps=int(d.get("steps", 0)),
            empty_actions=int(d.get("empty_actions", 0)),
            rehearsals=[RehearsalRecord.from_dict(r) for r in d.get("rehearsals", [])],
            attempts=[AttemptRecord.from_dict(a) for a in d.get("attempts", [])],
            real_outputs=[RealOutputRecord.from_dict(r) for r in d.get("real_outputs", [])],
        )


@dataclass
class Trajectory:
    """One episode on one task: its token segments, its messages and its outcome.

    Attributes:
        task: the task played.
        segments: the token sequence as role-tagged segments, in order (may be empty for text-only envs).
        messages: the chat history in the OpenAI format, in order.
        reward: the scalar outcome reward R(τ) from the task's verifier (0.0 until the episode ends).
        terminated: the last user turn was answered.
        truncated: a step limit or token budget ended the episode first.
        turn_info: one `TurnInfo` per user turn reached (filled by `agents.rollout.collect_rollouts`).
    """

    task: Task
    segments: list[Segment] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    turn_info: list[TurnInfo] = field(default_factory=list)

    @property
    def token_ids(self) -> list[int]:
        """All segments' ids concatenated, `(T,)`."""
        return [t for s in self.segments for t in s.token_ids]

    @property
    def role_mask(self) -> list[int]:
        """One `Role` value per token, `(T,)`; partitions the sequence by construction."""
        return [int(s.role) for s in self.segments for _ in s.token_ids]

    def _turns(self) -> list[list[Message]]:
        """The assistant messages of each user turn. A turn starts with the first message and with every
        user or system message right after a closing assistant message (one without tool calls: the envs
        open the next turn only then; a message inserted before a pending ACT step follows a user or tool
        message instead, so it stays in its turn)."""
        turns: list[list[Message]] = [[]]
        previous: Message | None = None
        for m in self.messages:
            if m.role == "assistant":
                turns[-1].append(m)
            elif (
                m.role in ("user", "system")
                and previous is not None
                and previous.role == "assistant"
                and not previous.tool_calls
            ):
                turns.append([])
            previous = m
        return turns

    def calls_per_turn(self) -> list[list[list[ToolCall]]]:
        """The parsed ACT calls, turns × steps × calls, read from the assistant messages' ``tool_calls`` (a
        message whose calls did not parse counts as a step without calls); what a call-replay verifier
        replays."""
        return [[list(m.tool_calls or []) for m in turn] for turn in self._turns()]

    def final_responses(self) -> list[str]:
        """The text of the last ACT message of each user turn that has one, in turn order (for a closed
        turn, its closing message; for an unfinished last turn, its latest ACT message)."""
        return [turn[-1].content for turn in self._turns() if turn]

    def tokens_per_role(self) -> dict[str, int]:
        """Token counts keyed by role name (every role listed, zeros included)."""
        counts = {r.name: 0 for r in Role}
        for s in self.segments:
            counts[s.role.name] += len(s.token_ids)
        return counts

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible dict (one JSON Lines record)."""
        return {
            "task": self.task.to_dict(),
            "segments": [s.to_dict() for s in self.segments],
            "messages": [m.to_dict() for m in self.messages],
            "reward": self.reward,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "turn_info": [t.to_dict() for t in self.turn_info],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        """Inverse of `to_dict`."""
        return cls(
            task=Task.from_dict(d["task"]),
            segments=[Segment.from_dict(s) for s in d.get("segments", [])],
            messages=[Message.from_dict(m) for m in d.get("messages", [])],
            reward=float(d.get("reward", 0.0)),
            terminated=bool(d.get("terminated", False)),
            truncated=bool(d.get("truncated", False)),
            turn_info=[TurnInfo.from_dict(t) for t in d.get("turn_info", [])],
        )


class GeneratedText(str):
    """A `str` that also carries the token ids and logprobs it was generated as (token in, token out).

    An agent passes its ACT message to `env.step` as a `GeneratedText` so that token-level environments
    record exactly the generated ids and their sampling logprobs instead of re-tokenising the text
    (docs/design.md §3). To every text-level consumer it is a plain string.

    Attributes:
        token_ids: the generated ids `(C,)`, including the end-of-message token if generation stopped on it.
        logprobs: the sampling policy's logprob per id `(C,)`, or None.
        stopped: False when generation hit its ``max_new_tokens`` before a stop token (the message was cut).
    """

    token_ids: list[int]
    logprobs: list[float] | None
    stopped: bool

    def __new__(
        cls, text: str, token_ids: list[int], logprobs: list[float] | None = None, stopped: bool = True
    ) -> GeneratedText:
        obj = super().__new__(cls, text)
        if logprobs is not None and len(logprobs) != len(token_ids):
            raise ValueError(f"{len(token_ids)} token ids but {len(logprobs)} logprobs; they must match")
        obj.token_ids = list(token_ids)
        obj.logprobs = list(logprobs) if logprobs is not None else None
        obj.stopped = bool(stopped)
        return obj
