"""Rollout collection and batching: drive a `RehearseVectorEnv` with the policy, then fill a `RolloutBatch`.

Two steps (the split of SB3's ``OnPolicyAlgorithm.collect_rollouts`` / ``RolloutBuffer``, as Stable-Baselines3 splits
them):

* `collect_rollouts(policy, vector_env, task_ids, group_size, ...)`: B instructions × K samples = B·K
  episodes, one env each, stepped in lockstep. Every step makes ONE batched `policy.act` over the active
  envs' token contexts and one `vector_env.step` (which itself batches the rehearsals of every env;
  docs/design.md §3, "Batch the model, not the env"). Returns the B·K `Trajectory` objects in group-major order
  (index ``b * K + k``), so ``group_ids = [i // K for i in range(B * K)]`` (`group_ids_for`).
* `build_batch(trajectories, group_ids, ...)`: the padded training tensors (`RolloutBatch`), built from the
  recorded token ids and logprobs only (token in, token out: nothing is re-rendered or re-tokenised), with
  the role-wise (or plain) GRPO advantages of `agents.grpo` broadcast to the tokens of each segment.

Sources: EnvACE (Xu et al., 2026, arXiv 2608.06197) as docs/design.md §1 and §3 describe it; the invalid-action
penalty (0.1 for an empty response) is the reference hyperparameter listed in docs/design.md §1.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

import numpy as np
import torch

from agents.grpo import AdvantageEstimator, Weighting, advantage_estimator, segment_advantages_to_tokens
from envace_gym.responders import ConstantResponse, Hybrid, RealBackend, Rehearsal
from envace_gym.types import RealOutputRecord, Role, Trajectory, TurnInfo

__all__ = [
    "RolloutBatch",
    "RolloutStats",
    "ActPolicy",
    "collect_rollouts",
    "build_batch",
    "with_demonstrations",
    "group_ids_for",
    "is_empty_action",
    "PAD_ROLE",
]

PAD_ROLE = -1
"""``role_mask`` value of right-padding positions (every real token holds a `Role` value, 0-4)."""

RowKind = Literal["trajectory", "rehearsal", "attempt", "world_model", "demonstration"]
_DEMONSTRATION: RowKind = "demonstration"
PromptMode = Literal["inline", "separate"]
RolloutMode = Literal["rehearse", "real", "null", "hybrid"]

_TRAINABLE = (Role.ACT, Role.REHEARSE)


class ActPolicy(Protocol):
    """What `collect_rollouts` needs from a policy: `agents.policy.Policy.act`."""

    def act(
        self,
        contexts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        seeds: Sequence[int | None] | None,
    ) -> Sequence[str]: ...


def group_ids_for(num_groups: int, group_size: int) -> list[int]:
    """Group id of each of the B·K trajectories `collect_rollouts` returns: ``[i // K for i in range(B * K)]``.

    Regroups ``(B, K)`` (instruction, sample) into the flat ``(B·K,)`` order ``b * K + k``.
    """
    return [i // group_size for i in range(num_groups * group_size)]


def is_empty_action(action: str) -> bool:
    """True for an empty ACT response: no text once the stop token is dropped, or whitespace only.

    `agents.policy.Policy.act` already decodes without the trailing end-of-message id, so a response made
    of the stop token alone is the empty string here.
    """
    return str(action).strip() == ""


# ---------------------------------------------------------------------------------------------------------
# Collection
# ---------------------------------------------------------------------------------------------------------


@dataclass
class RolloutStats:
    """What `collect_rollouts` reports beside the trajectories (lists are per trajectory, in its B·K order).

    Attributes:
        group_ids: the group (task index) of each trajectory.
        task_ids: the task id of each trajectory.
        verifier_rewards: R_verifier of each trajectory, before the invalid-action penalty.
        rewards: R of each trajectory, penalised (what the advantages use; equal to ``Trajectory.reward``).
        empty_actions: empty ACT responses per trajectory.
        num_steps: vector-env steps taken.
        num_act_calls: batched ACT generate calls.
        num_capped: trajectories cut by ``max_steps`` (truncated, R_verifier 0).
        truncated: trajectories that ended truncated.
        cut_generations: generated messages per trajectory that reached their ``max_new_tokens``.
        budget_hit: per trajectory, whether it was truncated or had a cut generation.
        mean_tokens: mean token-sequence length.
        rollout: ``"rehearse"``, ``"real"``, ``"null"`` or ``"hybrid"``.
        real_tool_calls: executions on a real backend while the rollouts were played, the environment cost
            (every parsed ACT call for ``rollout="real"``; for ``"hybrid"`` the calls drawn real and the
            rehearsed calls executed before them to catch the backend up, `envace_gym.responders.Hybrid`; 0 for
            ``"rehearse"``, where the REHEARSE role answers them, and for ``"null"``, where a constant does).
        real_answers: calls whose output the policy saw came from a real backend (``"real"``: equal to
            ``real_tool_calls``; ``"hybrid"``: the calls drawn real; 0 otherwise).
        verifier_replay_calls: the parsed ACT calls of every terminated trajectory (a truncated one is not
            verified: its R is 0), i.e. the calls a call-replay verifier (the lab's, BFCL's multi-turn, τ²'s)
            replays on fresh real backends to score the batch; a verifier may execute each more than once
            (τ²'s evaluator replays them a second time, and its reference actions), and a suite whose
            verifier replays nothing (``mcp``) executes none of them. Counted apart from
            ``real_tool_calls``: a rehearsing rollout needs these and nothing else from the real world.
        generated_tokens: ACT and REHEARSE tokens generated per trajectory: its committed segments with
            logprobs, its ``separate``-mode rehearsal rows and its rehearsal attempts (the compute a
            comparison at equal generated tokens counts).
        attempt_tokens: of those, the ones generated in rehearsal attempts (0 without ``rehearsal_n``).
    """

    group_ids: list[int]
    task_ids: list[str]
    verifier_rewards: list[float]
    rewards: list[float]
    empty_actions: list[int]
    num_steps: int
    num_act_calls: int
    num_capped: int
    truncated: int
    cut_generations: list[int]
    budget_hit: list[bool]
    mean_tokens: float
    rollout: str
    real_tool_calls: int = 0
    real_answers: int = 0
    verifier_replay_calls: int = 0
    generated_tokens: list[int] = field(default_factory=list)
    attempt_tokens: list[int] = field(default_factory=list)

    @property
    def reward_mean(self) -> float:
        """The mean penalised reward."""
        return float(np.mean(self.rewards))

    @classmethod
    def concat(cls, parts: Sequence[RolloutStats]) -> RolloutStats:
        """The stats of the rollouts of ``parts`` played as one (data-parallel shards, in rank order).

        Lists are concatenated (group ids offset so each shard's groups stay distinct), counts summed,
        ``num_steps`` is the longest shard's and ``mean_tokens`` the trajectory-weighted mean.

        Raises:
            ValueError: no parts, or parts of different ``rollout`` modes.
        """
        if not parts:
            raise ValueError("concat needs at least one RolloutStats")
        if len({p.rollout for p in parts}) != 1:
            raise ValueError(f"cannot concat rollouts of different modes: {sorted({p.rollout for p in parts})}")
        group_ids: list[int] = []
        offset = 0
        for p in parts:
            group_ids += [g + offset for g in p.group_ids]
            offset += (max(p.group_ids) + 1) if p.group_ids else 0
        sizes = [len(p.rewards) for p in parts]
        return cls(
            group_ids=group_ids,
            task_ids=[t for p in parts for t in p.task_ids],
            verifier_rewards=[r for p in parts for r in p.verifier_rewards],
            rewards=[r for p in parts for r in p.rewards],
            empty_actions=[e for p in parts for e in p.empty_actions],
            num_steps=max(p.num_steps for p in parts),
            num_act_calls=sum(p.num_act_calls for p in parts),
            num_capped=sum(p.num_capped for p in parts),
            truncated=sum(p.truncated for p in parts),
            cut_generations=[c for p in parts for c in p.cut_generations],
            budget_hit=[b for p in parts for b in p.budget_hit],
            mean_tokens=float(np.average([p.mean_tokens for p in parts], weights=sizes)) if sum(sizes) else 0.0,
            rollout=parts[0].rollout,
            real_tool_calls=sum(p.real_tool_calls for p in parts),
            real_answers=sum(p.real_answers for p in parts),
            verifier_replay_calls=sum(p.verifier_replay_calls for p in parts),
            generated_tokens=[g for p in parts for g in p.generated_tokens],
            attempt_tokens=[a for p in parts for a in p.attempt_tokens],
        )


def collect_rollouts(
    policy: ActPolicy,
    vector_env: Any,
    task_ids: Sequence[str],
    group_size: int,
    *,
    max_new_tokens: int = 256,
    temperature: float = 1.0,
    seed: int = 0,
    rollout: RolloutMode = "rehearse",
    max_steps_per_turn: int | None = None,
    max_steps: int | None = None,
    invalid_action_penalty: float = 0.1,
    first_env: int = 0,
    num_global_envs: int | None = None,
    rehearsal_n: int = 0,
    rehearsal_mode: Literal["parallel", "sequential"] = "parallel",
    rehearsal_memory: Literal["trace", "outcomes"] = "trace",
    rehearsal_restate_request: bool = False,
    rehearsal_memory_tokens: int = 256,
    real_call_prob: float | None = None,
) -> tuple[list[Trajectory], RolloutStats]:
    """Play K episodes of each of B tasks through a `RehearseVectorEnv` with ``num_envs == B·K``.

    Env ``i = b * K + k`` plays ``task_ids[b]`` (the vector env is reset with
    ``options={"task_ids": [t for t in task_ids for _ in range(K)]}`` and ``seed=seed``, so env i gets seed
    ``seed + i``). Each round: the contexts are the active envs' ``trajectory.token_ids`` (which end with the
    assistant opener after every non-final step, so they ARE the ACT contexts), ONE batched ``policy.act``
    answers all of them, and one ``vector_env.step`` plays the actions (rehearsals batched inside).

    Finished envs (terminated or truncated). Their `Trajectory` object is kept at the step they end and they get
    no model call again: a finished env is passed the action ``None``, which `RehearseVectorEnv.step` leaves
    out of the step (no step, no autoreset), so it is neither reset nor played again; the loop stops as soon
    as every env has finished.

    Invalid-action penalty (docs/design.md §1: 0.1 for an empty response). An ACT response that is empty
    (`is_empty_action`: only the stop token, or whitespace) makes the trajectory's reward
    ``R = R_verifier - invalid_action_penalty``, once per trajectory however many empty responses it has
    (so R stays in [-penalty, 1]). ``Trajectory.reward`` holds the penalised R (what the advantages use);
    ``stats.verifier_rewards`` the unpenalised ones. A truncated episode has ``R_verifier = 0``.

    Rehearsal rows (``separate`` prompt mode). The env keeps each rehearsal's simulator prompt and
    completion in ``env.rehearsal_rows`` (the ACT row holds the rehearsed text as OBSERVATION tokens only).
    They are carried with the trajectory in ``trajectory.turn_info``: one `envace_gym.types.TurnInfo` per
    user turn reached (its step count, empty actions and `RehearsalRecord` rows, as the env recorded them).
    In ``inline`` mode the REHEARSE segments are already in ``trajectory.segments`` and ``rehearsals`` is
    empty. `build_batch` reads these rows; everything is JSON-compatible (`Trajectory.to_dict`). The tool outputs
    a real backend answered (``rollout="real"`` or ``"hybrid"``) are carried the same way, in ``TurnInfo.real_outputs``
    (`envace_gym.types.RealOutputRecord`, the env's ``real_outputs``): `build_batch` makes them world-model targets
    when asked.

    Hybrid rollouts (``rollout="hybrid"``). Env i gets ``Hybrid(env.rehearser, real_call_prob, seed=s_i)`` with
    ``s_i`` drawn from ``(seed, first_env + i)``: each tool call is answered by the real backend with probability
    ``real_call_prob``, independently, else by the REHEARSE role (batched as in ``"rehearse"``); a real answer first
    executes the episode's rehearsed calls not yet executed, so the backend reflects the trajectory
    (`envace_gym.responders.Hybrid`). The same seed draws the same calls real.

    Rehearsal-aware rollouts (``rehearsal_n > 0``), so the policy learns both to rehearse usefully and to act on
    what it rehearsed. At the opening of every user turn (after the reset, and after each step that opens a new
    turn) each env first runs ``rehearsal_n`` private rehearsal attempts of the turn and gets their memory
    (``rehearsal_memory``'s layout) inserted before its committed ACT step (`wrappers.TestTimeRehearsal` over the env,
    ``keep_attempt_rows=True``; the attempts' calls are answered by the env's rehearser, or by a constant for
    ``rollout="null"``), so a rollout is the attempts, the memory and the committed execution. The attempts of
    all envs are batched (`agents.engines.batching.BatchCoordinator`); env i's attempts are seeded from
    ``(seed, first_env + i)``. Each attempt is kept as an `envace_gym.types.AttemptRecord` in the turn's
    ``TurnInfo.attempts``; `build_batch` trains its ACT and REHEARSE tokens with the committed trajectory's reward.
    The memory is context (no loss).

    Temperature. ``old_logprobs`` are ``log_softmax(logits / temperature)`` (`agents.engines.generation`): ACT
    tokens at ``temperature``, REHEARSE tokens at the env's rehearsal ``temperature``. A warning is issued
    when they differ, since one recomputation temperature cannot then match both. Temperature 0 (greedy)
    records ``log_softmax(logits)``: recompute it at temperature 1.

    Args:
        policy: anything with `agents.policy.Policy.act`'s signature (`ActPolicy`); its actions are passed to
            the env as they come (`GeneratedText` records ids and logprobs; a plain ``str`` is tokenised by
            the env and carries no logprobs, hence no loss).
        vector_env: a `envace_gym.envs.rehearse_vector.RehearseVectorEnv` (or a vector wrapper of one) with
            ``num_envs == len(task_ids) * group_size``.
        task_ids: the B task ids (repeats allowed: groups are positions, not ids).
        group_size: K >= 1 samples per task (K = 1 gives zero advantages; see `agents.grpo`).
        max_new_tokens: cap on each ACT response.
        temperature: ACT sampling temperature (0: greedy).
        seed: reset seed (env i gets ``seed + i``, which also seeds its rehearsals) and the seed of the ACT
            sampling seeds (one stream per env, independent of which other envs are still active).
        rollout: ``"rehearse"`` (EnvACE: tool calls answered by the policy's REHEARSE role) or ``"real"``
            (the real-environment ablation: each env gets the responder ``RealBackend()``, its suite's backend
            before the reset, as `wrappers.RealTools` does; tool outputs are OBSERVATION segments, no loss).
            ``"rehearse"`` sets ``Rehearsal(env.rehearser)``; ``"null"`` (the null-rehearser control) sets
            `envace_gym.responders.ConstantResponse`: every call is answered with the same uninformative text,
            an OBSERVATION segment; ``"hybrid"`` draws per call between the real backend and the REHEARSE role
            (above; needs ``real_call_prob``). Each overrides what was set before.
        max_steps_per_turn: when given, sets each env's ``max_steps_per_turn`` (ACT messages per user turn
            before truncation); None keeps the env's.
        max_steps: cap on vector steps (a safety net, off by default); envs still running then are marked
            truncated with verifier reward 0 (``stats.num_capped``). None: no cap: the env's per-turn step
            limit ends every episode, as BFCL's harness does, and is the budget to set.
        invalid_action_penalty: >= 0, subtracted once from R of a trajectory with an empty ACT response.
        first_env: data-parallel sharding: these B·K envs are envs ``first_env .. first_env + B·K - 1`` of a
            rollout of ``num_global_envs`` envs (each process plays a contiguous shard of whole groups). Each
            env gets the reset seed and the sampling seeds that env would get in the whole rollout, so the
            shards together play what one process would (up to floating-point differences between batch
            shapes).
        num_global_envs: the whole rollout's env count (None: B·K, no sharding).
        rehearsal_n: private rehearsal attempts per user turn before the committed steps (0: none; see above).
        rehearsal_mode: ``"parallel"`` or ``"sequential"`` attempts (`wrappers.TestTimeRehearsal`).
        rehearsal_memory: the memory's layout, ``"trace"`` or ``"outcomes"`` (the wrapper's ``memory``).
        rehearsal_restate_request: the turn's request again after the memory (the wrapper's ``restate_request``).
        rehearsal_memory_tokens: bound on each memory, in tokens.
        real_call_prob: ``rollout="hybrid"``: p in [0, 1], the probability that a call is answered by the real
            backend; None for every other rollout.

    Returns:
        ``(trajectories, stats)``: the B·K trajectories (group-major, `group_ids_for`) and their
        `RolloutStats` (per-trajectory lists of shape (B·K,), counts, ``cut_generations``: ACT messages and
        rehearsals of each episode that hit their ``max_new_tokens``, the env's ``cut_generations``).

    Raises:
        ValueError: empty ``task_ids``, ``group_size < 1``, ``num_envs != B·K``, negative penalty, an unknown
            ``rollout``, ``max_steps < 1``, a shard outside ``num_global_envs``, a negative ``rehearsal_n``,
            ``real_call_prob`` missing or outside [0, 1] for ``"hybrid"`` or given for another rollout, or a
            policy returning the wrong number of actions.
        TypeError: ``vector_env`` has no ``envs`` (not a `RehearseVectorEnv`).
        KeyError: a task id unknown to the envs (from ``ToolUseEnv.reset``).
    """
    if not task_ids:
        raise ValueError("task_ids must name at least one task")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if invalid_action_penalty < 0:
        raise ValueError(f"invalid_action_penalty must be >= 0, got {invalid_action_penalty}")
    if rollout not in get_args(RolloutMode):
        raise ValueError(f"rollout must be one of {get_args(RolloutMode)}, got {rollout!r}")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps must be None or >= 1, got {max_steps}")
    if isinstance(rehearsal_n, bool) or not isinstance(rehearsal_n, int) or rehearsal_n < 0:
        raise ValueError(f"rehearsal_n must be an int >= 0, got {rehearsal_n!r}")
    if rollout == "hybrid" and (real_call_prob is None or not 0 <= real_call_prob <= 1):
        raise ValueError(f"rollout='hybrid' needs real_call_prob in [0, 1], got {real_call_prob!r}")
    if rollout != "hybrid" and real_call_prob is not None:
        raise ValueError(f"real_call_prob is for rollout='hybrid' only; rollout={rollout!r} got {real_call_prob!r}")
    base = getattr(vector_env, "unwrapped", vector_env)
    envs = getattr(base, "envs", None)
    if envs is None:
        raise TypeError(f"vector_env must be a RehearseVectorEnv (with .envs), got {type(base).__name__}")
    envs = [getattr(e, "unwrapped", e) for e in envs]  # Gymnasium 1.x wrappers do not forward attributes
    n = len(task_ids) * group_size
    if len(envs) != n:
        raise ValueError(
            f"vector_env has num_envs={len(envs)} but B·K = {len(task_ids)}·{group_size} = {n}; they must match"
        )
    rehearsal_temps = {float(getattr(e, "temperature", temperature)) for e in envs}
    if rollout in ("rehearse", "hybrid") and rehearsal_temps != {float(temperature)}:
        warnings.warn(
            f"ACT temperature {temperature} differs from the envs' rehearsal temperature(s) {sorted(rehearsal_temps)}: "
            "old_logprobs of ACT and REHEARSE tokens are then at different temperatures",
            stacklevel=2,
        )
    total = n if num_global_envs is None else num_global_envs
    if first_env < 0 or first_env + n > total:
        raise ValueError(f"envs {first_env}..{first_env + n - 1} are not inside a rollout of {total} envs")
    for i, env in enumerate(envs):
        if rollout == "hybrid":
            assert real_call_prob is not None  # checked above
            # its own stream per env of the whole rollout, apart from the rehearsal attempts' (seed, env) stream
            draws = int(np.random.SeedSequence([seed, first_env + i, 1]).generate_state(1)[0])
            env.set_responder(Hybrid(env.rehearser, real_call_prob, seed=draws))
        else:
            env.set_responder(
                RealBackend()
                if rollout == "real"
                else ConstantResponse()
                if rollout == "null"
                else Rehearsal(env.rehearser)
            )
        if max_steps_per_turn is not None:
            env.max_steps_per_turn = max_steps_per_turn

    env_task_ids = [t for t in task_ids for _ in range(group_size)]
    rehearse_turns = (
        _turn_rehearsals(
            policy,
            envs,
            rollout,
            rehearsal_n,
            rehearsal_mode,
            rehearsal_memory,
            rehearsal_restate_request,
            rehearsal_memory_tokens,
            temperature,
            max_new_tokens,
            seed,
            first_env,
        )
        if rehearsal_n
        else None
    )
    vector_env.reset(seed=seed + first_env, options={"task_ids": env_task_ids})
    rng = np.random.default_rng(seed)
    done = [False] * n
    results: list[Trajectory | None] = [None] * n
    turns = [0] * n
    turn_info: list[list[TurnInfo]] = [[TurnInfo(turn=0)] for _ in range(n)]
    if rehearse_turns is not None:
        rehearse_turns(list(range(n)), turn_info)
    rows_seen = [0] * n
    real_seen = [0] * n
    empty = [0] * n
    cut = [0] * n
    backend_calls = [0] * n  # hybrid: per trajectory, read from its responder when it ends
    real_answers = [0] * n
    num_steps = num_act_calls = num_capped = 0

    def finish(i: int) -> None:
        env = envs[i]
        cut[i] = int(getattr(env, "cut_generations", 0))
        if isinstance(env.responder, Hybrid):
            backend_calls[i], real_answers[i] = env.responder.backend_calls, env.responder.real_answers

    while not all(done):
        if max_steps is not None and num_steps >= max_steps:
            for i in range(n):
                if not done[i]:
                    traj = envs[i].trajectory
                    traj.truncated, traj.reward = True, 0.0
                    results[i], done[i] = traj, True
                    finish(i)
                    num_capped += 1
            break
        # one draw per env of the whole rollout per step, active or not: (num_global_envs,), this shard's slice
        step_seeds = rng.integers(0, 2**31 - 1, size=total)[first_env : first_env + n]
        active = [i for i in range(n) if not done[i]]
        contexts = [envs[i].trajectory.token_ids for i in active]
        outputs = policy.act(
            contexts, max_new_tokens=max_new_tokens, temperature=temperature, seeds=[int(step_seeds[i]) for i in active]
        )
        num_act_calls += 1
        if len(outputs) != len(active):
            raise ValueError(f"policy.act returned {len(outputs)} actions for {len(active)} contexts")
        actions: list[str | None] = [None] * n  # None: a finished trajectory's env is left as it is
        for i, out in zip(active, outputs):
            actions[i] = out
            if is_empty_action(out):
                empty[i] += 1
                turn_info[i][-1].empty_actions += 1
            turn_info[i][-1].steps += 1
        _, _, terminated, truncated, infos = vector_env.step(actions)
        num_steps += 1
        opened: list[int] = []
        for i in active:
            env = envs[i]
            rows = getattr(env, "rehearsal_rows", [])
            turn_info[i][-1].rehearsals.extend(rows[rows_seen[i] :])
            rows_seen[i] = len(rows)
            real = getattr(env, "real_outputs", [])
            turn_info[i][-1].real_outputs.extend(real[real_seen[i] :])
            real_seen[i] = len(real)
            if terminated[i] or truncated[i]:
                results[i], done[i] = env.trajectory, True
                finish(i)
                continue
            new_turn = int(infos["turn"][i]) if "turn" in infos else turns[i]
            if new_turn != turns[i]:
                turns[i] = new_turn
                turn_info[i].append(TurnInfo(turn=new_turn))
                opened.append(i)
        if rehearse_turns is not None and opened:
            rehearse_turns(opened, turn_info)

    trajectories: list[Trajectory] = []
    verifier_rewards: list[float] = []
    for i, traj in enumerate(results):
        assert traj is not None
        verifier_rewards.append(float(traj.reward))
        if empty[i]:
            traj.reward = float(traj.reward) - invalid_action_penalty
        traj.turn_info = turn_info[i]
        trajectories.append(traj)
    rewards = [t.reward for t in trajectories]
    calls = [sum(len(step) for turn in t.calls_per_turn() for step in turn) for t in trajectories]
    stats = RolloutStats(
        group_ids=group_ids_for(len(task_ids), group_size),
        task_ids=env_task_ids,
        verifier_rewards=verifier_rewards,
        rewards=rewards,
        empty_actions=empty,
        num_steps=num_steps,
        num_act_calls=num_act_calls,
        num_capped=num_capped,
        truncated=sum(t.truncated for t in trajectories),
        cut_generations=cut,
        budget_hit=[bool(t.truncated or c) for t, c in zip(trajectories, cut)],
        mean_tokens=float(np.mean([len(t.token_ids) for t in trajectories])),
        rollout=rollout,
        real_tool_calls=sum(calls) if rollout == "real" else sum(backend_calls),
        real_answers=sum(calls) if rollout == "real" else sum(real_answers),
        verifier_replay_calls=sum(c for t, c in zip(trajectories, calls) if t.terminated),
        generated_tokens=[_generated_tokens(t) for t in trajectories],
        attempt_tokens=[sum(a.generated_tokens for e in t.turn_info for a in e.attempts) for t in trajectories],
    )
    return trajectories, stats


def _generated_tokens(traj: Trajectory) -> int:
    """ACT and REHEARSE tokens generated for `traj`: committed segments with logprobs, separate-mode rehearsal
    rows, rehearsal attempts."""
    committed = sum(len(s.token_ids) for s in traj.segments if s.role in _TRAINABLE and s.logprobs is not None)
    rows = sum(len(r.token_ids) for e in traj.turn_info for r in e.rehearsals)
    return committed + rows + sum(a.generated_tokens for e in traj.turn_info for a in e.attempts)


def _turn_rehearsals(
    policy: Any,
    envs: Sequence[Any],
    rollout: str,
    n: int,
    mode: Literal["parallel", "sequential"],
    memory: Literal["trace", "outcomes"],
    restate_request: bool,
    memory_tokens: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    first_env: int,
) -> Any:
    """The hook `collect_rollouts` calls with the envs that open a user turn: runs their rehearsal attempts
    (batched across envs), inserts each memory and keeps the attempts in the turn's `TurnInfo`."""
    from agents.engines.batching import BatchCoordinator, coalesced
    from wrappers.test_time_rehearsal import TestTimeRehearsal

    wrappers = []
    for i, env in enumerate(envs):
        rehearser = env.rehearser  # the ACT policy's own REHEARSE role, or the per-role rehearse model's
        wrappers.append(
            TestTimeRehearsal(
                env,
                policy,
                n=n,
                mode=mode,
                memory=memory,
                restate_request=restate_request,
                memory_tokens=memory_tokens,
                rehearser_policy=rehearser,
                attempt_temperature=temperature,
                max_new_tokens=max_new_tokens,  # the committed ACT steps' cap; rehearsals keep the env's
                rehearse_max_new_tokens=env.max_new_tokens,
                seed=int(np.random.SeedSequence([seed, first_env + i]).generate_state(1)[0]),
                attempt_outputs="null" if rollout == "null" else "rehearsed",
                keep_attempt_rows=True,
            )
        )
    engines = [policy, getattr(envs[0].rehearser, "policy", None)] if envs else [policy]

    def rehearse(indices: list[int], turn_info: list[list[TurnInfo]]) -> None:
        batcher = BatchCoordinator()
        with coalesced(engines, batcher):
            batcher.run([wrappers[i].rehearse for i in indices])
        for i in indices:  # an attempt that generated nothing with logprobs (plain-text actions) trains nothing
            turn_info[i][-1].attempts.extend(a for a in wrappers[i].attempt_rows if a.generated_tokens)

    return rehearse


# ---------------------------------------------------------------------------------------------------------
# Batching
# ---------------------------------------------------------------------------------------------------------


@dataclass
class RolloutBatch:
    """Padded training tensors of one rollout batch (every shape written down).

    N rows of T tokens, right-padded. Inline mode: N = number of trajectories (B·K from `collect_rollouts`),
    one row each. Separate mode: the B·K ACT rows first (row i = trajectory i), then one row per rehearsal
    (simulator prompt + completion), in trajectory order then rehearsal order. Rehearsal-aware rollouts add,
    after those, one ``"attempt"`` row per rehearsal attempt (its context without loss, then its ACT and, inline,
    REHEARSE segments), each followed by its separate-mode rehearsal rows, in trajectory order. With world-model
    targets (`build_batch` ``world_model=True``) in ``separate`` mode, last, one ``"world_model"`` row per real tool
    output (the simulator prompt, then the output as a REHEARSE completion without logprobs). S = number of
    trainable segments (ACT/REHEARSE segments that have recorded logprobs) over all rows.

    Attributes:
        input_ids: ``(N, T) int64``, the recorded token ids; padding holds ``pad_id``.
        attention_mask: ``(N, T) int64``, 1 on real tokens, 0 on padding.
        role_mask: ``(N, T) int64``, the `envace_gym.types.Role` value of each token (PROMPT 0, ACT 1,
            REHEARSE 2, OBSERVATION 3, TEMPLATE 4); `PAD_ROLE` (-1) on padding. Partitions every row.
        loss_mask: ``(N, T) bool``, True on ACT/REHEARSE tokens that have recorded logprobs (never on
            padding, prompt, template or observation tokens, nor on plain-text actions without logprobs).
        old_logprobs: ``(N, T) float32``, the logprob recorded at generation for each loss token
            (position t = log p(ids[t] | ids[:t]), as `agents.training.logprobs.token_logprobs` returns); 0 elsewhere.
        advantages: ``(N, T) float32``, the segment advantage on each token of its segment; 0 outside
            ``loss_mask``.
        segment_ids: ``(N, T) int64``, index in ``[0, S)`` of the trainable segment of each token; -1 elsewhere.
        group_ids: ``(N,) int64``, the group (instruction) of each row's trajectory.
        rewards: ``(N,) float32``, R(τ) of each row's trajectory (penalised; see `collect_rollouts`).
        traj_ids: ``(N,) int64``, the index of each row's trajectory in the input list.
        row_kinds: ``(N,)`` list of ``"trajectory"``, ``"rehearsal"``, ``"attempt"``, ``"world_model"`` or
            ``"demonstration"`` (`with_demonstrations`).
        task_ids: ``(N,)`` list of the row's task id.
        seg_rewards: ``(S,) float32``, R(τ) of each segment's trajectory.
        seg_group_ids: ``(S,) int64``.
        seg_roles: ``(S,) int64``, ``Role.ACT`` or ``Role.REHEARSE``.
        seg_traj_ids: ``(S,) int64``.
        seg_num_tokens: ``(S,) int64``.
        seg_advantages: ``(S,) float32``, from `agents.grpo.role_wise_advantages` (``algo="role_grpo"``) or
            `agents.grpo.grpo_advantages` (``algo="grpo"``).
        seg_rows: ``(S,) int64``, the row of each segment.
        world_model_mask: ``(N, T) bool``, True on the target tokens of real tool outputs (the world-model loss,
            `agents.grpo.world_model_loss`): inline, positions of the trajectory rows (OBSERVATION content and the
            close up to its stop token, never in ``loss_mask``); separate, the completions of the
            ``"world_model"`` rows; the REHEARSE tokens of ``"demonstration"`` rows (`with_demonstrations`). All False
            without world-model targets; None only in a batch built by hand.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    role_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    segment_ids: torch.Tensor
    group_ids: torch.Tensor
    rewards: torch.Tensor
    traj_ids: torch.Tensor
    row_kinds: list[RowKind] = field(default_factory=list)
    task_ids: list[str] = field(default_factory=list)
    seg_rewards: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    seg_group_ids: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    seg_roles: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    seg_traj_ids: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    seg_num_tokens: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    seg_advantages: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    seg_rows: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    world_model_mask: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        """N."""
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        """T."""
        return int(self.input_ids.shape[1])

    def to(self, device: torch.device | str) -> RolloutBatch:
        """A copy with every tensor on `device` (lists are shared)."""
        moved: dict[str, Any] = {
            k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()
        }
        return RolloutBatch(**moved)

    def select(self, rows: Sequence[int] | torch.Tensor) -> RolloutBatch:
        """The rows `rows` (a minibatch); per-segment arrays keep only those rows' segments.

        ``segment_ids`` is renumbered into the kept segments; padding columns are not trimmed.
        """
        idx = torch.as_tensor(rows, dtype=torch.long)
        keep = torch.isin(self.seg_rows, idx)  # (S,)
        old_to_new = torch.full((self.seg_rows.shape[0] + 1,), -1, dtype=torch.long)
        old_to_new[:-1][keep] = torch.arange(int(keep.sum()))
        row_map = torch.full((self.num_rows,), -1, dtype=torch.long)
        row_map[idx] = torch.arange(idx.shape[0])
        seg_ids = old_to_new[self.segment_ids[idx]]  # -1 indexes the trailing -1
        return RolloutBatch(
            input_ids=self.input_ids[idx],
            attention_mask=self.attention_mask[idx],
            role_mask=self.role_mask[idx],
            loss_mask=self.loss_mask[idx],
            old_logprobs=self.old_logprobs[idx],
            advantages=self.advantages[idx],
            segment_ids=seg_ids,
            group_ids=self.group_ids[idx],
            rewards=self.rewards[idx],
            traj_ids=self.traj_ids[idx],
            row_kinds=[self.row_kinds[i] for i in idx.tolist()],
            task_ids=[self.task_ids[i] for i in idx.tolist()],
            seg_rewards=self.seg_rewards[keep],
            seg_group_ids=self.seg_group_ids[keep],
            seg_roles=self.seg_roles[keep],
            seg_traj_ids=self.seg_traj_ids[keep],
            seg_num_tokens=self.seg_num_tokens[keep],
            seg_advantages=self.seg_advantages[keep],
            seg_rows=row_map[self.seg_rows[keep]],
            world_model_mask=None if self.world_model_mask is None else self.world_model_mask[idx],
        )


@dataclass
class _Row:
    kind: RowKind
    traj: int
    pieces: list[tuple[Role, list[int], list[float] | None]]
    targets: list[tuple[int, int]] = field(default_factory=list)  # world-model (start, length) spans


def _inline_targets(i: int, traj: Trajectory, records: Sequence[RealOutputRecord]) -> list[tuple[int, int]]:
    """The (start, length) spans of trajectory `i`'s real outputs in its own row, each checked against its ids."""
    ids = traj.token_ids
    spans = []
    for r in records:
        if r.start is None or r.prompt_ids is not None:
            raise ValueError(f"a real output of trajectory {i} is a separate-mode record but prompt_mode='inline'")
        if r.start < 1 or ids[r.start : r.start + len(r.token_ids)] != list(r.token_ids):
            raise ValueError(
                f"a real output of trajectory {i} ({len(r.token_ids)} target ids at position {r.start}) does not match "
                "the trajectory's tokens there"
            )
        spans.append((r.start, len(r.token_ids)))
    return spans


def _rows(trajectories: Sequence[Trajectory], prompt_mode: PromptMode, world_model: bool = False) -> list[_Row]:
    real = [[r for entry in t.turn_info for r in entry.real_outputs] if world_model else [] for t in trajectories]
    rows = [
        _Row(
            "trajectory",
            i,
            [(s.role, list(s.token_ids), s.logprobs) for s in t.segments],
            _inline_targets(i, t, real[i]) if prompt_mode == "inline" else [],
        )
        for i, t in enumerate(trajectories)
    ]
    for i, t in enumerate(trajectories):
        has_rehearse_segment = any(s.role == Role.REHEARSE for s in t.segments)
        rehearsals = [r for entry in t.turn_info for r in entry.rehearsals]
        if prompt_mode == "inline" and rehearsals:
            raise ValueError(
                f"trajectory {i} carries separate-mode rehearsal rows in turn_info but prompt_mode='inline'"
            )
        if prompt_mode == "separate" and has_rehearse_segment:
            raise ValueError(f"trajectory {i} has inline REHEARSE segments but prompt_mode='separate'")
        for r in rehearsals:
            if r.prompt_ids is None:
                raise ValueError(f"a rehearsal row of trajectory {i} has no prompt_ids (not a separate-mode row)")
            rows.append(
                _Row(
                    "rehearsal",
                    i,
                    [(Role.PROMPT, list(r.prompt_ids), None), (Role.REHEARSE, list(r.token_ids), r.logprobs)],
                )
            )
    for i, t in enumerate(trajectories):
        for entry in t.turn_info:
            for a in entry.attempts:
                rows.append(_Row("attempt", i, [(s.role, list(s.token_ids), s.logprobs) for s in a.segments]))
                for r in a.rehearsals:
                    if prompt_mode == "inline" or r.prompt_ids is None:
                        raise ValueError(f"an attempt of trajectory {i} carries separate-mode rehearsal rows")
                    rows.append(
                        _Row(
                            "rehearsal",
                            i,
                            [(Role.PROMPT, list(r.prompt_ids), None), (Role.REHEARSE, list(r.token_ids), r.logprobs)],
                        )
                    )
    if prompt_mode == "separate":
        for i, records in enumerate(real):
            for out in records:
                if out.prompt_ids is None:
                    raise ValueError(f"a real output of trajectory {i} has no prompt_ids (not a separate-mode record)")
                pieces: list[tuple[Role, list[int], list[float] | None]] = [
                    (Role.PROMPT, list(out.prompt_ids), None),
                    (Role.REHEARSE, list(out.token_ids), None),
                ]
                rows.append(_Row("world_model", i, pieces, [(len(out.prompt_ids), len(out.token_ids))]))
    return rows


def build_batch(
    trajectories: Sequence[Trajectory],
    group_ids: Sequence[int],
    *,
    weighting: Weighting = "turn",
    algo: str | AdvantageEstimator = "role_grpo",
    scale_by_std: bool = False,
    prompt_mode: PromptMode = "inline",
    pad_id: int,
    world_model: bool = False,
) -> RolloutBatch:
    """Pack trajectories into a right-padded `RolloutBatch` with per-token role masks and advantages.

    Rows (see `RolloutBatch`): ``inline``, one row per trajectory (ACT and REHEARSE segments in one
    sequence); ``separate``, one ACT row per trajectory (its rehearsed tool messages are OBSERVATION
    tokens) plus one row per rehearsal read from ``trajectory.turn_info[*].rehearsals`` (as
    `collect_rollouts` stores them): the simulator prompt ids as PROMPT, then the generated ids as REHEARSE
    with their recorded logprobs. Rehearsal attempts (``TurnInfo.attempts``, rehearsal-aware rollouts) are rows
    of their own whose segments belong to the committed trajectory: reward, group and role baselines are its.

    Advantages: every ACT/REHEARSE segment with logprobs is one advantage segment (reward R(τ) of its
    trajectory, its group, its role, its length); segments without logprobs (plain-text actions) are left
    out of the baselines and of the loss. ``algo`` names an estimator of `agents.grpo.ADVANTAGE_ESTIMATORS`
    (or is one): ``"role_grpo"``, `agents.grpo.role_wise_advantages` (one baseline per (group, role),
    ``weighting``/``scale_by_std`` as there); ``"grpo"``, `agents.grpo.grpo_advantages` (one baseline per
    group over trajectories; ``weighting`` is ignored).
    Each segment's advantage is broadcast to its tokens with `agents.grpo.segment_advantages_to_tokens`.

    World-model targets (``world_model=True``): every real tool output the trajectories carry
    (``TurnInfo.real_outputs``, `envace_gym.types.RealOutputRecord`) becomes a teacher-forced REHEARSE target in
    ``world_model_mask``, in the format a rehearsal of that call has in the batch. ``inline``: the output's
    positions in its trajectory row, whose prefix is exactly the context an inline rehearsal continues (the
    sequence up to the tool-message opener), and whose ids are the output's content and the close up to its stop
    token, what a rehearsal generates. ``separate``: one ``"world_model"`` row per output, its simulator prompt then
    the output ending as the assistant message a rehearsal writes there. They carry no advantage and are not
    segments (nothing in the GRPO loss changes); False leaves them out (``world_model_mask`` all False).

    Args:
        trajectories: the trajectories (e.g. `collect_rollouts`' B·K, group-major).
        group_ids: one group id per trajectory, ``(len(trajectories),)``; `group_ids_for` gives
            `collect_rollouts`' layout.
        weighting: ``"turn"``, ``"token"`` or ``"trajectory"`` (see `agents.grpo`).
        algo: an estimator name (`agents.grpo.ADVANTAGE_ESTIMATORS`) or an `agents.grpo.AdvantageEstimator`.
        scale_by_std: divide advantages by the per-key std (off by default).
        prompt_mode: ``"inline"`` or ``"separate"``: the env's prompt mode at collection.
        pad_id: the id written in padding positions (masked out by ``attention_mask``).
        world_model: mark the real tool outputs as world-model targets (above).

    Returns:
        A `RolloutBatch` on the CPU.

    Raises:
        ValueError: no trajectories, ``len(group_ids) != len(trajectories)``, an unknown ``algo`` or
            ``prompt_mode``, a prompt mode that contradicts the trajectories (inline REHEARSE segments in
            ``separate``, rehearsal rows in ``inline``), a generated segment whose logprobs do not match its
            tokens one to one or that opens its row, a real-output record of the other prompt mode or (inline)
            whose ids are not the trajectory's at its position, or the errors of `agents.grpo` (unknown
            weighting, ...).
    """
    if not trajectories:
        raise ValueError("build_batch needs at least one trajectory")
    if len(group_ids) != len(trajectories):
        raise ValueError(f"{len(group_ids)} group ids for {len(trajectories)} trajectories; they must match")
    estimator = advantage_estimator(algo) if isinstance(algo, str) else algo
    if prompt_mode not in ("inline", "separate"):
        raise ValueError(f"prompt_mode must be 'inline' or 'separate', got {prompt_mode!r}")
    rows = _rows(trajectories, prompt_mode, world_model)
    n = len(rows)
    t_max = max(1, max(sum(len(ids) for _, ids, _ in r.pieces) for r in rows))
    input_ids = torch.full((n, t_max), int(pad_id), dtype=torch.long)  # (N, T)
    attention_mask = torch.zeros((n, t_max), dtype=torch.long)  # (N, T)
    role_mask = torch.full((n, t_max), PAD_ROLE, dtype=torch.long)  # (N, T)
    old_logprobs = torch.zeros((n, t_max), dtype=torch.float32)  # (N, T)
    segment_ids = torch.full((n, t_max), -1, dtype=torch.long)  # (N, T)
    world_model_mask = torch.zeros((n, t_max), dtype=torch.bool)  # (N, T)
    seg_group: list[int] = []
    seg_role: list[int] = []
    seg_traj: list[int] = []
    seg_len: list[int] = []
    seg_reward: list[float] = []
    seg_row: list[int] = []
    for r_idx, row in enumerate(rows):
        pos = 0
        for role, ids, logprobs in row.pieces:
            end = pos + len(ids)
            if ids:
                input_ids[r_idx, pos:end] = torch.tensor(ids, dtype=torch.long)
                attention_mask[r_idx, pos:end] = 1
                role_mask[r_idx, pos:end] = int(role)
                if role in _TRAINABLE and logprobs is not None:
                    if pos == 0 or len(logprobs) != len(ids):  # position 0 has no logit that predicts it
                        raise ValueError(
                            f"trajectory {row.traj} (batch row {r_idx}): a {Role(role).name} segment of {len(ids)} "
                            "tokens "
                            f"with {len(logprobs)} logprobs at position {pos}; a generated segment "
                            "needs one logprob per token and a context before it"
                        )
                    old_logprobs[r_idx, pos:end] = torch.tensor(logprobs, dtype=torch.float32)
                    segment_ids[r_idx, pos:end] = len(seg_role)
                    seg_group.append(int(group_ids[row.traj]))
                    seg_role.append(int(role))
                    seg_traj.append(row.traj)
                    seg_len.append(len(ids))
                    seg_reward.append(float(trajectories[row.traj].reward))
                    seg_row.append(r_idx)
            pos = end
        for start, length in row.targets:
            world_model_mask[r_idx, start : start + length] = True
    seg_rewards = torch.tensor(seg_reward, dtype=torch.float32)  # (S,)
    seg_group_ids = torch.tensor(seg_group, dtype=torch.long)  # (S,)
    seg_roles = torch.tensor(seg_role, dtype=torch.long)  # (S,)
    seg_traj_ids = torch.tensor(seg_traj, dtype=torch.long)  # (S,)
    seg_num_tokens = torch.tensor(seg_len, dtype=torch.long)  # (S,)
    seg_advantages = estimator(
        seg_rewards,
        seg_group_ids,
        seg_roles,
        seg_traj_ids,
        seg_num_tokens,
        weighting=weighting,
        scale_by_std=scale_by_std,
    )  # (S,)
    advantages = segment_advantages_to_tokens(seg_advantages, segment_ids)  # (N, T)
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        role_mask=role_mask,
        loss_mask=segment_ids >= 0,
        old_logprobs=old_logprobs,
        advantages=advantages,
        segment_ids=segment_ids,
        group_ids=torch.tensor([int(group_ids[r.traj]) for r in rows], dtype=torch.long),
        rewards=torch.tensor([float(trajectories[r.traj].reward) for r in rows], dtype=torch.float32),
        traj_ids=torch.tensor([r.traj for r in rows], dtype=torch.long),
        row_kinds=[r.kind for r in rows],
        task_ids=[trajectories[r.traj].task.id for r in rows],
        seg_rewards=seg_rewards,
        seg_group_ids=seg_group_ids,
        seg_roles=seg_roles,
        seg_traj_ids=seg_traj_ids,
        seg_num_tokens=seg_num_tokens,
        seg_advantages=seg_advantages,
        seg_rows=torch.tensor(seg_row, dtype=torch.long),
        world_model_mask=world_model_mask,
    )


def with_demonstrations(batch: RolloutBatch, demos: Sequence[Trajectory], pad_id: int) -> RolloutBatch:
    """`batch` with one ``"demonstration"`` row per demonstration appended: world-model targets only.

    `demos` are SFT demonstrations (`agents.training.demonstrations.build_demonstrations`, relabelled by
    `agents.training.demonstrations.relabel_for_sft`): real executions in the policy's inline token format, whose
    REHEARSE segments are the real backend's tool outputs (the close up to its stop token included), exactly what
    an inline rehearsal generates at that position. Those tokens become ``world_model_mask`` targets; the rows
    carry no loss token, no advantage and no segment (the GRPO loss and the baselines are unchanged). Their
    ``group_ids`` and ``traj_ids`` are -1 and ``rewards`` 0; ``task_ids`` name the demonstration's task. Both
    parts are right-padded to the longer width.

    Args:
        batch: a `build_batch` result (its ``world_model_mask`` may be None: then all False for its rows).
        demos: demonstration trajectories; an empty sequence returns `batch` unchanged.
        pad_id: the id written in padding positions.

    Returns:
        A `RolloutBatch` of ``batch.num_rows + len(demos)`` rows on the CPU.

    Raises:
        ValueError: a demonstration with a generated segment (logprobs recorded: a rollout, not a demonstration)
            or with no REHEARSE token (nothing for the world model to learn).
    """
    if not demos:
        return batch
    for i, d in enumerate(demos):
        if any(s.logprobs is not None for s in d.segments):
            raise ValueError(f"demonstration {i} ({d.task.id}) has recorded logprobs: a rollout, not a demonstration")
        if not d.tokens_per_role()[Role.REHEARSE.name]:
            raise ValueError(f"demonstration {i} ({d.task.id}) has no REHEARSE token: relabel it with relabel_for_sft")
    n, m = batch.num_rows, len(demos)
    width = max(batch.seq_len, max(len(d.token_ids) for d in demos))

    def grow(t: torch.Tensor, fill: float | int | bool) -> torch.Tensor:  # (n, T) -> (n + m, width)
        out = torch.full((n + m, width), fill, dtype=t.dtype)
        out[:n, : t.shape[1]] = t
        return out

    input_ids = grow(batch.input_ids, int(pad_id))
    attention_mask = grow(batch.attention_mask, 0)
    role_mask = grow(batch.role_mask, PAD_ROLE)
    world_model = batch.world_model_mask if batch.world_model_mask is not None else torch.zeros_like(batch.loss_mask)
    world_model_mask = grow(world_model, False)
    for j, d in enumerate(demos):
        pos = 0
        for seg in d.segments:
            end = pos + len(seg.token_ids)
            if seg.token_ids:
                input_ids[n + j, pos:end] = torch.tensor(list(seg.token_ids), dtype=torch.long)
                attention_mask[n + j, pos:end] = 1
                role_mask[n + j, pos:end] = int(seg.role)
                if seg.role == Role.REHEARSE:
                    world_model_mask[n + j, pos:end] = True
            pos = end
    return dataclasses.replace(
        batch,
        input_ids=input_ids,
        attention_mask=attention_mask,
        role_mask=role_mask,
        loss_mask=grow(batch.loss_mask, False),
        old_logprobs=grow(batch.old_logprobs, 0.0),
        advantages=grow(batch.advantages, 0.0),
        segment_ids=grow(batch.segment_ids, -1),
        group_ids=torch.cat([batch.group_ids, torch.full((m,), -1, dtype=torch.long)]),
        rewards=torch.cat([batch.rewards, torch.zeros(m, dtype=torch.float32)]),
        traj_ids=torch.cat([batch.traj_ids, torch.full((m,), -1, dtype=torch.long)]),
        row_kinds=[*batch.row_kinds, *(_DEMONSTRATION for _ in demos)],
        task_ids=[*batch.task_ids, *(d.task.id for d in demos)],
        world_model_mask=world_model_mask,
    )
