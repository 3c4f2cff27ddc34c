"""TestTimeRehearsal on the tiny model: N attempts per turn in both modes, a bounded memory appended token in,
token out, rehearsals that never touch the real backend (scripted suite and BFCL), real committed steps."""

from __future__ import annotations

import re

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401
import tests.testing_env  # noqa: F401
from agents.policy import Policy, load_policy
from envace_gym.rendering import ChatRenderer
from envace_gym.types import GeneratedText, Message, Role
from wrappers import RealTools, TestTimeRehearsal
from wrappers.test_time_rehearsal import MEMORY_HEADER, trace_memory

TINY = dict(model="tiny-random", max_new_tokens=12, temperature=1.0)
SMALL = dict(memory_tokens=40, attempt_max_steps=2, max_new_tokens=8, critique_tokens=6, memory="summary")


class ScriptedPolicy(Policy):
    """The tiny model for critiques and summaries, but ACT messages chosen by `rule(context_text) -> str`,
    so attempts really make tool calls (a random model almost never does)."""

    def __init__(self, rule):
        base = load_policy("tiny-random")
        super().__init__(base.model, base.tokenizer)
        self.rule = rule
        self.act_calls = 0

        self.generated_from = []  # every context `generate` was asked to continue (critiques, summaries)

    def generate(self, contexts, **kw):
        self.generated_from += [list(c) for c in contexts]
        return super().generate(contexts, **kw)

    def act(self, contexts, *, max_new_tokens=256, temperature=1.0, seeds=None):
        self.act_calls += 1
        out = []
        for ctx in contexts:
            text = self.rule(self.tokenizer.decode(ctx))
            ids = self.renderer.content_ids(text) + [self.stop_ids[0]]
            out.append(GeneratedText(text, ids, None))
        return out


def always(text):
    return lambda _ctx: text


def make_env(suite="scripted", **kw):
    return RealTools(gym.make("EnvACE-Rehearse-v0", **{"suite": suite, "categories": None, **TINY, **kw}))


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_scripted_attempts_memory_and_untouched_backend(mode):
    policy = ScriptedPolicy(always('<tool_call>{"name": "add", "arguments": {"value": 3}}</tool_call>'))
    env = TestTimeRehearsal(make_env(), policy, n=2, mode=mode, seed=0, **SMALL)
    obs, info = env.reset(seed=0, options={"task_id": "scripted_1"})
    base = env.unwrapped
    fresh = base.suite.make_backend(base.task)
    rec = info["rehearsal"]
    assert rec["n"] == 2 and rec["mode"] == mode and rec["turn"] == 0
    assert len(rec["attempts"]) == 2 and len(rec["critiques"]) == 2
    for a in rec["attempts"]:
        assert a["steps"] == 2 and a["tool_calls"] == 2 and a["ended"] == "steps"
        tool_msgs = [m for m in a["messages"] if m["role"] == "tool"]
        assert len(tool_msgs) == 2 and a["rehearse_tokens"] > 0  # answered by REHEARSE
    starts = [a["start_tokens"] for a in rec["attempts"]]
    if mode == "parallel":
        assert starts[0] == starts[1] == rec["context_tokens_before"]
        assert policy.act_calls == 2  # the two attempts' ACT steps are batched: one call per step
    else:
        assert starts[1] > starts[0] == rec["context_tokens_before"]  # attempt 2 sees attempt 1 + critique
    # critic and summariser see the committed context: the system prompt with the tools, then the request
    system = policy.tokenizer.decode(base.trajectory.token_ids[:8])
    prompts = [policy.tokenizer.decode(c) for c in policy.generated_from]  # rehearsals, critiques, the summary
    critic_prompts = [p for p in prompts if "Rehearsal attempt" in p]
    assert len(critic_prompts) == 3 and all(p.startswith(system) and '"add"' in p for p in critic_prompts)
    # the rehearsals made 4 add(3) calls, none reached the real backend
    assert base.backend.snapshot() == fresh.snapshot()
    # bounded memory, appended before the pending ACT step as a user message
    assert 0 < rec["memory_tokens"] <= SMALL["memory_tokens"]
    memory_msg = base.trajectory.messages[-1]
    assert memory_msg.role == "user" and memory_msg.content == rec["memory"]
    assert rec["memory"].startswith(MEMORY_HEADER.format(n=2))
    segs = base.trajectory.segments
    assert [s.role for s in segs[-4:]] == [Role.TEMPLATE, Role.PROMPT, Role.TEMPLATE, Role.TEMPLATE]
    assert len(segs[-3].token_ids) == rec["memory_tokens"]
    assert segs[-1].token_ids == base.renderer.open_ids("assistant")
    assert (
        rec["context_tokens_after"]
        == len(base.trajectory.token_ids)
        == rec["context_tokens_before"] + sum(len(s.token_ids) for s in segs[-4:-1])
    )
    # token in, token out: the appended pieces decode to the same text as rendering the history whole
    renderer = ChatRenderer(policy.tokenizer)
    whole = renderer.render([Message(m.role, m.content) for m in base.trajectory.messages], base.task.tools, True)
    assert policy.tokenizer.decode(base.trajectory.token_ids) == whole
    # the committed step uses the real backend
    obs, reward, term, trunc, info = env.step(policy.act([base.trajectory.token_ids])[0])
    assert obs == '<tool_response>\n{"total": 3}\n</tool_response>'
    assert info["rehearsal"] is None  # same turn: no new rehearsal
    assert base.backend.snapshot() != fresh.snapshot()


