"""The paper's model family renders right: a Qwen3-style template (think blocks, ``<tool_call>`` tags, tool
responses inside user messages; `tests.qwen3_template`) through the renderer, inline and separate rollouts,
and SFT targets. The rollout's token sequence must equal the whole-conversation render wherever the
template allows (it rewrites earlier think blocks), and recorded logprobs must match a recompute."""

from __future__ import annotations

import re

import pytest
import torch

import tests.testing_env  # noqa: F401  (registers the scripted suites)
from agents.policy import Policy, PolicyRehearser
from agents.rollout import build_batch, group_ids_for
from agents.training.logprobs import token_logprobs
from envace_gym.envs.rehearse import RehearseEnv
from envace_gym.parsing import format_tool_calls
from envace_gym.rehearsal import RehearseResponse
from envace_gym.rendering import ChatRenderer
from envace_gym.types import GeneratedText, Role, ToolCall, TurnInfo
from tests.qwen3_template import qwen3_tokenizer


@pytest.fixture(scope="module")
def qwen_tok(smol_tokenizer):
    return qwen3_tokenizer(smol_tokenizer)


@pytest.fixture(scope="module")
def r(qwen_tok):
    return ChatRenderer(qwen_tok)


class ScriptedRehearser:
    """Answers each call with a fixed tool output written as a template-following model would."""

    def __init__(self, tokenizer, renderer, outputs, end=True, prompt_mode="inline"):
        self.tokenizer, self.renderer, self.outputs, self.end = tokenizer, renderer, list(outputs), end
        self.prompt_mode = prompt_mode

    def rehearse(self, requests):
        out = []
        for _ in requests:
            text = self.outputs.pop(0)
            role = "tool" if self.prompt_mode == "inline" else "assistant"
            ids = self.renderer.content_ids(text) + (self.renderer.generation_end_ids(role) if self.end else [])
            shown = self.tokenizer.decode(ids[:-1] if self.end else ids)
            out.append(
                RehearseResponse(
                    shown,
                    ids,
                    [-1.0] * len(ids),
                    prompt_ids=[1, 2] if self.prompt_mode == "separate" else None,
                    stopped=self.end,
                )
            )
        return out


def _act(r, text):
    return GeneratedText(text, r.content_ids(text) + r.generation_end_ids("assistant"), None)


def _call(value, think="I add it."):
    return f"<think>\n{think}\n</think>\n\n" + format_tool_calls([ToolCall("add", {"value": value})])


def test_pieces_and_ends(qwen_tok, r):
    dec = qwen_tok.decode
    assert dec(r.open_ids("assistant")) == "<|im_start|>assistant\n" == dec(r.generation_prompt_ids)
    assert dec(r.open_ids("tool")) == "<|im_start|>user\n<tool_response>\n"
    assert dec(r.close_ids("tool")) == "\n</tool_response><|im_end|>\n"
    assert dec(r.generation_end_ids("tool")) == "\n</tool_response><|im_end|>"
    assert dec(r.generation_end_ids("assistant")) == "<|im_end|>"
    content = r.content_ids('{"total": 3}')
    assert dec(r.after_generation_ids(content + r.generation_end_ids("tool"), "tool")) == "\n"
    # a rehearsal that stopped without writing "</tool_response>": nothing is inserted before its stop token
    assert dec(r.after_generation_ids(content + r.stop_token_ids, "tool")) == "\n"
    # cut by the length limit: the whole close; cut inside the close: the rest of it
    assert r.after_generation_ids(content, "tool") == r.close_ids("tool")
    cut = content + r.generation_end_ids("tool")[:-1]
    assert dec(r.after_generation_ids(cut, "tool")) == "<|im_end|>\n"
    # the same close text in other tokens is still recognised; a trailing newline alone is content
    retokenised = qwen_tok.encode('{"total": 3}\n</tool_response>', add_special_tokens=False)
    assert dec(r.after_generation_ids(retokenised, "tool")) == "<|im_end|>\n"
    newline = qwen_tok.encode('{"total": 3}\n', add_special_tokens=False)
    assert r.after_generation_ids(newline, "tool") == r.close_ids("tool")
    assert r.generated_content('{"total": 3}\n</tool_response>', "tool") == '{"total": 3}'
    assert r.generated_content('{"total": 3}</tool_response>', "tool") == '{"total": 3}'
    assert r.generated_content('{"total": 3}', "tool") == '{"total": 3}'


def _strip_history_think(text: str) -> str:
    """What Qwen3's template does to the assistant messages before the last user query: drop their think block."""
    last_query = text.rfind("<|im_start|>user\n", 0, len(text))
    while text[last_query:].startswith("<|im_start|>user\n<tool_response>"):
        last_query = text.rfind("<|im_start|>user\n", 0, last_query)
    head = re.sub(r"(<\|im_start\|>assistant\n)<think>\n.*?\n</think>\n\n", r"\1", text[:last_query], flags=re.S)
    return head + text[last_query:]


