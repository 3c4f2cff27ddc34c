"""Batching the generate calls of many envs that each step on their own: `BatchCoordinator`.

Why: test-time rehearsal and rehearsal fidelity generate inside each env's ``reset``/``step`` (rehearsed
tool outputs, rehearsal attempts, critiques, the memory summary), one env at a time; on a CPU a batch of
rows decodes in about the time of one (a decode step is bound by reading the weights), so running the envs
one after another costs about a factor of the batch size. Rewriting every wrapper as a vectorised loop would
duplicate its logic; instead each env's step runs in its own worker thread and every generate call goes
through a `CoalescingEngine`, which parks it until every live worker is parked too, then runs the parked
calls merged into one engine call per setting (engine, ``max_new_tokens``, temperature, stop ids, cache
use) and hands each worker its rows.

One worker at a time: a worker holds the coordinator's baton whenever it runs (its env code, tools,
tokenizer and verifier included) and gives it up only while its generate call is parked, so env code never
runs concurrently (the BFCL backends' process-wide mpmath precision, a shared tokenizer). Determinism: a
flush happens only when every live worker waits, the rows of a merged call are ordered by worker index, and
each row keeps its own sampling seed, so results depend on the envs' own seeds and the set of envs, never
on thread scheduling. The engines are called from one thread at a time, never concurrently. A tool time
limit that needs the main thread (``envace_gym.limits`` with ``isolation="none"``) does not apply in a
worker; the default process isolation does.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from agents.engines.generation import Generation

__all__ = ["BatchCoordinator", "CoalescingEngine", "coalesced"]

T = TypeVar("T")


class _Call:
    __slots__ = ("worker", "engine", "contexts", "settings", "seeds", "result", "error", "done")

    def __init__(
        self, worker: int, engine: Any, contexts: Sequence[Sequence[int]], settings: tuple, seeds: list
    ) -> None:
        self.worker, self.engine, self.contexts, self.settings, self.seeds = worker, engine, contexts, settings, seeds
        self.result: list[Generation] | None = None
        self.error: BaseException | None = None
        self.done = False


class BatchCoordinator:
    """Parks the generate calls of worker threads and runs them merged once every live worker waits.

    Attributes:
        merged_calls: engine calls made for parked requests (one per setting per flush).
        requests: generate requests parked by workers.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._live = 0
        self._pending: list[_Call] = []
        self._baton = threading.Lock()  # held by the one worker that runs
        self._local = threading.local()
        self.merged_calls = 0
        self.requests = 0

    def run(self, jobs: Sequence[Callable[[], T]]) -> list[T]:
        """Run every job in its own worker thread (worker index = its position); their results in order.

        Every worker is counted live before any starts, so no merged call runs before all of them have
        either parked a call or finished. A job that raises re-raises here, after every job has ended.

        Raises:
            RuntimeError: called from one of this coordinator's workers (its own call would never be merged).
        """
        if getattr(self._local, "index", None) is not None:
            raise RuntimeError("BatchCoordinator.run was called from one of its own workers")
        if len(jobs) <= 1:
            return [job() for job in jobs]
        with self._cond:
            self._live += len(jobs)

        def work(index: int, job: Callable[[], T]) -> T:
            self._local.index = index
            self._baton.acquire()
            try:
                return job()
            finally:
                self._baton.release()
                self._local.index = None
                with self._cond:
                    self._live -= 1
                    self._flush_if_all_wait()

        with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="env") as pool:
            futures = [pool.submit(work, i, job) for i, job in enumerate(jobs)]
            return [f.result() for f in futures]

    def generate(
        self,
        engine: Any,
        contexts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        stop_ids: Sequence[int],
        seeds: Sequence[int | None] | None = None,
        use_cache: bool = True,
    ) -> list[Generation]:
        """`engine.generate(...)` for these rows, merged with the other workers' parked calls.

        A thread that is not one of `run`'s workers calls the engine directly.

        Raises whatever the merged engine call raised (every worker whose rows were in it gets the exception).
        """
        seeds = list(seeds) if seeds is not None else [None] * len(contexts)
        index = getattr(self._local, "index", None)
        if index is None or not contexts:
            return engine.generate(
                contexts,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                stop_ids=stop_ids,
                seeds=seeds,
                use_cache=use_cache,
            )
        call = _Call(
            index, engine, contexts, (int(max_new_tokens), float(temperature), tuple(stop_ids), bool(use_cache)), seeds
        )
        self._baton.release()  # parked: another worker may run until every live one is parked
        try:
            with self._cond:
                self._pending.append(call)
                self.requests += 1
                self._flush_if_all_wait()
                while not call.done:
                    self._cond.wait()
        finally:
            self._baton.acquire()
        if call.error is not None:
            raise call.error
        assert call.result is not None
        return call.result

    def _flush_if_all_wait(self) -> None:
        """With the lock held: when every live worker has a parked call, run them all (merged) and wake them."""
        if not self._pending or len(self._pending) < self._live:
            return
        pending, self._pending = sorted(self._pending, key=lambda c: c.worker), []
        groups: dict[tuple, list[_Call]] = {}
        for call in pending:
            groups.setdefault((id(call.engine), call.settings), []).append(call)
        for calls in groups.values():
            max_new_tokens, temperature, stop_ids, use_cache = calls[0].settings
            try:
                gens = calls[0].engine.generate(
                    [ctx for c in calls for ctx in c.contexts],
                    max_new_tokens=max_new_tokens,
                    temperature=temperature,
                    stop_ids=list(stop_ids),
                    seeds=[s for c in calls for s in c.seeds],
                    use_cache=use_cache,
                )
                self.merged_calls += 1
                start = 0
                for c in calls:
                    c.result, start = list(gens[start : start + len(c.contexts)]), start + len(c.contexts)
            except BaseException as err:  # every caller of the merged call sees it, none hangs
                for c in calls:
                    c.error = err
            for c in calls:
                c.done = True
        self._cond.notify_all()


class CoalescingEngine:
    """A `agents.engines.registry.GenerationEngine` that sends its calls through a `BatchCoordinator`.

    Args:
        engine: the engine that actually samples (its other attributes, e.g. ``kv_cache``, are passed through).
        coordinator: shared by every engine whose calls may be merged or must wait for each other.
    """

    def __init__(self, engine: Any, coordinator: BatchCoordinator) -> None:
        self.engine = engine
        self.coordinator = coordinator

    def generate(
        self,
        contexts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        stop_ids: Sequence[int],
        seeds: Sequence[int | None] | None = None,
        use_cache: bool = True,
    ) -> list[Generation]:
        """See `GenerationEngine.generate` and `BatchCoordinator.generate`."""
        return self.coordinator.generate(
            self.engine,
            contexts,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            stop_ids=stop_ids,
            seeds=seeds,
            use_cache=use_cache,
        )

    def weights_updated(self) -> None:
        self.engine.weights_updated()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


@contextlib.contextmanager
def coalesced(policies: Sequence[Any], coordinator: BatchCoordinator) -> Iterator[None]:
    """Within the block, every policy in `policies` (distinct objects; None entries skipped) generates
    through `coordinator`; their own engines are put back afterwards."""
    saved = []
    for policy in dict.fromkeys(p for p in policies if p is not None):
        saved.append((policy, policy.engine))
        policy.engine = CoalescingEngine(policy.engine, coordinator)
    try:
        yield
    finally:
        for policy, engine in saved:
            policy.engine = engine
