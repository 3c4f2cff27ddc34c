"""`agents.engines.batching`: generate calls of concurrent workers merge into one engine call per setting, every row
gets exactly what its own call would have sampled, and no worker hangs when another one ends or fails."""

from __future__ import annotations

import threading

import pytest

from agents.engines.batching import BatchCoordinator, coalesced
from agents.engines.registry import HFEngine
from agents.policy import Policy

STOP = [2]


class CountingEngine(HFEngine):
    """The real HF engine on the tiny model, recording the batch size of every call and its thread."""

    def __init__(self, model, fail_on_rows: int | None = None):
        super().__init__(model, pad_id=0, kv_cache=False)
        self.batches: list[int] = []
        self.threads: set[str] = set()
        self.fail_on_rows = fail_on_rows

    def generate(self, contexts, **kwargs):
        self.batches.append(len(contexts))
        self.threads.add(threading.current_thread().name)
        if self.fail_on_rows is not None and len(contexts) == self.fail_on_rows:
            raise RuntimeError("engine failed")
        return super().generate(contexts, **kwargs)


def _contexts(worker: int, call: int) -> list[list[int]]:
    return [[5 + worker, 9 + call, 11 + worker * 3 + call][: 2 + (worker + call) % 2]]


def _job(batcher, engine, worker: int, calls: int, max_new_tokens: int = 4):
    def job():
        return [
            batcher.generate(
                engine,
                _contexts(worker, c),
                max_new_tokens=max_new_tokens,
                temperature=1.0,
                stop_ids=STOP,
                seeds=[100 * worker + c],
            )
            for c in range(calls)
        ]

    return job


def test_workers_calls_merge_and_each_row_is_what_its_own_call_samples(tiny_model):
    engine = CountingEngine(tiny_model)
    direct = [
        [
            engine.generate(_contexts(w, c), max_new_tokens=4, temperature=1.0, stop_ids=STOP, seeds=[100 * w + c])
            for c in range(2 + (w == 0))
        ]
        for w in range(4)
    ]
    engine.batches.clear()
    batcher = BatchCoordinator()
    merged = batcher.run([_job(batcher, engine, w, 2 + (w == 0)) for w in range(4)])  # worker 0 makes one call more
    assert engine.batches == [4, 4, 1]  # two rounds of all four workers, then worker 0 alone
    assert batcher.merged_calls == 3 and batcher.requests == 9
    for w in range(4):
        assert [[g.token_ids for g in call] for call in merged[w]] == [
            [g.token_ids for g in call] for call in direct[w]
        ]
    # a thread that is not a worker calls the engine itself, unmerged
    batcher.generate(engine, _contexts(0, 0), max_new_tokens=2, temperature=0.0, stop_ids=STOP)
    assert engine.batches[-1] == 1 and batcher.requests == 9


def test_different_settings_are_separate_calls_of_one_flush(tiny_model):
    engine = CountingEngine(tiny_model)
    batcher = BatchCoordinator()
    out = batcher.run([_job(batcher, engine, w, 1, max_new_tokens=3 if w % 2 else 5) for w in range(4)])
    assert sorted(engine.batches) == [2, 2] and all(
        len(gens[0][0].token_ids) <= (3 if w % 2 else 5) for w, gens in enumerate(out)
    )


def test_an_engine_error_reaches_every_caller_of_the_merged_call_and_nobody_hangs(tiny_model):
    engine = CountingEngine(tiny_model, fail_on_rows=3)
    batcher = BatchCoordinator()
    with pytest.raises(RuntimeError, match="engine failed"):
        batcher.run([_job(batcher, engine, w, 2) for w in range(3)])
    assert engine.batches == [3]
    # a job that raises by itself lets the others go on (its worker leaves, the rest still merge)

    def bad():
        raise ValueError("env broke")

    engine.fail_on_rows = None
    with pytest.raises(ValueError, match="env broke"):
        batcher.run([bad, _job(batcher, engine, 1, 2), _job(batcher, engine, 2, 2)])
    assert engine.batches[1:] == [2, 2]


def test_coalesced_swaps_the_engines_of_distinct_policies_and_puts_them_back(tiny_model, smol_tokenizer):
    policy = Policy(tiny_model, smol_tokenizer, kv_cache=False)
    own = policy.engine
    batcher = BatchCoordinator()
    with coalesced([policy, None, policy], batcher):
        assert policy.engine.engine is own and policy.engine.coordinator is batcher
        batcher.run(
            [
                lambda: policy.generate([[5, 6]], max_new_tokens=2, seeds=[1]),
                lambda: policy.generate([[7]], max_new_tokens=2, seeds=[2]),
            ]
        )
    assert policy.engine is own and batcher.merged_calls == 1 and batcher.requests == 2