def test_new_turn_rehearses_again_and_backend_holds_only_committed_calls():
    def rule(ctx):
        after_user = ctx.rsplit("<|im_start|>user", 1)[-1]
        return "done" if "<|im_start|>tool" in after_user else "[add(value=3)]"

    policy = ScriptedPolicy(rule)
    env = TestTimeRehearsal(make_env(), policy, n=1, seed=1, **SMALL)
    env.reset(seed=1, options={"task_id": "scripted_1"})
    base = env.unwrapped
    _, _, _, _, info = env.step("[add(value=3)]")  # committed call; the memory turn text has no tool block
    assert info["rehearsal"] is None
    _, _, term, _, info = env.step("done")  # ends turn 0 and opens turn 1
    assert not term and info["rehearsal"] is not None and info["rehearsal"]["turn"] == 1
    expected = base.suite.make_backend(base.task)
    from envace_gym.types import ToolCall

    expected.execute(ToolCall("add", {"value": 3}))
    assert base.backend.snapshot() == expected.snapshot()  # rehearsals of turn 1 changed nothing
    user_msgs = [m.content for m in base.trajectory.messages if m.role == "user"]
    assert sum(c.startswith("Rehearsal memory") for c in user_msgs) == 2  # one memory per user turn


def test_bfcl_rehearsals_leave_the_real_backend_byte_identical():
    policy = ScriptedPolicy(always("[list_all_airports()]"))
    env = TestTimeRehearsal(
        make_env(suite="bfcl", categories=["multi_turn_base"], split="all"),
        policy,
        n=2,
        mode="parallel",
        seed=0,
        **{**SMALL, "attempt_max_steps": 1},
    )
    obs, info = env.reset(seed=0, options={"task_id": "multi_turn_base_167"})
    base = env.unwrapped
    assert info["rehearsal"]["attempts"][0]["tool_calls"] == 1
    obs, *_ = env.step(policy.act([base.trajectory.token_ids])[0])
    real = base.suite.make_backend(base.task)
    from envace_gym.types import ToolCall

    assert obs == f"<tool_response>\n{real.execute(ToolCall('list_all_airports', {}))}\n</tool_response>"
    before = base.backend.snapshot()
    rec = env.rehearse()  # by hand, mid-turn: attempts call list_all_airports on rehearse copies only
    assert len(rec["attempts"]) == 2 and all(a["tool_calls"] == 1 for a in rec["attempts"])
    assert base.backend.snapshot() == before
    assert re.search(r"\[tool\]", TestTimeRehearsal._transcript(rec["attempts"][0]))


