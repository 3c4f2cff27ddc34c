"""Demonstrations: real BFCL executions relabelled for SFT, the length cap, and the JSONL
rejection-sampling path over RecordTrajectories on the scripted suite."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401
import tests.testing_env  # noqa: F401  (registers the scripted suite)
from agents.demonstrations import (
    DONE_MESSAGE,
    NO_CALL_MESSAGE,
    build_demonstrations,
    cap_length,
    load_recorded_trajectories,
    relabel_for_sft,
)
from envace_gym.parsing import parse_tool_calls
from envace_gym.rendering import ChatRenderer
from envace_gym.types import Role, Trajectory
from wrappers import RealTools, RecordTrajectories

# two train tasks of each multi-turn category (ids fixed so the test is deterministic and quick)
CATEGORIES = ["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"]


@pytest.fixture(scope="module")
def bfcl_demos(smol_tokenizer):
    from benchmarks.bfcl.suite import BFCLSuite

    suite = BFCLSuite()
    ids = [t.id for c in CATEGORIES for t in suite.tasks([c], "train")[:2]]
    demos, stats = build_demonstrations(smol_tokenizer, "bfcl", CATEGORIES, "train", task_ids=ids, max_tokens=None)
    return demos, stats, ids


def test_bfcl_demos_have_partitioned_roles_real_rehearse_content_and_reward_one(bfcl_demos, smol_tokenizer):
    from benchmarks.bfcl.verify import ground_truth_tool_calls, make_multi_turn_backend

    demos, stats, ids = bfcl_demos
    assert stats.kept == len(ids) == len(demos) and stats.skipped_reward == stats.skipped_error == 0
    stop = ChatRenderer(smol_tokenizer).stop_token_ids[0]
    for demo in demos:
        assert demo.reward == 1.0 and demo.terminated
        # the roles partition the sequence: one Role per token, and no real result left untrained
        assert len(demo.role_mask) == len(demo.token_ids)
        assert set(demo.role_mask) <= {int(r) for r in Role} and int(Role.OBSERVATION) not in demo.role_mask
        assert demo.segments[0].role == Role.PROMPT
        # REHEARSE content == the real backend's results of the ground truth, replayed on a fresh backend
        gt = ground_truth_tool_calls(demo.task)
        backend = make_multi_turn_backend(demo.task)
        expected = [backend.execute(c) for turn in gt for c in turn]
        rehearse = [s for s in demo.segments if s.role == Role.REHEARSE]
        assert len(rehearse) == len(expected)
        for seg, want in zip(rehearse, expected):
            assert seg.token_ids[-1] == stop  # ends like an inline rehearsal: with <|im_end|>
            assert smol_tokenizer.decode(seg.token_ids[:-1]) == want
        # ACT: one ground-truth call per message, then one closing message per user turn
        acts = [s for s in demo.segments if s.role == Role.ACT]
        assert len(acts) == sum(len(t) for t in gt) + len(gt)
        texts = [smol_tokenizer.decode(s.token_ids[:-1]) for s in acts]
        assert all(s.token_ids[-1] == stop and s.logprobs is None for s in acts)
        it = iter(texts)
        for turn in gt:
            for call in turn:
                (parsed,) = parse_tool_calls(next(it))
                assert (parsed.name, parsed.arguments) == (call.name, call.arguments)
            assert next(it) == (DONE_MESSAGE if turn else NO_CALL_MESSAGE)


def test_miss_func_demo_reveals_held_out_tools(bfcl_demos, smol_tokenizer):
    demos, _, _ = bfcl_demos
    (demo, *_) = [d for d in demos if d.task.held_out_tools]
    turn, tools = next(iter(demo.task.held_out_tools.items()))
    prompt_text = "".join(smol_tokenizer.decode(s.token_ids) for s in demo.segments if s.role == Role.PROMPT)
    assert all(t.name in prompt_text for t in tools)


def test_cap_length_truncates_to_a_prefix_or_drops(bfcl_demos):
    demos, _, _ = bfcl_demos
    demo = demos[0]
    n = len(demo.token_ids)
    first_act = demo.role_mask.index(int(Role.ACT))
    cut, was_cut = cap_length(demo, first_act + 5)
    assert was_cut and cut.token_ids == demo.token_ids[: first_act + 5] and cut.role_mask == demo.role_mask[: first_act + 5]
    assert cap_length(demo, n) == (demo, False)
    assert cap_length(demo, n - 1, "drop") == (None, False)
    assert cap_length(demo, first_act, "truncate") == (None, False)  # nothing left to train
    with pytest.raises(ValueError):
        cap_length(demo, 10, "wrap")


def test_single_turn_tasks_give_one_message_demonstrations_that_score_one(smol_tokenizer):
    demos, stats = build_demonstrations(smol_tokenizer, "bfcl", ["simple_python", "irrelevance"], "train", limit=4)
    assert stats.kept == len(demos) == 4 and stats.skipped_reward == 0
    for demo in demos:
        acts = [m for m in demo.messages if m.role == "assistant"]
        assert demo.reward == 1.0 and len(acts) == 1
        assert (acts[0].tool_calls is None) == (demo.task.metadata["category"] == "irrelevance")


def test_any_suite_with_a_reference_solution_gives_demonstrations(smol_tokenizer):
    from tests.testing_env import TASKS

    demos, stats = build_demonstrations(smol_tokenizer, "scripted", None, "train", max_tokens=None)
    assert stats.kept == len(demos) == len(TASKS)
    for demo in demos:
        assert demo.reward == 1.0 and Role.REHEARSE in {s.role for s in demo.segments}
    with pytest.raises(ValueError, match="unknown suite"):
        build_demonstrations(smol_tokenizer, "no-such-suite")


ADD = '<tool_call>{{"name": "add", "arguments": {{"value": {v}}}}}</tool_call>'


def _episode(env, task_id, actions):
    env.reset(seed=0, options={"task_id": task_id})
    for a in actions:
        *_, term, trunc, info = env.step(a)
        if term or trunc:
            return info
    raise AssertionError("episode did not end")


def test_jsonl_rejection_sampling_keeps_records_above_threshold(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    env = RecordTrajectories(
        RealTools(gym.make("EnvACE-Rehearse-v0", suite="scripted", categories=None, model="tiny-random")),
        path, include_tokens=True,
    )
    good = _episode(env, "scripted_0", [ADD.format(v=2), "done"])  # target total 2: reward 1
    bad = _episode(env, "scripted_0", [ADD.format(v=5), "<tool_call>{not json</tool_call>", "done"])  # total 5, and a parse error
    assert good["trajectory_record"]["reward"] == 1.0 and bad["trajectory_record"]["reward"] == 0.0
    plain = RecordTrajectories(RealTools(gym.make("EnvACE-Rehearse-v0", suite="scripted", categories=None,
                                                  model="tiny-random")), path, include_tokens=False)
    _episode(plain, "scripted_0", [ADD.format(v=2), "done"])  # reward 1 but no tokens recorded

    stop = ChatRenderer(env.unwrapped.rehearser.tokenizer).stop_token_ids
    kept, stats = load_recorded_trajectories(path, stop, min_reward=1.0)
    assert (stats.considered, stats.kept, stats.skipped_reward, stats.skipped_no_tokens) == (3, 1, 1, 1)
    (traj,) = kept
    recorded = Trajectory.from_dict(json.loads(path.read_text().splitlines()[0])["trajectory"])
    assert traj.token_ids == recorded.token_ids  # relabelling moves roles, never ids
    roles = [s.role for s in traj.segments]
    assert Role.OBSERVATION not in roles and roles.count(Role.REHEARSE) == 1 and roles.count(Role.ACT) == 2

    both, stats0 = load_recorded_trajectories(path, stop, min_reward=0.0)
    assert stats0.kept == 2
    # the parse-error observation (a tool message without a call id) stays OBSERVATION: no loss on it
    bad_traj = both[1]
    assert [s.role for s in bad_traj.segments].count(Role.OBSERVATION) == 1
    assert [s.role for s in bad_traj.segments].count(Role.REHEARSE) == 1
    # a relabelled trajectory relabels to itself
    again = relabel_for_sft(bad_traj, stop)
    assert again.role_mask == bad_traj.role_mask and again.token_ids == bad_traj.token_ids


def test_jsonl_malformed_line_raises(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"reward": 1.0, "trajectory": {}}\nnot json\n')
    with pytest.raises(ValueError):
        load_recorded_trajectories(path, [2], min_reward=0.0)
