"""Solvable-task budgets (`agents.training.budgets`): the counting rules against the real env, and the fail-fast checks
of `envace train`, `envace eval`, `envace sft` and `envace pipeline` before any model loads."""

from __future__ import annotations

import re

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401  (registers the ids)
import tests.testing_env  # noqa: F401  (registers the scripted suites)
from agents.cli import main
from agents.training.budgets import BudgetError, budget_report, require_solvable, task_needs
from benchmarks.bfcl import BFCLSuite
from envace_gym.parsing import format_tool_calls
from envace_gym.types import ToolCall


def _tokens(tok, calls):
    return len(tok.encode(format_tool_calls(calls, "hermes"), add_special_tokens=False))


def test_packing_counts_hand_computed(smol_tokenizer):
    from envace_gym.types import Task

    calls = [ToolCall("add", {"value": i}) for i in range(3)]
    one, two, three = (_tokens(smol_tokenizer, calls[:k]) for k in (1, 2, 3))
    task = Task(id="t", suite="x", turns=[[], []], tools=[], verifier="v")
    needs = task_needs(task, [calls, []], smol_tokenizer)
    assert needs.min_new_tokens == max(_tokens(smol_tokenizer, [c]) for c in calls)
    assert needs.messages_needed(0, three) == 1 and needs.messages_needed(0, two) == 2
    assert needs.messages_needed(0, one) == 3 and needs.messages_needed(0, one - 1) is None
    assert needs.messages_needed(1, 1) == 0
    # a turn with calls needs its calling messages plus one closing message; a turn without calls needs one
    assert needs.steps_needed(three) == 2 and needs.steps_needed(one) == 4
    assert needs.steps_needed(three, one_call_per_message=True) == 4
    assert needs.blocked_by({"max_steps_per_turn": 3, "max_new_tokens": one}) == "max_steps_per_turn"
    assert needs.blocked_by({"max_steps_per_turn": 4, "max_new_tokens": one}) is None
    assert needs.blocked_by({"max_steps_per_turn": 9, "max_new_tokens": one - 1}) == "max_new_tokens"


def _pack(tok, calls, cap):
    messages, cur = [], []
    for c in calls:
        if cur and _tokens(tok, cur + [c]) > cap:
            messages.append(cur)
            cur = []
        cur = cur + [c]
    return messages + ([cur] if cur else [])


@pytest.mark.parametrize("task_index", [0, 3, 7])
def test_the_step_count_agrees_with_the_real_env(smol_tokenizer, task_index):
    """Play the packed ground truth on real BFCL backends: exactly at the computed limit it earns R = 1, one
    message fewer per turn truncates the episode with R = 0."""
    from benchmarks.bfcl.verify import ground_truth_tool_calls

    suite = BFCLSuite()
    task = suite.tasks(["multi_turn_base"], "train")[task_index]
    gt = ground_truth_tool_calls(task)
    needs = task_needs(task, gt, smol_tokenizer)
    cap = needs.min_new_tokens + 10
    limit = needs.steps_needed(cap)
    assert limit >= 2
    for steps, expected in ((limit, (1.0, True, False)), (limit - 1, (0.0, False, True))):
        env = gym.make("EnvACE-Tool-v0", categories=["multi_turn_base"], split="train", max_steps_per_turn=steps)
        env.reset(options={"task_id": task.id})
        result = None
        for calls in gt:
            for group in _pack(smol_tokenizer, calls, cap):
                assert _tokens(smol_tokenizer, group) <= cap
                _, r, term, trunc, _ = env.step(format_tool_calls(group, "hermes"))
                if term or trunc:
                    result = (r, term, trunc)
                    break
            if result is not None:
                break
            _, r, term, trunc, _ = env.step("Done.")
            if term or trunc:
                result = (r, term, trunc)
                break
        assert result == expected, (steps, limit)