def test_bad_arguments_are_rejected_with_their_names():
    policy = load_policy("tiny-random")
    with pytest.raises(ValueError, match="n must be"):
        TestTimeRehearsal(make_env(), policy, n=-1)
    with pytest.raises(ValueError, match="mode"):
        TestTimeRehearsal(make_env(), policy, mode="both")
    with pytest.raises(ValueError, match="memory_tokens"):
        TestTimeRehearsal(make_env(), policy, memory_tokens=3)
    with pytest.raises(ValueError, match="memory must be"):
        TestTimeRehearsal(make_env(), policy, memory="english")
    from envace_gym.envs.text import TextToolUseEnv

    with pytest.raises(TypeError, match="token-level"):
        TestTimeRehearsal(TextToolUseEnv(suite="scripted"), policy)
    env = TestTimeRehearsal(make_env(), policy, n=0)
    _, info = env.reset(seed=0)
    assert info["rehearsal"] is None


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_trace_memory_is_built_from_the_attempts_without_generating(mode):
    policy = ScriptedPolicy(always('<tool_call>{"name": "add", "arguments": {"value": 3}}</tool_call>'))
    env = TestTimeRehearsal(make_env(max_steps_per_turn=3), policy, n=2, mode=mode, seed=0, memory_tokens=400)
    _, info = env.reset(seed=0, options={"task_id": "scripted_1"})
    rec = info["rehearsal"]
    assert rec["memory_kind"] == "trace" and rec["critiques"] == [] and rec["summary_tokens"] == 0
    # no critique, no summary: the model only rehearsed, once per call of the attempts (2 x 3)
    assert len(policy.generated_from) == 6
    assert not any("Rehearsal attempt" in policy.tokenizer.decode(c) for c in policy.generated_from)
    for a in rec["attempts"]:  # the whole turn is rehearsed: the env's per-turn limit, where it truncates
        assert a["steps"] == 3 and a["tool_calls"] == 3 and a["ended"] == "episode"
    lines = rec["memory"].splitlines()
    assert rec["memory"].startswith(MEMORY_HEADER.format(n=2).rstrip("\n"))
    outputs = {
        (k + 1, m["content"]) for k, a in enumerate(rec["attempts"]) for m in a["messages"] if m["role"] == "tool"
    }
    calls = [line for line in lines[1:] if "-> " in line]
    assert calls and all('{"name": "add", "arguments": {"value": 3}} -> ' in c for c in calls)
    assert len(calls) == len({" ".join(o.split())[:200] for _, o in outputs})  # one line per distinct output
    assert rec["memory_tokens"] == len(env.unwrapped.renderer.content_ids(rec["memory"])) <= 400
    if mode == "sequential":  # attempt 2 started from the trace of attempt 1
        assert rec["attempts"][1]["start_tokens"] > rec["attempts"][0]["start_tokens"]


@pytest.mark.parametrize("memory", ["trace", "outcomes"])
def test_an_outcomes_memory_is_the_trace_without_the_attempts_replies(memory):
    add = '<tool_call>{"name": "add", "arguments": {"value": 3}}</tool_call>'
    # a call, then (once the turn has a tool message) the reply "Done."
    policy = ScriptedPolicy(lambda ctx: "Done." if "<|im_start|>tool" in ctx.rsplit("<|im_start|>user", 1)[-1] else add)
    env = TestTimeRehearsal(make_env(), policy, n=2, seed=0, memory=memory, memory_tokens=400)
    _, info = env.reset(seed=0, options={"task_id": "scripted_1"})
    rec = info["rehearsal"]
    lines = rec["memory"].splitlines()[1:]
    assert rec["memory_kind"] == memory and any(" -> " in line for line in lines)
    assert all(a["steps"] == 2 for a in rec["attempts"])
    assert [line for line in lines if ": reply: " in line] == (["1,2: reply: Done."] if memory == "trace" else [])


