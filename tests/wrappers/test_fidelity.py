"""RehearsalFidelity: the three metrics on hand-made pairs, and per-call records in a wrapped rehearse env whose
rehearser is scripted (so the expected numbers are computable by hand)."""

from __future__ import annotations

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401
import tests.testing_env  # noqa: F401
from envace_gym.envs.rehearse import RehearseEnv
from envace_gym.rehearsal import RehearseResponse
from wrappers import RealTools, RehearsalFidelity
from wrappers.fidelity import exact_match, fidelity_metrics, json_structure_match, token_f1


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
        RehearsalFidelity(RealTools(gym.make("EnvACE-Rehearse-v0", suite="scripted", categories=None, model="tiny-random")))
    with pytest.raises(TypeError):
        RehearsalFidelity(gym.make("EnvACE-Tool-v0", suite="scripted", categories=None))
