"""The told variant of the hidden-rules lab world (``LabConfig(told=True)``, suite ``lab-told``): the hidden world's
tasks with the rules' facts of each task's initial state added to the prompt, in pieces `lab-tiny` already has."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml

import envace_gym  # noqa: F401
from benchmarks.lab import LabConfig
from benchmarks.lab.hidden import shelves_from_prompt, told_facts_from_prompt, told_facts_text
from benchmarks.lab.lab_tiny import LabTinySizes, build_lab_tokenizer, lab_tiny_dir, lab_vocabulary
from benchmarks.lab.world import Warehouse
from envace_gym.parsing import format_tool_calls
from envace_gym.rendering import ChatRenderer
from envace_gym.suites import make_suite
from envace_gym.types import ToolCall

RECIPES = Path(__file__).resolve().parents[3] / "configs" / "recipes"


@pytest.fixture(scope="module")
def hidden():
    return make_suite("lab")


@pytest.fixture(scope="module")
def told():
    return make_suite("lab-told")


def _messages(task):
    return [(m.role, m.content) for turn in task.turns for m in turn]


def test_the_told_world_is_the_hidden_world_with_the_facts_after_the_layout(hidden, told):
    assert told.name == "lab-told" and told.config == dataclasses.replace(hidden.config, told=True)
    assert told.categories == hidden.categories
    pairs = list(zip(hidden.tasks(None, "test"), told.tasks(None, "test"), strict=True))
    assert len(pairs) == 600
    for a, b in pairs:
        assert b.id == a.id and b.tools == a.tools
        prompt = a.turns[0][0].content
        facts = told_facts_text(Warehouse.from_dict(a.metadata["initial_state"]))
        assert _messages(b) == [("system", f"{prompt} {facts}"), *_messages(a)[1:]]  # the instruction as it was
        assert {k: v for k, v in b.metadata.items() if k != "config"} == {
            k: v for k, v in a.metadata.items() if k != "config"
        }
        assert b.metadata["config"] == {**a.metadata["config"], "told": True} and "told" not in a.metadata["config"]
        assert shelves_from_prompt(b) == shelves_from_prompt(a) == a.metadata["initial_state"]["shelves"]
    for a, b in itertools.islice(zip(hidden.train_stream(), told.train_stream()), 60):  # the same train stream
        assert (b.id, b.metadata["initial_state"], b.metadata["reference"]) == (
            a.id,
            a.metadata["initial_state"],
            a.metadata["reference"],
        )


def test_the_told_facts_are_what_the_real_backend_answers_in_the_initial_state(told):
    for task in told.tasks(None, "test")[::7]:
        room, prefixes = told_facts_from_prompt(task)
        layout = shelves_from_prompt(task)
        assert list(room) == list(layout) and list(prefixes) == [i for items in layout.values() for i in items]
        backend = told.make_backend(task)
        for shelf, free in room.items():
            assert json.loads(backend.execute(ToolCall("list_shelf", {"shelf": shelf})))["free"] == free
        for item, prefix in prefixes.items():
            first = told.make_backend(task)  # the label a pack gets as the first call
            assert json.loads(first.execute(ToolCall("pack", {"item": item})))["box"] == f"{prefix}-1"


def test_the_facts_are_of_the_initial_state_a_later_pack_can_change_them(told):
    """Two items shipped from one shelf, the first before the second: the second moves up a position when the
    first is packed, so its real label is one position lower than told (the count suffix is told nowhere)."""
    changed = 0
    for task in told.tasks(["ship_two"], "test"):
        _, prefixes = told_facts_from_prompt(task)
        _, _, pack_b, ship_b = told.ground_truth(task)[0]  # pack a, ship a, pack b, ship b
        told_prefix, label = prefixes[pack_b.arguments["item"]], ship_b.arguments["box"]
        shelf, position = told_prefix[0], int(told_prefix[1:])
        if label != f"{shelf}{position}-2":
            assert label == f"{shelf}{position - 1}-2"
            changed += 1
    assert 0 < changed < 100


def test_every_told_test_prompt_tokenizes_with_no_unknown_piece_and_the_vocabulary_is_unchanged(told):
    tokenizer = build_lab_tokenizer()
    renderer = ChatRenderer(tokenizer)
    for task in told.tasks(None, "test"):
        for _, text in _messages(task):
            ids = tokenizer.encode(text, add_special_tokens=False)
            assert tokenizer.unk_token_id not in ids and tokenizer.decode(ids) == text, text
        rendered = renderer.render(task.turns[0], task.tools, add_generation_prompt=True)
        assert tokenizer.unk_token_id not in tokenizer.encode(rendered, add_special_tokens=False)
    # lab-tiny is built from the untold world's texts: its vocabulary, and the cache folder named by a hash of it
    # and of the default config, are those every measured lab-tiny result used
    vocabulary = lab_vocabulary()
    assert len(vocabulary) == 215
    assert hashlib.sha256(json.dumps(vocabulary).encode()).hexdigest()[:16] == "3c5ed6c6f212396c"
    assert "told" not in LabConfig().to_dict() and LabConfig(told=True).to_dict()["told"] is True
    assert lab_tiny_dir(Path("cache")).name == "lab-tiny-d58e767ce5"


def test_the_told_recipe_is_the_lab_recipe_on_lab_told_and_keeps_every_demonstration_whole(told):
    lab = yaml.safe_load((RECIPES / "lab.yaml").read_text())
    lab_told = yaml.safe_load((RECIPES / "lab-told.yaml").read_text())
    assert (lab_told["suite"], lab_told["run_dir"]) == ("lab-told", "runs/lab-told")
    assert {k: v for k, v in lab_told.items() if k not in ("suite", "run_dir")} == {
        k: v for k, v in lab.items() if k not in ("suite", "run_dir")
    }
    from agents.training.demonstrations import build_demonstrations

    max_seq_len = lab_told["sft"]["max_seq_len"]
    demos, stats = build_demonstrations(  # the two longest families: two packs, two ships, two outputs each
        build_lab_tokenizer(), "lab-told", ["ship_two", "full_job"], "train", max_tokens=max_seq_len, overflow="drop"
    )
    assert stats.dropped_length == stats.truncated == 0 and len(demos) == 2 * told.config.train_tasks
    longest = max(len(d.token_ids) for d in demos)
    assert longest <= max_seq_len <= LabTinySizes().max_position_embeddings


def test_reference_solutions_score_one_through_the_registered_env(told):
    env = gym.make("EnvACE-Tool-v0", suite="lab-told", split="test", max_steps_per_turn=8).unwrapped
    for task in env.tasks[::25]:
        env.reset(options={"task_id": task.id})
        system = env.trajectory.messages[0].content
        assert system == task.turns[0][0].content and ". room " in system and ". box " in system
        for calls in told.ground_truth(task):
            for call in calls:
                env.step(format_tool_calls([call], "hermes"))
            _, reward, terminated, _, info = env.step("Done.")
        assert terminated and reward == 1.0, (task.id, info["verifier"])


def test_told_needs_the_hidden_rules_and_a_told_prompt(hidden):
    with pytest.raises(ValueError, match="told"):
        LabConfig(rules="stated", told=True)
    with pytest.raises(ValueError, match="tells no facts"):
        told_facts_from_prompt(hidden.tasks(["ship"], "test")[0])
    with pytest.raises(ValueError, match="hidden rules"):
        told_facts_text(Warehouse(capacity=3, shelves={"A": ["apple"]}))


def test_the_hidden_discrete_twin_plays_the_told_tasks_but_observes_no_told_fact():
    from benchmarks.experiments.maskable_ppo import discrete_twin

    assert discrete_twin("lab") == "EnvACE-LabHiddenDiscrete-v0" and discrete_twin("lab-told") is None
    plain = gym.make("EnvACE-LabHiddenDiscrete-v0", suite="lab", split="test")
    told = gym.make("EnvACE-LabHiddenDiscrete-v0", suite="lab-told", split="test")
    for task_id in ("ship_test0", "full_job_test3"):
        a, _ = plain.reset(options={"task_id": task_id})
        b, _ = told.reset(options={"task_id": task_id})
        assert np.array_equal(a, b)