def test_bfcl_fractions_old_and_new_defaults(smol_tokenizer):
    from agents.config import TrainConfig

    suite = BFCLSuite()
    tasks = suite.tasks(["multi_turn_base"], "train")
    old = budget_report(tasks, suite, smol_tokenizer, max_steps_per_turn=3, max_new_tokens=64)
    assert old.fraction < 0.5 and set(old.blocked_by) == {"max_steps_per_turn", "max_new_tokens"}
    assert old.solvable + sum(old.blocked_by.values()) == len(tasks) == 165
    with pytest.raises(BudgetError, match=r"--max-new-tokens to \d+ or more.*--min-solvable-fraction"):
        require_solvable(old, 0.9, command="test", log=None)
    cfg = TrainConfig()
    new = budget_report(
        tasks, suite, smol_tokenizer, max_steps_per_turn=cfg.max_steps_per_turn, max_new_tokens=cfg.max_new_tokens
    )
    assert new.fraction >= cfg.min_solvable_fraction
    assert new.solvable_one_call_per_message <= new.solvable
    require_solvable(new, cfg.min_solvable_fraction, command="test", log=None)  # does not raise


def test_episode_token_budget_uses_the_real_demonstration(smol_tokenizer):
    suite = BFCLSuite()
    tasks = suite.tasks(["multi_turn_base"], "test")[:3]
    report = budget_report(
        tasks, suite, smol_tokenizer, max_steps_per_turn=20, max_new_tokens=256, max_episode_tokens=10
    )
    assert report.solvable == 0 and report.blocked_by == {"max_episode_tokens": 3}
    need = report.needed["max_episode_tokens"]
    assert (
        budget_report(
            tasks, suite, smol_tokenizer, max_steps_per_turn=20, max_new_tokens=256, max_episode_tokens=need
        ).fraction
        >= 0.9
    )


def _refused(capsys, argv, pattern):
    """`envace ...` exits with code 2 and one line on stderr that matches `pattern` (no traceback)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(pattern, err) and "Traceback" not in err, err
    return err


def test_train_refuses_unsolvable_budgets_before_loading_a_model(tmp_path, no_model_loads, capsys):
    args = [
        "train",
        "--run-dir",
        str(tmp_path),
        "--model",
        "tiny-random",
        "--suite",
        "scripted",
        "--categories",
        "--max-new-tokens",
        "6",
        "--batch-tasks",
        "2",
        "--group-size",
        "2",
    ]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert "[budget] envace train: 0/3 (0.0%)" in captured.out
    assert re.search(r"--max-new-tokens=6 allows \(raise --max-new-tokens to \d+", captured.err)
    with pytest.raises(BudgetError):  # --debug shows the exception itself
        main(["--debug", *args])


def test_eval_sft_and_pipeline_refuse_before_loading_a_model(tmp_path, no_model_loads, capsys):
    _refused(
        capsys,
        [
            "eval",
            "--model",
            "tiny-random",
            "--categories",
            "multi_turn_base",
            "--limit",
            "3",
            "--max-steps-per-turn",
            "1",
            "--out",
            str(tmp_path / "ev"),
        ],
        "--max-steps-per-turn",
    )
    _refused(
        capsys,
        [
            "sft",
            "--run-dir",
            str(tmp_path / "sft"),
            "--model",
            "tiny-random",
            "--max-seq-len",
            "3000",
            "--max-demos",
            "20",
        ],
        "--max-seq-len=3000",
    )
    _refused(
        capsys,
        ["pipeline", "--run-dir", str(tmp_path / "p"), "--model", "tiny-random", "--grpo.max-steps-per-turn", "2"],
        "--grpo.max-steps-per-turn",
    )
    _refused(
        capsys,
        ["pipeline", "--run-dir", str(tmp_path / "p"), "--model", "tiny-random", "--eval.max-steps-per-turn", "1"],
        "--eval.max-steps-per-turn",
    )
