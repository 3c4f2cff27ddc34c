"""RehearsalFidelity: the three metrics on hand-made pairs, and per-call records in a wrapped rehearse env whose
rehearser is scripted (so the expected numbers are computable by hand), overall and split by whether the real
output is an error."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401
import tests.testing_env  # noqa: F401
from envace_gym.envs.rehearse import RehearseEnv
from envace_gym.rehearsal import RehearseResponse
from wrappers import RealTools, RehearsalFidelity
from wrappers.fidelity import (
    METRICS,
    exact_match,
    fidelity_metrics,
    fidelity_summary,
    is_error_output,
    json_structure_match,
    outcome_match,
    token_f1,
)


def test_exact_match():
    assert exact_match('{"total": 3}', ' {"total": 3}\n') == 1.0
    assert exact_match('{"total": 3}', '{"total":3}') == 0.0


def test_json_structure_match():
    assert json_structure_match('{"total": 3, "ok": true}', '{"ok": false, "total": 5.5}') == 1.0  # values differ
    assert json_structure_match('{"total": 3}', '{"sum": 3}') == 0.0  # keys differ
    assert json_structure_match('{"a": {"b": [1, "x"]}}', '{"a": {"b": [2, "y"]}}') == 1.0
    assert json_structure_match('{"a": {"b": [1, "x"]}}', '{"a": {"b": [1, 2]}}') == 0.0  # str vs number
    assert json_structure_match('{"a": [1]}', '{"a": [1, 2]}') == 0.0  # array lengths differ
    assert json_structure_match('{"a": true}', '{"a": 1}') == 0.0  # bool is not a number
    assert json_structure_match("not json", "not json") == 0.0


def test_token_f1_hand_computed():
    assert token_f1("same text", "same text") == 1.0
    # tokens [total, 3] vs [total, 5]: P = R = 1/2
    assert token_f1('{"total": 3}', '{"total": 5}') == pytest.approx(0.5)
    # [cat, sat, on, mat] ("the" dropped) vs [cat, sat, mat, down, down]: overlap 3, P = 3/4, R = 3/5
    assert token_f1("The cat sat on the mat.", "cat sat mat down down") == pytest.approx(2 * 0.75 * 0.6 / 1.35)
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0 and token_f1("a b", "c d") == 0.0


class FixedRehearser:
    """Answers every call with the next text of `texts` (inline mode: ids from the tokenizer)."""

    prompt_mode = "inline"

    def __init__(self, tokenizer, texts):
        self.tokenizer = tokenizer
        self.texts = list(texts)

    def rehearse(self, requests):
        out = []
        for _ in requests:
            text = self.texts.pop(0)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            out.append(RehearseResponse(text, ids, [0.0] * len(ids), None, False))
        return out


def test_wrapped_env_records_each_call_against_a_shadow_that_follows_the_rehearsed_calls(smol_tokenizer):
    rehearser = FixedRehearser(smol_tokenizer, ['{"total": 3}', '{"total": 99}', "the text is a"])
    env = RehearsalFidelity(RehearseEnv(suite="scripted", rehearser=rehearser, max_new_tokens=8))
    _, info = env.reset(seed=0, options={"task_id": "scripted_2"})
    assert info["fidelity"]["calls"] == [] and info["fidelity"]["episode"]["num_calls"] == 0
    _, _, _, _, info = env.step('<tool_call>{"name": "add", "arguments": {"value": 3}}</tool_call>')
    (c,) = info["fidelity"]["calls"]
    assert c["tool"] == "add" and c["real"] == '{"total": 3}' and c["rehearsed"] == '{"total": 3}'
    assert (c["exact_match"], c["json_structure_match"], c["token_f1"]) == (1.0, 1.0, 1.0)
    assert c["task_id"] == "scripted_2" and c["category"] == "scripted"
    # two calls in one step; the shadow has the first add applied, so the real total is 3 + 1 = 4
    _, _, _, _, info = env.step("[add(value=1), echo(text='hi')]")
    add, echo = info["fidelity"]["calls"]
    assert add["real"] == '{"total": 4}' and add["rehearsed"] == '{"total": 99}'
    assert (add["exact_match"], add["json_structure_match"], add["token_f1"]) == (0.0, 1.0, 0.5)
    assert echo["real"] == '{"text": "hi"}'
    assert echo == {**echo, **fidelity_metrics("the text is a", '{"text": "hi"}')}
    assert echo["token_f1"] == pytest.approx(2 * 0.5 * 0.5 / 1.0)  # [text, is] vs [text, hi]
    assert info["fidelity"]["episode"]["num_calls"] == 3
    assert info["fidelity"]["episode"]["exact_match"] == pytest.approx(1 / 3)
    assert len(env.episode_calls) == 3
    # the policy's trajectory still shows the rehearsed text, never the shadow's
    assert env.unwrapped.trajectory.messages[-2].content == '{"total": 99}'


def test_rejects_envs_with_real_tools():
    with pytest.raises(TypeError, match="rehearsing"):
        RehearsalFidelity(
            RealTools(gym.make("EnvACE-Rehearse-v0", suite="scripted", categories=None, model="tiny-random"))
        )
    with pytest.raises(TypeError):
        RehearsalFidelity(gym.make("EnvACE-Tool-v0", suite="scripted", categories=None))


def test_is_error_output():
    assert is_error_output('{"error": "shelf D is full: the mug fell and broke"}')
    assert is_error_output(' {"error": "no box \'A1-1\'", "hint": 1}\n')
    assert is_error_output("Error during execution: 'cd' is not an available function")
    assert is_error_output("Error: could not parse the tool call")
    assert not is_error_output('{"shelf": "A", "items": [], "free": 2}')
    assert not is_error_output('{"errors": 0}') and not is_error_output('["error"]')
    assert not is_error_output('{"error": ') and not is_error_output("The error is mine") and not is_error_output("")


def _record(real, exact, structure, f1, rehearsed):
    # no outcome_match key, as a record written before the metric existed: it is scored from the two texts
    return {
        "real": real,
        "rehearsed": rehearsed,
        "exact_match": exact,
        "json_structure_match": structure,
        "token_f1": f1,
    }


def test_outcome_match_asks_only_whether_the_call_failed():
    broke = '{"error": "shelf D is full: the mug fell and broke"}'
    assert outcome_match('{"error": "no item"}', broke) == 1.0  # foresaw a failure, not this one
    assert outcome_match('{"item": "mug", "from": "A", "to": "D"}', broke) == 0.0
    assert outcome_match('{"item": "mug"}', '{"item": "cup", "to": "B"}') == 1.0
    assert outcome_match("Error: bad call", '{"item": "mug"}') == 0.0
    assert outcome_match('{"error": "shelf D is fu', broke) == 1.0  # cut by the token cap, the failure foreseen
    assert outcome_match('{"item": "mug", "error', broke) == 0.0
    assert fidelity_metrics("x", broke)["outcome_match"] == 0.0 and set(fidelity_metrics("x", "y")) == set(METRICS)


def test_summary_and_tables_split_error_and_ordinary_outputs():
    from agents.evaluation.evaluate import FIDELITY_FIELDS, fidelity_tables

    records = [
        _record('{"error": "no box"}', 1.0, 1.0, 1.0, '{"error": "no box"}'),
        _record('{"box": "A1-1"}', 0.0, 1.0, 0.5, '{"box": "A1-2"}'),
        _record('{"box": "B2-2"}', 0.0, 0.0, 0.25, '{"error": "no item"}'),
        _record("Error during execution: boom", 0.0, 0.0, 0.0, '{"box": "C"}'),
    ]
    for r, tool, cat in zip(records, ["ship", "pack", "pack", "ship"], ["x", "x", "y", "y"]):
        r.update(tool=tool, category=cat)
    got = fidelity_summary(records)
    assert got["num_calls"] == 4 and got["exact_match"] == pytest.approx(0.25)
    assert got["token_f1"] == pytest.approx(1.75 / 4)
    assert got["outcome_match"] == 0.5
    error = {"num_calls": 2, "exact_match": 0.5, "json_structure_match": 0.5, "token_f1": 0.5, "outcome_match": 0.5}
    assert got["error"] == error
    ordinary = {"num_calls": 2, "exact_match": 0.0, "json_structure_match": 0.5, "token_f1": 0.375}
    assert got["ordinary"] == {**ordinary, "outcome_match": 0.5}
    records[2]["outcome_match"] = 1.0  # a record's own value is read, not recomputed
    assert fidelity_summary(records)["ordinary"]["outcome_match"] == 1.0
    empty = fidelity_summary(records[1:3])
    assert empty["error"] == {"num_calls": 0, **dict.fromkeys(METRICS, 0.0)}
    rows = {r["group"]: r for r in fidelity_tables(records)["output"]}
    assert list(rows) == ["error", "ordinary", "all"] and set(rows["error"]) == set(FIDELITY_FIELDS)
    assert FIDELITY_FIELDS[2:] == list(METRICS)  # the CSV columns are the metrics, in their order
    assert (rows["error"]["n_calls"], rows["error"]["exact_match"]) == (2, 0.5)
    assert (rows["ordinary"]["n_calls"], rows["ordinary"]["token_f1"]) == (2, 0.375)
    assert rows["all"]["n_calls"] == 4
    assert [r["group"] for r in fidelity_tables([])["output"]] == ["error", "ordinary", "all"]


def test_wrapped_lab_env_reports_fidelity_on_a_real_error_apart_from_ordinary_outputs(smol_tokenizer):
    from benchmarks.lab.world import Warehouse

    env = RehearsalFidelity(RehearseEnv(suite="lab", rehearser=FixedRehearser(smol_tokenizer, []), max_new_tokens=48))
    _, info = env.reset(seed=0, options={"task_id": "relocate_1"})
    state = Warehouse.from_dict(env.unwrapped.task.metadata["initial_state"])
    full = next(s for s, items in state.shelves.items() if len(items) >= state.capacity_of(s))
    item = next(i for s, items in state.shelves.items() if s != full for i in items)
    broke = f'{{"error": "shelf {full} is full: the {item} fell and broke"}}'
    # an ordinary output rehearsed wrong (free slots and items), then the break foreseen exactly
    wrong = json.dumps({"shelf": full, "items": state.shelves[full], "free": 1}, separators=(", ", ": "))
    env.unwrapped.rehearser.texts = [wrong, broke]
    _, _, _, _, info = env.step(f'<tool_call>{{"name": "list_shelf", "arguments": {{"shelf": "{full}"}}}}</tool_call>')
    (look,) = info["fidelity"]["calls"]
    assert not look["real_error"] and look["exact_match"] == 0.0 and look["json_structure_match"] == 1.0
    _, _, _, _, info = env.step(
        f'<tool_call>{{"name": "move", "arguments": {{"item": "{item}", "shelf": "{full}"}}}}</tool_call>'
    )
    (move,) = info["fidelity"]["calls"]
    assert move["real"] == broke and move["real_error"] and move["exact_match"] == 1.0
    episode = info["fidelity"]["episode"]
    assert (episode["num_calls"], episode["exact_match"]) == (2, 0.5)  # the overall keys as before
    assert (episode["error"]["num_calls"], episode["error"]["exact_match"]) == (1, 1.0)
    assert (episode["ordinary"]["num_calls"], episode["ordinary"]["exact_match"]) == (1, 0.0)
    assert episode["ordinary"]["json_structure_match"] == 1.0
