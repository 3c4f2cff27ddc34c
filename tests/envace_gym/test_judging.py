"""`envace_gym.judging`: verdicts are read from JSON or a fixed yes/no opening and never executed; checklists load
from JSONL with clear errors; the judge prompts follow the user turns (the scoring itself, with real models, is in
tests/agents/test_judges.py)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envace_gym.judging import (
    JUDGE_SYSTEM_PROMPT,
    Checklist,
    ChecklistItem,
    checklist_prompts,
    conversation_turns,
    load_checklists,
    parse_json_object,
    parse_verdict,
    transcript,
    write_checklists,
)
from envace_gym.types import Message, Task, ToolCall, Trajectory


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ('{"answer": true}', True),
        ('{"answer": false}', False),
        ('{"result": "yes"}', True),
        ('{"metExpectation": false, "reasoning": "no"}', False),
        ('```json\n{"answer": true}\n```', True),
        ('First {"answer": false} then, on reflection, {"answer": true}', True),  # the last object decides
        ('<think>maybe {"answer": false}</think>{"answer": true}', True),  # reasoning is dropped
        ("Yes, the assistant moved the lamp.", True),
        ("no", False),
        ("**No**. It broke the vase.", False),
        ("Answer: true", True),
        ("Verdict: NO", False),
        ("I cannot tell whether the answer is yes or no.", None),  # a yes later in a sentence is not a verdict
        ('{"answer": 1}', None),  # 1 is not a boolean verdict
        ('{"score": true}', None),  # not a verdict key
        ("", None),
        ("yesterday the lamp moved", None),  # a word that starts with yes
    ],
)
def test_verdicts_are_read_from_json_or_a_yes_no_opening(text, verdict):
    assert parse_verdict(text) is verdict


def test_a_verdict_is_never_executed(tmp_path):
    marker = tmp_path / "ran"
    code = f"__import__('pathlib').Path({str(marker)!r}).write_text('x')"
    for text in (code, f"eval({code!r})", f'{{"answer": {code}}}', f"```python\n{code}\n```"):
        assert parse_verdict(text) is None
    assert not marker.exists()


def test_a_reply_full_of_braces_is_read_in_bounded_time():
    text = "{" * 200_000 + '"answer": true'
    t0 = time.perf_counter()
    assert parse_json_object(text) is None
    assert time.perf_counter() - t0 < 5.0


@given(st.text(max_size=200))
def test_any_text_gives_a_verdict_or_none(text):
    assert parse_verdict(text) in (True, False, None)


def test_checklists_round_trip_through_jsonl(tmp_path):
    path = tmp_path / "c.jsonl"
    lists = [
        Checklist("a", [[ChecklistItem("moved the lamp", 2.0), ChecklistItem("no error")], []]),
        Checklist("b", [[ChecklistItem("said hello", 0.5)]]),
    ]
    assert write_checklists(path, lists) == 2
    back = load_checklists(path)
    assert back == {"a": lists[0], "b": lists[1]}
    assert back["a"].num_items == 2


def test_cm2_question_key_and_extra_keys_are_read(tmp_path):
    path = tmp_path / "c.jsonl"
    record = {"task_id": "t", "turns": [[{"question": "Did it call ship?", "weight": 3, "focus_on": "assistant"}]]}
    path.write_text("\n" + json.dumps(record) + "\n\n")
    assert load_checklists(path)["t"].turns == [[ChecklistItem("Did it call ship?", 3.0)]]


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ([1, 2], "JSON object"),
        ({"turns": [[{"item": "x"}]]}, "task_id"),
        ({"task_id": "t", "turns": [{"item": "x"}]}, "of lists of items"),
        ({"task_id": "t", "turns": [["x"]]}, "turn 0, item 0"),
        ({"task_id": "t", "turns": [[{"item": "  "}]]}, "non-empty string"),
        ({"task_id": "t", "turns": [[{"item": "x", "weight": 0}]]}, "> 0"),
        ({"task_id": "t", "turns": [[{"item": "x", "weight": "2"}]]}, "must be a number"),
        ({"task_id": "t", "turns": [[{"item": "x", "weight": True}]]}, "must be a number"),
        ({"task_id": "t", "turns": [[], []]}, "no item"),
    ],
)
def test_bad_checklists_name_the_line_and_the_field(tmp_path, record, message):
    path = tmp_path / "c.jsonl"
    good = {"task_id": "ok", "turns": [[{"item": "x"}]]}
    path.write_text(json.dumps(good) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=message) as err:
        load_checklists(path)
    assert f"{path}:2:" in str(err.value)


def test_a_task_given_twice_and_a_line_that_is_not_json_are_refused(tmp_path):
    path = tmp_path / "c.jsonl"
    good = json.dumps({"task_id": "ok", "turns": [[{"item": "x"}]]})
    path.write_text(good + "\n" + good + "\n")
    with pytest.raises(ValueError, match=":2: task 'ok'"):
        load_checklists(path)
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match=":1:"):
        load_checklists(path)
    with pytest.raises(FileNotFoundError):
        load_checklists(tmp_path / "missing.jsonl")


def two_turn_trajectory() -> Trajectory:
    task = Task("t", "lab", [[Message("user", "move the lamp")], [Message("user", "now ship it")]], [], "lab")
    call = ToolCall("move", {"item": "lamp", "shelf": "B"}, id="c1")
    messages = [
        Message("system", "You run a warehouse."),
        Message("user", "move the lamp"),
        Message("assistant", '<tool_call>{"name": "move"}</tool_call>', tool_calls=[call]),
        Message("tool", '{"ok": true}', tool_call_id="c1", name="move"),
        Message("assistant", "Done."),
        Message("user", "now ship it"),
        Message("assistant", "I cannot ship it."),
    ]
    return Trajectory(task=task, messages=messages)


def test_turns_and_transcripts_follow_the_conversation():
    traj = two_turn_trajectory()
    turns = conversation_turns(traj.messages)
    assert [len(t) for t in turns] == [5, 2]
    text = transcript(turns[0])
    assert 'assistant: [calls] move {"item": "lamp", "shelf": "B"}' in text
    assert 'tool (move): {"ok": true}' in text and "<tool_call>" not in text


def test_each_item_is_asked_on_the_conversation_up_to_its_turn():
    traj = two_turn_trajectory()
    checklist = Checklist(
        "t", [[ChecklistItem("moved the lamp to B")], [ChecklistItem("shipped")], [ChecklistItem("x")]]
    )
    asked = checklist_prompts(traj, checklist)
    assert [(k, j) for k, j, _ in asked] == [(0, 0), (1, 0), (2, 0)]
    first, second, third = (p for _, _, p in asked)
    assert first[0] == Message("system", JUDGE_SYSTEM_PROMPT)
    assert "moved the lamp to B" in first[1].content and "now ship it" not in first[1].content
    assert "Conversation before this turn" in second[1].content and "I cannot ship it." in second[1].content
    assert third is None  # the conversation never reached a third user turn: not asked


def test_the_last_checklist_turn_covers_later_user_turns():
    traj = two_turn_trajectory()
    asked = checklist_prompts(traj, Checklist("t", [[ChecklistItem("the whole job")]]))
    ((_, _, prompt),) = asked
    assert "now ship it" in prompt[1].content and "I cannot ship it." in prompt[1].content


def test_the_outer_object_is_read_not_its_last_nested_one():
    assert parse_json_object('Here: {"results": [{"metExpectation": true}]} done') == {
        "results": [{"metExpectation": True}]
    }
    assert parse_json_object('{"a": 1} and later {"b": {"c": 2}}') == {"b": {"c": 2}}


def test_system_messages_can_be_left_out_of_the_judged_transcript():
    traj = two_turn_trajectory()
    checklist = Checklist("t", [[ChecklistItem("moved the lamp")]])
    ((_, _, full),) = checklist_prompts(traj, checklist)
    ((_, _, short),) = checklist_prompts(traj, checklist, system=False)
    assert "You run a warehouse." in full[1].content and "You run a warehouse." not in short[1].content
    assert "move the lamp" in short[1].content
