"""`RehearseVectorEnv`: N `RehearseEnv`s whose rehearsals are served by one batched model call per round.

Gymnasium's `SyncVectorEnv` would step the envs one after another, so N envs would make N separate
generate calls. Here every env's step runs as a coroutine (`ToolUseEnv.step_coroutine`); the vector env
collects the pending tool call of every env, answers all of them with ONE `Rehearser.rehearse` call, and
repeats while any env has calls left (a message with k calls takes k rounds, because the i-th rehearsal of
an env must see the env's (i-1)-th rehearsed response). docs/design.md §3, "Batch the model, not the env".

Made by ``gym.make_vec("EnvACE-Rehearse-v0", num_envs=N, vectorization_mode="vector_entry_point")``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from envace_gym.envs.rehearse import RehearseEnv
from envace_gym.rehearsal import make_rehearser
from envace_gym.responders import Rehearsal
from envace_gym.spaces import batch_text_space

__all__ = ["RehearseVectorEnv"]


class RehearseVectorEnv(VectorEnv):
    """N `RehearseEnv`s sharing one rehearser; one batched rehearsal per round (see the module docstring).

    Observations are tuples of N strings, actions a sequence of N strings (`GeneratedText` welcome),
    rewards/terminations/truncations NumPy arrays of shape ``(N,)``; infos follow Gymnasium's vector
    convention (``info[key]`` arrays with a ``_key`` mask). Autoreset: ``NEXT_STEP`` (an env that ended is
    reset by the next `step` call, whose action for it is ignored). An action of ``None`` leaves its env out of
    the step altogether (no step, no autoreset: a pending reset waits for the env's next action), so a rollout
    whose episodes end at different steps does not replay finished envs (`agents.rollout.collect_rollouts`);
    that env's entries are then ``""``, 0.0, False, False and no info.

    Args:
        num_envs: N (>= 1).
        **kwargs: `RehearseEnv` arguments; one rehearser (hence one model) is built and shared by all.

    Attributes:
        envs: the N `RehearseEnv`s (their ``trajectory`` holds each episode's token segments).
        num_rehearsal_calls: how many batched `rehearse` calls this vector env has made.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, num_envs: int, **kwargs: Any) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        kwargs.pop("max_episode_steps", None)
        if kwargs.get("rehearser") is None:
            extra = {"models": kwargs.pop("models")} if kwargs.get("models") is not None else {}
            kwargs["rehearser"] = make_rehearser(
                "policy",
                model=kwargs.pop("model", "smollm2-135m"),
                prompt_mode=kwargs.get("prompt_mode", "inline"),
                **extra,
            )
        self.rehearser = kwargs["rehearser"]
        responder = kwargs.pop("responder", None)  # each env gets its own copy: state is never shared
        self.envs: list[RehearseEnv] = [
            RehearseEnv(**kwargs, responder=None if responder is None else responder.fork()) for _ in range(num_envs)
        ]
        self.num_envs = num_envs
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.observation_space = batch_text_space(self.single_observation_space, num_envs)
        self.action_space = batch_text_space(self.single_action_space, num_envs)
        self._autoreset = np.zeros(num_envs, dtype=bool)
        self.num_rehearsal_calls = 0

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Reset every env. An int seed gives env i the seed ``seed + i`` (Gymnasium's convention).

        ``options`` may hold ``"task_ids"``: one task id per env (e.g. a group of K copies of one task).
        """
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        options = dict(options or {})
        task_ids = options.pop("task_ids", None)
        if task_ids is not None and len(task_ids) != self.num_envs:
            raise ValueError(f"options['task_ids'] has {len(task_ids)} ids for {self.num_envs} envs; give one per env")
        if len(seeds) != self.num_envs:
            raise ValueError(f"{len(seeds)} seeds for {self.num_envs} envs; give an int or one seed per env")
        obs: list[str] = []
        infos: dict[str, Any] = {}
        for i, env in enumerate(self.envs):
            env_options = dict(options)
            if task_ids is not None:
                env_options["task_id"] = task_ids[i]
            o, info = env.reset(seed=seeds[i], options=env_options)
            obs.append(o)
            infos = self._add_info(infos, info, i)
        self._autoreset[:] = False
        return tuple(obs), infos

    def step(
        self, actions: Sequence[str | None]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env whose action is not None; answer all their pending tool calls with one batched
        rehearsal per round."""
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        results: list[tuple | None] = [None] * self.num_envs
        coroutines: dict[int, Any] = {}
        pending: dict[int, Any] = {}
        skipped = np.array([a is None for a in actions], dtype=bool)
        for i, env in enumerate(self.envs):
            if skipped[i]:
                results[i] = ("", 0.0, False, False, {})
                continue
            if self._autoreset[i]:
                o, info = env.reset()
                results[i] = (o, 0.0, False, False, info)
                continue
            gen = env.step_coroutine(cast(str, actions[i]))
            try:
                pending[i] = next(gen)
                coroutines[i] = gen
            except StopIteration as stop:
                results[i] = stop.value
        while pending:
            rehearse_ids = [i for i in pending if self.envs[i].needs_rehearsal()]
            answers: dict[int, str] = {}
            by_rehearser: dict[int, list[int]] = {}  # one batched call per rehearser (normally just one)
            for i in rehearse_ids:  # needs_rehearsal(): the responder is a Rehearsal
                by_rehearser.setdefault(id(cast(Rehearsal, self.envs[i].responder).rehearser), []).append(i)
            for ids in by_rehearser.values():
                requests = [self.envs[i].rehearse_request(pending[i]) for i in ids]
                responses = cast(Rehearsal, self.envs[ids[0]].responder).rehearser.rehearse(requests)
                self.num_rehearsal_calls += 1
                for i, response in zip(ids, responses):
                    answers[i] = self.envs[i].accept_rehearsal(pending[i], response)
            for i in pending:
                if i not in answers:  # a real backend (RealTools) answers directly
                    answers[i] = self.envs[i].respond(pending[i])
            next_pending: dict[int, Any] = {}
            for i, answer in answers.items():
                try:
                    next_pending[i] = coroutines[i].send(answer)
                except StopIteration as stop:
                    results[i] = stop.value
            pending = next_pending
        obs: list[str] = []
        infos: dict[str, Any] = {}
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminations = np.zeros(self.num_envs, dtype=bool)
        truncations = np.zeros(self.num_envs, dtype=bool)
        for i, result in enumerate(results):
            assert result is not None
            o, r, term, trunc, info = result
            obs.append(o)
            rewards[i], terminations[i], truncations[i] = r, term, trunc
            infos = self._add_info(infos, info, i)
        self._autoreset = np.where(skipped, self._autoreset, terminations | truncations)
        return tuple(obs), rewards, terminations, truncations, infos

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()