def _attempt(*messages):
    return {"messages": [dict(m) for m in messages]}


def _call(name, **arguments):
    import json

    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}],
    }


def test_trace_memory_marks_agreement_errors_and_replies_and_keeps_its_bound():
    move = _call("move", item="apple", shelf="B")
    ok, full = (
        {"role": "tool", "content": '{"moved": "apple"}'},
        {"role": "tool", "content": '{"error": "shelf B is full"}'},
    )
    attempts = [
        _attempt(move, ok, {"role": "assistant", "content": "Done."}),
        _attempt(
            move, ok, {"role": "assistant", "content": "[move(item=)"}, {"role": "tool", "content": "Error: bad call"}
        ),
        _attempt(move, full, {"role": "assistant", "content": "Done."}),
    ]
    words = lambda text: len(text.split())  # noqa: E731
    memory = trace_memory(attempts, "Memory:\n", words, 1000)
    call = '{"name": "move", "arguments": {"item": "apple", "shelf": "B"}}'
    assert memory.splitlines() == [
        "Memory:",
        f'1,2: {call} -> {{"moved": "apple"}}',
        "2: [move(item=) -> Error: bad call [error]",
        f'3: {call} -> {{"error": "shelf B is full"}} [error]',
        "1,3: reply: Done.",
    ]
    outcomes = trace_memory(attempts, "Memory:\n", words, 1000, with_replies=False)  # memory="outcomes"
    assert outcomes.splitlines() == memory.splitlines()[:-1]
    short = trace_memory(attempts, "Memory:\n", words, 15)
    assert short.splitlines() == ["Memory:", f'1,2: {call} -> {{"moved": "apple"}}', "(+3 more lines)"]
    assert words(short) <= 15
    with pytest.raises(ValueError, match="header"):
        trace_memory(attempts, "a long memory header\n", words, 2)


ADD_3 = '<tool_call>{"name": "add", "arguments": {"value": 3}}</tool_call>'


def test_real_attempt_outputs_continue_the_committed_backend_without_touching_it():
    policy = ScriptedPolicy(always(ADD_3))
    env = TestTimeRehearsal(make_env(), policy, n=1, seed=0, attempt_max_steps=2, attempt_outputs="real")
    env.reset(seed=0, options={"task_id": "scripted_1"})
    base = env.unwrapped
    env.step(ADD_3)  # committed: the real total is 3
    before = base.backend.snapshot()
    rec = env.rehearse()  # by hand: the oracle's attempts start from the committed total, on a copy
    outputs = [m["content"] for m in rec["attempts"][0]["messages"] if m["role"] == "tool"]
    assert outputs == ['{"total": 6}', '{"total": 9}'] and rec["attempts"][0]["rehearse_tokens"] == 0
    assert '-> {"total": 6}' in rec["memory"] and base.backend.snapshot() == before


def test_null_attempt_outputs_say_nothing_about_the_calls():
    policy = ScriptedPolicy(always(ADD_3))
    env = TestTimeRehearsal(make_env(), policy, n=2, seed=0, attempt_max_steps=2, attempt_outputs="null")
    _, info = env.reset(seed=0, options={"task_id": "scripted_1"})
    rec = info["rehearsal"]
    assert [m["content"] for a in rec["attempts"] for m in a["messages"] if m["role"] == "tool"] == [""] * 4
    assert policy.generated_from == []  # nobody rehearsed: the constant answered
    assert rec["memory"].splitlines()[1].startswith('1,2: {"name": "add", "arguments": {"value": 3}} ->')


