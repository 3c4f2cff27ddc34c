"""The blind variant of the hidden-rules lab world (``LabConfig(blind=True)``, suite ``lab-blind``): the hidden
world's tasks without the tools that only look, so only a learned rule or a rehearsal shows whether a move breaks
an item."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import gymnasium as gym
import pytest
import yaml

import envace_gym  # noqa: F401
from benchmarks.lab import LabConfig
from benchmarks.lab.lab_tiny import build_lab_tokenizer, lab_tiny_dir
from benchmarks.lab.properties import measure
from benchmarks.lab.world import LOOK_TOOLS
from envace_gym.parsing import format_tool_calls
from envace_gym.rendering import ChatRenderer
from envace_gym.suites import make_suite
from envace_gym.types import ToolCall

RECIPES = Path(__file__).resolve().parents[3] / "configs" / "recipes"


@pytest.fixture(scope="module")
def hidden():
    return make_suite("lab")


@pytest.fixture(scope="module")
def blind():
    return make_suite("lab-blind")


def test_the_blind_world_is_the_hidden_world_without_looks(hidden, blind):
    assert blind.name == "lab-blind" and blind.config == dataclasses.replace(hidden.config, blind=True)
    pairs = list(zip(hidden.tasks(None, "test"), blind.tasks(None, "test"), strict=True))
    assert len(pairs) == 600
    looked = 0
    for a, b in pairs:
        assert (b.id, b.turns, b.metadata["initial_state"], b.metadata["slots"]) == (
            a.id,
            a.turns,
            a.metadata["initial_state"],
            a.metadata["slots"],
        )
        assert [t.name for t in b.tools] == [t.name for t in a.tools if t.name not in LOOK_TOOLS]
        assert b.metadata["config"] == {**a.metadata["config"], "blind": True} and "blind" not in a.metadata["config"]
        # the same calls that change the world, in the same order: only the looks are gone
        a_calls = [c for turn in hidden.ground_truth(a) for c in turn]
        b_calls = [c for turn in blind.ground_truth(b) for c in turn]
        assert b_calls == [c for c in a_calls if c.name not in LOOK_TOOLS]
        looked += len(a_calls) - len(b_calls)
    assert looked > 300  # relocate, fill, make_room and full_job looked once each in the hidden world
    for a, b in itertools.islice(zip(hidden.train_stream(), blind.train_stream()), 60):  # the same train stream
        assert (b.id, b.metadata["initial_state"]) == (a.id, a.metadata["initial_state"])


def test_the_blind_backend_refuses_looks_and_the_hidden_one_answers_them(hidden, blind):
    for a, b in zip(hidden.tasks(["relocate"], "test")[:5], blind.tasks(["relocate"], "test")[:5], strict=True):
        for name, args in (("list_shelf", {"shelf": "A"}), ("locate", {"item": a.metadata["slots"]["y"]})):
            call = ToolCall(name, args)
            assert "error" not in json.loads(hidden.make_backend(a).execute(call))
            assert json.loads(blind.make_backend(b).execute(call)) == {"error": f"unknown tool {name!r}"}
        # a move still answers, and breaks the item on a full shelf, as in the hidden world
        x, y = a.metadata["slots"]["x"], a.metadata["slots"]["y"]
        shelf = next(s for s, items in a.metadata["initial_state"]["shelves"].items() if y in items)
        move = ToolCall("move", {"item": x, "shelf": shelf})
        assert blind.make_backend(b).execute(move) == hidden.make_backend(a).execute(move)


def test_reference_solutions_score_one_and_a_look_scores_zero_through_the_registered_env(blind):
    env = gym.make("EnvACE-Tool-v0", suite="lab-blind", split="test", max_steps_per_turn=8).unwrapped
    for task in env.tasks[::25]:
        env.reset(options={"task_id": task.id})
        assert "list_shelf" not in [t.name for t in env.task.tools]
        for calls in blind.ground_truth(task):
            for call in calls:
                env.step(format_tool_calls([call], "hermes"))
            _, reward, terminated, _, info = env.step("Done.")
        assert terminated and reward == 1.0, (task.id, info["verifier"])
    task = blind.tasks(["relocate"], "test")[0]
    env.reset(options={"task_id": task.id})
    observation, *_ = env.step(format_tool_calls([ToolCall("list_shelf", {"shelf": "A"})], "hermes"))
    assert "unknown tool 'list_shelf'" in env.trajectory.messages[-1].content
    for call in blind.ground_truth(task)[0]:  # the look failed, so even the reference calls after it score 0
        env.step(format_tool_calls([call], "hermes"))
    _, reward, terminated, _, _ = env.step("Done.")
    assert terminated and reward == 0.0


def test_without_looks_knowing_the_rules_is_enough_and_reading_every_output_is_not():
    hidden = measure(LabConfig(), train_tasks=600)
    result = measure(LabConfig(blind=True), train_tasks=600)
    assert result["reference"]["overall"] == result["rules_no_outputs"]["overall"] == 1.0
    assert hidden["outputs_no_rules"]["overall"] == 1.0  # in the hidden world a look answers every room decision
    reads = result["outputs_no_rules"]
    for family in ("relocate", "fill", "make_room"):  # blind, it is the no-rules guess there
        assert reads[family] == result["no_rules"][family] < 0.6
    assert reads["ship"] == reads["ship_two"] == 1.0  # labels still come from pack's real output
    assert result["no_rules"] == hidden["no_rules"]  # the same decisions, guessed the same way


def test_blind_needs_the_hidden_rules_and_keeps_lab_tinys_vocabulary_and_folder(blind):
    with pytest.raises(ValueError, match="blind"):
        LabConfig(rules="stated", blind=True)
    assert "blind" not in LabConfig().to_dict()
    assert lab_tiny_dir(Path("cache")).name == "lab-tiny-d58e767ce5"  # the folder every lab-tiny result used
    tokenizer = build_lab_tokenizer()
    renderer = ChatRenderer(tokenizer)
    for task in blind.tasks(None, "test")[::10]:
        rendered = renderer.render(task.turns[0], task.tools, add_generation_prompt=True)
        assert tokenizer.unk_token_id not in tokenizer.encode(rendered, add_special_tokens=False)
        assert "Tools: move pack ship" in rendered


def test_the_blind_recipe_is_the_lab_recipe_on_lab_blind():
    lab = yaml.safe_load((RECIPES / "lab.yaml").read_text())
    lab_blind = yaml.safe_load((RECIPES / "lab-blind.yaml").read_text())
    assert (lab_blind["suite"], lab_blind["run_dir"]) == ("lab-blind", "runs/lab-blind")
    assert {k: v for k, v in lab_blind.items() if k not in ("suite", "run_dir")} == {
        k: v for k, v in lab.items() if k not in ("suite", "run_dir")
    }


def test_the_discrete_twins_refuse_the_blind_world():
    from benchmarks.experiments.maskable_ppo import discrete_twin

    assert discrete_twin("lab-blind") is None
    with pytest.raises(ValueError, match="blind"):
        gym.make("EnvACE-LabHiddenDiscrete-v0", suite="lab-blind", split="test")