@pytest.mark.parametrize("mode", ["inline", "separate"])
def test_scripted_rollout_equals_the_whole_render(qwen_tok, r, mode):
    rehearser = ScriptedRehearser(qwen_tok, r, ['{"total": 3}', '{"total": 7}'], prompt_mode=mode)
    env = RehearseEnv(suite="scripted", rehearser=rehearser, prompt_mode=mode, max_steps_per_turn=3)
    env.reset(options={"task_id": "scripted_1"})
    for action in (
        _call(3),
        "<think>\nDone.\n</think>\n\nThe total is 3.",
        _call(4, "Add 4."),
        "<think>\nok\n</think>\n\nTotal 7.",
    ):
        obs, reward, terminated, truncated, _ = env.step(_act(r, action))
    assert terminated and reward == 1.0 and not truncated
    traj = env.trajectory
    tool_messages = [m.content for m in traj.messages if m.role == "tool"]
    assert tool_messages == ['{"total": 3}', '{"total": 7}']  # no template text in the tool output
    rollout = qwen_tok.decode(traj.token_ids)
    whole = r.render(traj.messages, env.task.tools_at_turn(1))
    assert rollout.count("</tool_response><|im_end|>\n") == 2 and "<|im_end|>\n</tool_response>" not in rollout
    assert _strip_history_think(rollout) == whole
    if mode == "inline":
        rehearse = [s for s in traj.segments if s.role == Role.REHEARSE]
        assert [qwen_tok.decode(s.token_ids) for s in rehearse] == [
            '{"total": 3}\n</tool_response><|im_end|>',
            '{"total": 7}\n</tool_response><|im_end|>',
        ]


def test_single_turn_rollout_ids_equal_the_whole_render(qwen_tok, r):
    """One user turn: the template keeps every think block, so text and ids both match the whole render."""
    env = RehearseEnv(
        suite="scripted", rehearser=ScriptedRehearser(qwen_tok, r, ['{"total": 2}']), max_steps_per_turn=3
    )
    env.reset(options={"task_id": "scripted_0"})
    env.step(_act(r, _call(2)))
    *_, terminated, _, _ = env.step(_act(r, "<think>\nfinished\n</think>\n\nThe total is 2."))
    assert terminated
    whole = r.render_ids(env.trajectory.messages, env.task.tools_at_turn(0))
    assert env.trajectory.token_ids == whole


@pytest.mark.parametrize("mode", ["inline", "separate"])
def test_recorded_logprobs_match_a_recompute(qwen_tok, r, mode):
    from agents.models import tiny_random_model

    torch.manual_seed(0)
    policy = Policy(tiny_random_model("qwen3", seed=1), qwen_tok)
    env = RehearseEnv(
        suite="scripted",
        rehearser=PolicyRehearser(policy, prompt_mode=mode),
        prompt_mode=mode,
        max_new_tokens=6,
        temperature=1.0,
        max_steps_per_turn=3,
        seed=0,
    )
    env.reset(options={"task_id": "scripted_0"})
    env.step(_act(r, _call(2)))  # a scripted call, so the model rehearses
    done = False
    while not done:
        (action,) = policy.act([env.trajectory.token_ids], max_new_tokens=6, temperature=1.0, seeds=[7])
        _, _, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
    if mode == "separate":  # where collect_rollouts puts the separate rehearsal rows
        env.trajectory.turn_info = [TurnInfo(turn=0, rehearsals=list(env.rehearsal_rows))]
    batch = build_batch([env.trajectory], group_ids_for(1, 1), prompt_mode=mode, pad_id=policy.pad_id)
    assert int((batch.role_mask[batch.loss_mask] == int(Role.REHEARSE)).sum()) > 0
    assert int((batch.role_mask[batch.loss_mask] == int(Role.ACT)).sum()) > 0
    with torch.no_grad():
        recomputed = token_logprobs(policy.model, batch.input_ids, batch.attention_mask)
    assert torch.allclose(recomputed[batch.loss_mask], batch.old_logprobs[batch.loss_mask], atol=1e-4)


def test_sft_targets_end_as_rollouts_do(qwen_tok, r):
    """A BFCL demonstration (real executions, relabelled) is token for token the inline rollout that writes the
    same ACT messages and rehearses the same tool outputs, and it renders like the whole conversation."""
    from agents.training.demonstrations import build_demonstrations

    (demo,), stats = build_demonstrations(qwen_tok, "bfcl", ["multi_turn_base"], "train", limit=1, max_tokens=None)
    assert stats.kept == 1
    act = [s for s in demo.segments if s.role == Role.ACT]
    rehearse = [s for s in demo.segments if s.role == Role.REHEARSE]
    assert rehearse and all(
        s.token_ids[-len(r.generation_end_ids("tool")) :] == r.generation_end_ids("tool") for s in rehearse
    )
    assert all(s.token_ids[-1] == r.stop_token_ids[0] for s in act)

    class Replay:
        tokenizer, prompt_mode = qwen_tok, "inline"

        def __init__(self):
            self.queue = [s.token_ids for s in rehearse]

        def rehearse(self, requests):
            out = []
            for _ in requests:
                ids = self.queue.pop(0)
                out.append(RehearseResponse(qwen_tok.decode(ids[:-1]), ids, [0.0] * len(ids)))
            return out

    env = RehearseEnv(
        suite="bfcl", categories=["multi_turn_base"], split="train", rehearser=Replay(), max_steps_per_turn=50
    )
    env.reset(options={"task_id": demo.task.id})
    for s in act:
        env.step(GeneratedText(s.text, s.token_ids, None))
    assert env.trajectory.token_ids == demo.token_ids
    assert env.trajectory.role_mask == demo.role_mask
    assert [m.content for m in env.trajectory.messages] == [m.content for m in demo.messages]
    whole = r.render(demo.messages, demo.task.tools_at_turn(0))
    # the template gives the final assistant message an empty think block; the model writes none
    last = whole.rfind("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    whole = whole[:last] + whole[last:].replace("<think>\n\n</think>\n\n", "", 1)
    assert qwen_tok.decode(demo.token_ids) == whole
    tool_outputs = [m.content for m in env.trajectory.messages if m.role == "tool"]
    assert tool_outputs and not any("</tool_response>" in t for t in tool_outputs)  # tool output, no template text