def test_a_provided_memory_replaces_the_attempts_and_keeps_its_bound():
    policy = ScriptedPolicy(always(ADD_3))
    seen = []

    def provider(base):
        seen.append(base.turn)
        return "\n".join(f"line {k}: " + "word " * 5 for k in range(50))

    env = TestTimeRehearsal(make_env(), policy, n=2, seed=0, memory_tokens=60, memory_provider=provider)
    _, info = env.reset(seed=0, options={"task_id": "scripted_1"})
    rec = info["rehearsal"]
    assert seen == [0] and rec["attempts"] == [] and rec["generated_tokens"] == 0 and policy.act_calls == 0
    assert rec["memory_kind"] == "provided" and rec["memory"].startswith(MEMORY_HEADER.format(n=2) + "line 0: ")
    assert rec["memory_tokens"] <= 60 and rec["memory"].endswith("word ")  # whole lines only
    count = len(env.unwrapped.renderer.content_ids(rec["memory"] + "\nline 99: " + "word " * 5))
    assert count > 60  # the next line would not have fit
    assert env.unwrapped.trajectory.messages[-1].content == rec["memory"]
    # a memory recorded with another N (its own header) is inserted under this wrapper's header only
    again = TestTimeRehearsal(
        make_env(), policy, n=2, seed=0, memory_provider=lambda _: MEMORY_HEADER.format(n=3) + "x"
    )
    _, info = again.reset(seed=0, options={"task_id": "scripted_1"})
    assert info["rehearsal"]["memory"] == MEMORY_HEADER.format(n=2) + "x"


def test_real_attempt_outputs_need_a_real_backend():
    policy = load_policy("tiny-random")
    rehearse_env = gym.make("EnvACE-Rehearse-v0", suite="scripted", categories=None, **TINY)
    with pytest.raises(ValueError, match="attempt_outputs='real'"):
        TestTimeRehearsal(rehearse_env, policy, attempt_outputs="real")
    with pytest.raises(ValueError, match="attempt_outputs must be"):
        TestTimeRehearsal(make_env(), policy, attempt_outputs="oracle")


def test_restate_request_puts_the_request_after_the_memory_and_outside_its_bound():
    policy = ScriptedPolicy(always(ADD_3))
    env = TestTimeRehearsal(make_env(), policy, n=2, seed=0, memory_tokens=60, restate_request=True)
    _, info = env.reset(seed=0, options={"task_id": "scripted_1"})
    messages = env.unwrapped.trajectory.messages
    request, memory, again = (m.content for m in messages if m.role == "user")
    assert memory == info["rehearsal"]["memory"] and again == request and messages[-1].role == "user"
    rec = info["rehearsal"]
    memory_ids = env.unwrapped.renderer.content_ids(memory)
    assert rec["memory_tokens"] == len(memory_ids) <= 60  # the bound is the memory's; the request is not counted
    restated = rec["context_tokens_after"] - rec["context_tokens_before"] - len(memory_ids)
    assert restated > len(env.unwrapped.renderer.content_ids(request))  # the request's tokens and its message frame
    # the token sequence ends with the restated request, then the assistant opener: the act reads it last
    renderer = env.unwrapped.renderer
    tail = renderer.content_ids(request) + list(renderer.close_ids("user")) + list(renderer.open_ids("assistant"))
    assert env.unwrapped.trajectory.token_ids[-len(tail) :] == tail
    provided = TestTimeRehearsal(
        make_env(), policy, n=2, seed=0, memory_provider=lambda _: "1: a line", restate_request=True
    )
    provided.reset(seed=0, options={"task_id": "scripted_1"})
    users = [m.content for m in provided.unwrapped.trajectory.messages if m.role == "user"]
    assert users[1].endswith("1: a line") and users[2] == users[0]


def test_restated_request_follows_the_notes_in_sequential_attempts_too():
    seen = []

    def rule(ctx):
        seen.append(ctx)
        return ADD_3

    policy = ScriptedPolicy(rule)
    env = TestTimeRehearsal(
        make_env(), policy, n=2, mode="sequential", seed=0, attempt_max_steps=1, restate_request=True
    )
    env.reset(seed=0, options={"task_id": "scripted_1"})
    request = next(m.content for m in env.unwrapped.trajectory.messages if m.role == "user")
    second = seen[1]  # the second attempt's first ACT context: the first attempt's notes, then the request
    assert second.rstrip().rfind(request) > second.find("Rehearsal memory") > 0
