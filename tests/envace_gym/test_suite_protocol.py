"""The suite protocol: entry-point discovery, a simulated user, verification from the trajectory and the
final backend state, and a suite defined only in `tests/` that trains, evaluates and yields demonstrations."""

from __future__ import annotations

import importlib.metadata
import json

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401
import tests.testing_env  # noqa: F401  (registers the scripted suites)
from agents.cli import main
from envace_gym.suites import ENTRY_POINT_GROUP, make_suite, registered_suites
from wrappers import RealTools

ADD1 = '<tool_call>{"name": "add", "arguments": {"value": 1}}</tool_call>'


def test_bfcl_is_discovered_through_the_installed_entry_point():
    points = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    assert points["bfcl"] == "benchmarks.bfcl:BFCLSuite"
    assert {"bfcl", "scripted", "scripted-user"} <= set(registered_suites())
    assert type(make_suite("bfcl")).__name__ == "BFCLSuite"
    with pytest.raises(ValueError, match="entry-point group 'envace_gym.suites'"):
        make_suite("no-such-suite")


def _play(env, actions):
    env.reset(options={"task_id": "user_0"})
    out = []
    for a in actions:
        obs, reward, terminated, truncated, info = env.step(a)
        out.append((obs, reward, terminated, truncated))
        if terminated or truncated:
            break
    return out, info


@pytest.mark.parametrize(
    "make",
    [
        lambda: gym.make("EnvACE-Tool-v0", suite="scripted-user", categories=None),
        lambda: RealTools(gym.make("EnvACE-Rehearse-v0", suite="scripted-user", categories=None, model="tiny-random")),
    ],
    ids=["tool", "rehearse+real"],
)
def test_a_simulated_user_sets_the_turns_and_the_final_backend_state_is_verified(make):
    env = make()
    steps, info = _play(env, [ADD1, "done", ADD1, "<tool_call>{bad</tool_call>", "done", ADD1, "done", "extra"])
    assert len(steps) == 7, "three rounds of add + close, one parse error; the user then ends the episode"
    assert [s[0] for s in steps if s[0].startswith("Add 1 again")] == ["Add 1 again (1 done).", "Add 1 again (2 done)."]
    (_, reward, terminated, _) = steps[-1]
    assert terminated and reward == 1.0 and info["verifier"]["details"] == {"total": 3}
    base = env.unwrapped
    shape = [[[(c.name, c.arguments) for c in step] for step in turn] for turn in base.calls_per_turn()]
    add = [("add", {"value": 1})]
    assert shape == [[add, []], [add, [], []], [add, []]]
    assert base.trajectory.final_responses() == ["done", "done", "done"]
    assert base.trajectory.messages[0].content == "Please add 1 to the total."  # the user's opening, not task.turns
    if base.keeps_tokens:
        prompt = base.trajectory.segments[0]
        assert "Please add 1 to the total." in base.renderer.tokenizer.decode(prompt.token_ids)


def test_a_user_who_ends_early_terminates_with_the_state_reached():
    env = gym.make("EnvACE-Tool-v0", suite="scripted-user", categories=None)
    steps, info = _play(env, ["done", "done", "done"])
    assert [s[2] for s in steps] == [False, False, True] and steps[-1][1] == 0.0
    assert info["verifier"]["details"] == {"total": 0}


def test_a_suite_defined_in_tests_trains_evaluates_and_gives_demonstrations(tmp_path, smol_tokenizer):
    from agents.training.demonstrations import build_demonstrations

    demos, stats = build_demonstrations(smol_tokenizer, "scripted-user", None, "train", max_tokens=None)
    assert stats.kept == 1 and demos[0].reward == 1.0 and len(demos[0].final_responses()) == 3
    assert (
        main(
            [
                "train",
                "--model",
                "tiny-random",
                "--suite",
                "scripted-user",
                "--categories",
                "--batch-tasks",
                "1",
                "--group-size",
                "2",
                "--num-steps",
                "1",
                "--max-new-tokens",
                "24",
                "--min-solvable-fraction",
                "0",
                "--run-dir",
                str(tmp_path / "run"),
            ]
        )
        == 0
    )
    metrics = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl", encoding="utf-8")]
    assert [m["step"] for m in metrics] == [1]
    assert (
        main(
            [
                "eval",
                "--model",
                "tiny-random",
                "--suite",
                "scripted-user",
                "--split",
                "all",
                "--limit",
                "1",
                "--max-new-tokens",
                "6",
                "--max-steps-per-turn",
                "2",
                "--min-solvable-fraction",
                "0",
                "--out",
                str(tmp_path / "ev"),
            ]
        )
        == 0
    )
    (episode,) = [json.loads(line) for line in open(tmp_path / "ev" / "episodes.jsonl", encoding="utf-8")]
    assert episode["task_id"] == "user_0" and episode["reward"] in (0.0, 1.0)
