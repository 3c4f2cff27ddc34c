"""Demonstrations: real BFCL executions relabelled for SFT, the length cap, and the JSONL
rejection-sampling path over RecordTrajectories on the scripted suite."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401
import tests.testing_env  # noqa: F401  (registers the scripted suite)
from agents.training.demonstrations import (
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
    assert (
        was_cut
        and cut.token_ids == demo.token_ids[: first_act + 5]
        and cut.role_mask == demo.role_mask[: first_act + 5]
    )
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


def _recorder(path, include_tokens=True):
    """The scripted suite's real-backend env recording every episode to the JSONL `path`."""
    env = RealTools(gym.make("EnvACE-Rehearse-v0", suite="scripted", categories=None, model="tiny-random"))
    return RecordTrajectories(env, path, include_tokens=include_tokens)


def test_jsonl_rejection_sampling_keeps_records_above_threshold(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    env = _recorder(path)
    good = _episode(env, "scripted_0", [ADD.format(v=2), "done"])  # target total 2: reward 1
    bad = _episode(
        env, "scripted_0", [ADD.format(v=5), "<tool_call>{not json</tool_call>", "done"]
    )  # total 5, and a parse error
    assert good["trajectory_record"]["reward"] == 1.0 and bad["trajectory_record"]["reward"] == 0.0
    plain = _recorder(path, include_tokens=False)
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


# --------------------------------------------------------------------------------------- error demonstrations
# relocate_1: a move onto a full shelf (breaks) and an unknown item; ship_two_0: unknown items, wrong labels and a
# repeated ship; make_room_0: moves onto full shelves and repeated moves. mutations=10 takes every mistake the
# suite proposes.
ERROR_TASKS = ["relocate_1", "ship_two_0", "make_room_0"]


@pytest.fixture(scope="module")
def lab_error_demos(smol_tokenizer):
    demos, stats = build_demonstrations(
        smol_tokenizer, "lab", None, "train", task_ids=ERROR_TASKS, max_tokens=None, mutations=10, seed=0
    )
    return demos, stats


def _spans(demo):
    """(role, start, end, segment) of each segment, token offsets into the demo."""
    out, at = [], 0
    for seg in demo.segments:
        out.append((seg.role, at, at + len(seg), seg))
        at += len(seg)
    return out


def _replay(task, calls):
    """A fresh lab backend after `calls`, and the outputs."""
    from benchmarks.lab.suite import LabSuite

    backend = LabSuite().make_backend(task)
    return backend, [backend.execute(c) for c in calls]


def test_error_demos_hold_the_real_backends_error_output_and_train_it_but_not_the_mistaken_call(
    lab_error_demos, smol_tokenizer
):
    import torch

    from agents.training.sft import collate, role_weights
    from envace_gym.parsing import format_tool_calls
    from envace_gym.types import ToolCall

    demos, stats = lab_error_demos
    errors = [d for d in demos if "mutation" in d.task.metadata]
    assert stats.error_demos == len(errors) >= 6 and stats.skipped_mutation == 0
    assert stats.kept == len(demos) == len(ERROR_TASKS) + len(errors)
    stop = ChatRenderer(smol_tokenizer).stop_token_ids[0]
    _, _, role_mask = collate(errors, pad_id=0)  # (N, T): what SFTTrainer.train_step feeds sft_loss
    weights = role_weights(role_mask, {Role.ACT: 1.0, Role.REHEARSE: 1.0})  # (N, T)
    for row, demo in enumerate(errors):
        m = demo.task.metadata["mutation"]
        call = ToolCall.from_openai(m["call"])
        reference = [c for turn in demo.task.metadata["reference"] for c in turn]
        # the output is what a fresh real backend answers to the mistake after the reference calls before it
        backend, _ = _replay(demo.task, [ToolCall.from_openai(c) for c in reference[: m["position"]]])
        before = backend.snapshot()
        assert backend.execute(call) == m["output"] and json.loads(m["output"]).keys() == {"error"}
        assert m["breaks"] == (backend.snapshot() != before)
        # the mistaken message: one segment, relabelled PROMPT; its tokens carry no loss
        spans = _spans(demo)
        matching = [i for i, (_, _, _, s) in enumerate(spans) if s.text == format_tool_calls([call], "hermes")]
        repeat = m["position"] > 0 and call == ToolCall.from_openai(reference[m["position"] - 1])
        assert len(matching) == 1 + repeat  # a repeated call follows the reference call it repeats
        k = matching[-1]
        role, a, b, seg = spans[k]
        assert role == Role.PROMPT and seg.token_ids[-1] == stop and seg.logprobs is None
        assert set(role_mask[row, a:b].tolist()) == {int(Role.PROMPT)} and float(weights[row, a:b].sum()) == 0.0
        # the next tool content is the error output as a REHEARSE target (ending with <|im_end|>), with loss
        role, a, b, seg = next(x for x in spans[k + 1 :] if x[0] in (Role.REHEARSE, Role.OBSERVATION))
        assert role == Role.REHEARSE and smol_tokenizer.decode(seg.token_ids[:-1]) == m["output"]
        assert bool(torch.all(weights[row, a:b] == 1.0))
        # the reference ACT messages before the mistake still carry loss
        assert any(s[0] == Role.ACT for s in spans[:k]) == (m["position"] > 0)


def test_a_broken_item_ends_its_demonstration_after_the_error_and_a_failed_call_continues(lab_error_demos):
    from benchmarks.lab.suite import LabSuite
    from envace_gym.types import ToolCall

    demos, stats = lab_error_demos
    errors = [d for d in demos if "mutation" in d.task.metadata]
    broken = [d for d in errors if d.task.metadata["mutation"]["breaks"]]
    going_on = [d for d in errors if not d.task.metadata["mutation"]["breaks"]]
    assert stats.error_demos_breaking == len(broken) >= 2 and len(going_on) >= 4
    for demo in broken:
        m = demo.task.metadata["mutation"]
        call = ToolCall.from_openai(m["call"])
        reference = [ToolCall.from_openai(c) for turn in demo.task.metadata["reference"] for c in turn]
        backend, _ = _replay(demo.task, reference[: m["position"]])
        assert call.name == "move" and call.arguments["shelf"] != backend.state.shelf_of(call.arguments["item"])
        shelf = call.arguments["shelf"]
        assert len(backend.state.shelves[shelf]) >= backend.state.capacity_of(shelf)  # full at that point
        assert "broke" in m["output"]
        # nothing after the error output: no ACT, no closing message
        assert demo.messages[-1].role == "tool" and demo.messages[-1].content == m["output"]
        last = max(i for i, s in enumerate(demo.segments) if s.role != Role.TEMPLATE)
        assert demo.segments[last].role == Role.REHEARSE and not demo.terminated
        mistaken = [i for i, s in enumerate(demo.segments) if s.role == Role.PROMPT][-1]
        assert all(s.role != Role.ACT for s in demo.segments[mistaken:])
    labels = repeats = 0
    for demo in going_on:
        m = demo.task.metadata["mutation"]
        call = ToolCall.from_openai(m["call"])
        reference = [ToolCall.from_openai(c) for turn in demo.task.metadata["reference"] for c in turn]
        right = reference[m["position"]]
        backend, _ = _replay(demo.task, reference[: m["position"]])
        if m["position"] and call == reference[m["position"] - 1]:
            repeats += 1  # the last call again: the item is already there, the box already shipped
            assert "already" in m["output"]
        elif call.name == "ship":
            labels += 1
            assert right.name == "ship" and call.arguments["box"] != right.arguments["box"]
            assert right.arguments["box"] in backend.state.boxes and call.arguments["box"] not in backend.state.boxes
        else:
            initial = demo.task.metadata["initial_state"]["shelves"]
            assert call.arguments["item"] not in {i for items in initial.values() for i in items}
        # the next ACT message is the reference call the mistake preceded, and the episode ends as the reference
        mistaken = [i for i, s in enumerate(demo.segments) if s.role == Role.PROMPT][-1]
        nxt = next(s for s in demo.segments[mistaken + 1 :] if s.role == Role.ACT)
        (parsed,) = parse_tool_calls(nxt.text)
        assert (parsed.name, parsed.arguments) == (right.name, right.arguments)
        assert demo.terminated
        result = LabSuite().verify(demo)  # replays the messages' calls, the mistaken one included
        assert result.details["state_matches"] and result.details["failed_calls"] == 1 and result.reward == 0.0
    assert labels >= 2 and repeats >= 2


def test_reference_demos_are_unchanged_by_mutations_and_draws_follow_the_seed(lab_error_demos, smol_tokenizer):
    demos, _ = lab_error_demos
    plain, stats = build_demonstrations(smol_tokenizer, "lab", None, "train", task_ids=ERROR_TASKS, max_tokens=None)
    zero, _ = build_demonstrations(
        smol_tokenizer, "lab", None, "train", task_ids=ERROR_TASKS, max_tokens=None, mutations=0, seed=5
    )
    assert stats.error_demos == 0 and all("mutation" not in d.task.metadata for d in plain)
    references = [d for d in demos if "mutation" not in d.task.metadata]
    for got in (references, zero):
        assert [(d.task.id, d.token_ids, d.role_mask) for d in got] == [
            (d.task.id, d.token_ids, d.role_mask) for d in plain
        ]

    def drawn(seed):
        got, _ = build_demonstrations(
            smol_tokenizer, "lab", None, "train", task_ids=ERROR_TASKS, max_tokens=None, mutations=1, seed=seed
        )
        return [(d.task.id, d.task.metadata.get("mutation"), d.token_ids) for d in got]

    first = drawn(0)
    assert len(first) == 2 * len(ERROR_TASKS) and first == drawn(0)
    assert any(drawn(s) != first for s in (1, 2, 3))


def test_all_calls_per_message_splits_the_turn_around_the_mistake(smol_tokenizer):
    demos, stats = build_demonstrations(
        smol_tokenizer,
        "lab",
        None,
        "train",
        task_ids=["ship_two_0"],
        max_tokens=None,
        mutations=10,
        calls_per_message="all",
    )
    (demo,) = [d for d in demos if d.task.metadata.get("mutation", {}).get("position") == 1]
    acts = [
        parse_tool_calls(s.text) if "<tool_call>" in s.text else s.text for s in demo.segments if s.role == Role.ACT
    ]
    reference = demo.task.metadata["reference"][0]
    assert [[c.name for c in a] for a in acts[:2]] == [["pack"], [c["function"]["name"] for c in reference[1:]]]
    assert acts[2] == DONE_MESSAGE and len(acts) == 3 and demo.terminated


def test_a_proposed_call_that_does_not_fail_is_skipped_and_suites_without_mistakes_refuse(smol_tokenizer, monkeypatch):
    from benchmarks.lab.suite import LabSuite
    from envace_gym.types import ToolCall

    with pytest.raises(ValueError, match="proposes no mistakes"):
        build_demonstrations(smol_tokenizer, "scripted", None, "train", mutations=1)
    with pytest.raises(ValueError, match="mutations must be"):
        build_demonstrations(smol_tokenizer, "lab", None, "train", mutations=-1)
    look = ToolCall("list_shelf", {"shelf": "A"})  # answered without an error: not a mistake
    monkeypatch.setattr(LabSuite, "mutations", lambda self, task, calls, rng: [(0, look)])
    demos, stats = build_demonstrations(smol_tokenizer, "lab", None, "train", task_ids=["relocate_1"], mutations=1)
    assert (stats.kept, stats.error_demos, stats.skipped_mutation) == (1, 0, 1) and len(demos) == 1
    monkeypatch.setattr(LabSuite, "mutations", lambda self, task, calls, rng: [(len(calls), ToolCall("locate", {}))])
    with pytest.raises(ValueError, match="outside"):
        build_demonstrations(smol_tokenizer, "lab", None, "train", task_ids=["relocate_1"], mutations=1)


def test_max_demos_caps_the_sources_in_order_and_says_what_it_cut(tmp_path):
    from agents.models import default_store
    from agents.training.sft import SFTConfig, load_sft_data

    path = tmp_path / "recorded.jsonl"
    env = _recorder(path)
    for _ in range(2):
        assert _episode(env, "scripted_0", [ADD.format(v=2), "done"])["trajectory_record"]["reward"] == 1.0
    tokenizer = default_store().tokenizer("tiny-random")
    ids = ["scripted_0", "scripted_1"]

    def load(cap):
        return load_sft_data(SFTConfig(data=["scripted", str(path)], task_ids=ids, max_demos=cap), tokenizer)

    demos, stats = load(3)
    assert len(demos) == 3 and [stats[s]["kept"] for s in stats] == [2, 2]  # kept: what each source gave
    assert [stats[s]["cut_by_max_demos"] for s in stats] == [0, 1]  # the later source pays for the cap
    demos, stats = load(2)
    assert [d.task.id for d in demos] == ids and stats[str(path)]["cut_by_max_demos"] == 2
    demos, stats = load(0)
    assert len(demos) == 4 and [stats[s]["cut_by_max_demos"] for s in stats] == [0, 0]


def test_sft_error_demos_option_reaches_the_demonstrations(smol_tokenizer):
    from agents.training.sft import SFTConfig, load_sft_data

    with pytest.raises(ValueError, match="proposes no mistakes"):
        SFTConfig(data=["scripted"], error_demos=1).check_error_demos()  # what SFTTrainer checks first
    with pytest.raises(ValueError, match="error_demos must be >= 0"):
        SFTConfig(data=["lab"], error_demos=-1)
    demos, stats = load_sft_data(SFTConfig(data=["lab"], task_ids=["relocate_1"], error_demos=2), smol_tokenizer)
    assert (stats["lab"]["kept"], stats["lab"]["error_demos"], len(demos)) == (3, 2, 3)
    assert sum("mutation" in d.task.metadata for d in demos) == 2


def test_memory_demos_are_reference_executions_read_after_the_policys_own_rehearsal_memory(tmp_path, smol_tokenizer):
    from agents.policy import load_policy
    from agents.training.demonstrations import record_memory_demonstrations
    from envace_gym.suites import make_suite
    from wrappers.test_time_rehearsal import MEMORY_HEADER

    policy = load_policy("tiny-random")
    suite = make_suite("lab")
    pool = {t.id: t for t in suite.tasks(["relocate", "ship_two"], "train")}
    ids = [suite.tasks(["relocate"], "train")[0].id, suite.tasks(["ship_two"], "train")[1].id]
    path = tmp_path / "memory_demos.jsonl"
    settings = dict(task_ids=ids, n=2, attempt_max_steps=2, max_new_tokens=8, seed=3)
    counts = record_memory_demonstrations(policy, path, "lab", ["relocate", "ship_two"], batch=2, **settings)
    one_at_a_time = tmp_path / "one_at_a_time.jsonl"  # each task's attempts are seeded by the task, not the batch
    record_memory_demonstrations(policy, one_at_a_time, "lab", ["relocate", "ship_two"], batch=1, **settings)
    memory_messages = [
        sorted((r["task_id"], m["content"]) for m in r["messages"] if m["role"] == "user")
        for r in map(json.loads, sorted(path.read_text().splitlines()))
    ]
    assert memory_messages == [
        sorted((r["task_id"], m["content"]) for m in r["messages"] if m["role"] == "user")
        for r in map(json.loads, sorted(one_at_a_time.read_text().splitlines()))
    ]
    turns = sum(len(suite.ground_truth(pool[i])) for i in ids)
    assert counts["tasks"] == counts["written"] == len(ids) and counts["skipped"] == 0
    assert counts["memories"] == turns and counts["attempts"] == 2 * turns  # every user turn rehearsed twice
    assert counts["generated_tokens"] > 0 and counts["memory_tokens_mean"] > 0

    stop = ChatRenderer(smol_tokenizer).stop_token_ids
    memory_demos, stats = load_recorded_trajectories(path, stop, max_tokens=None)
    memory_demos.sort(key=lambda t: ids.index(t.task.id))
    plain, _ = build_demonstrations(smol_tokenizer, "lab", ["relocate", "ship_two"], task_ids=ids, max_tokens=None)
    assert stats.kept == len(ids)
    header = MEMORY_HEADER.format(n=2)
    for with_memory, reference in zip(memory_demos, plain):
        messages = with_memory.messages
        memories = [k for k, m in enumerate(messages) if m.role == "user" and m.content.startswith(header)]
        assert len(memories) == len(suite.ground_truth(with_memory.task))
        for k in memories:  # each memory sits right after its user request, before the turn's first ACT
            assert messages[k - 1].role == "user" and messages[k + 1].role == "assistant"
        # the committed messages are the reference execution's, real outputs included
        committed = [(m.role, m.content) for k, m in enumerate(messages) if k not in memories]
        assert committed == [(m.role, m.content) for m in reference.messages]

        # the targets are the reference's: the memory tokens carry no loss (a memory is read, never written)
        def targets(traj):
            return [(s.role, s.token_ids) for s in traj.segments if s.role in (Role.ACT, Role.REHEARSE)]

        assert targets(with_memory) == targets(reference)
        assert len(with_memory.token_ids) > len(reference.token_ids)
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        record_memory_demonstrations(policy, path, "lab", n=0)
    with pytest.raises(ValueError, match="memory must be 'trace' or 'outcomes'"):  # a summary is generated text
        record_memory_demonstrations(policy, path, "lab", memory="summary")


def test_memory_demos_with_real_attempt_outputs_show_the_break_a_rehearsal_would_have_to_foresee(tmp_path):
    from agents.training.demonstrations import record_memory_demonstrations
    from tests.wrappers.test_test_time_rehearsal import ScriptedPolicy, always

    # relocate_4 (blind): the mug's shelf D is full, so the reference puts the vase on B; the attempt does not
    wrong_move = '<tool_call>{"name": "move", "arguments": {"item": "vase", "shelf": "D"}}</tool_call>'
    policy = ScriptedPolicy(always(wrong_move))
    path = tmp_path / "real.jsonl"
    settings = dict(task_ids=["relocate_4"], n=2, attempt_max_steps=1, max_new_tokens=8, seed=0)
    counts = record_memory_demonstrations(policy, path, "lab-blind", ["relocate"], attempt_outputs="real", **settings)
    (record,) = map(json.loads, path.read_text().splitlines())
    memory = [m["content"] for m in record["messages"] if m["role"] == "user"][-1]
    assert '-> {"error": "shelf D is full: the vase fell and broke"} [error]' in memory
    assert counts["written"] == 1 and counts["attempt_error_outputs"] == 2  # both attempts broke it, on copies
    assert record["reward"] == 1.0  # the committed reference ran on the untouched backend
    assert counts["generated_tokens"] == 2 * len(policy.renderer.content_ids(wrong_move) + [policy.stop_ids[0]])
