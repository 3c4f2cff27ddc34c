"""`agents.judges`: `LocalJudge` and `OpenAIJudge` score checklists with real tiny models, the second through a real
``envace serve`` app on 127.0.0.1; unparseable verdicts are scored as configured and counted; the cache answers a
repeated prompt; a dead or slow endpoint is a `JudgeError` after the client's retries, and a failing one is retried.

The judges are tiny Llamas whose weights answer one fixed text (`tests.judge_models`) and the untrained
``tiny-random`` (whose replies are unparseable)."""

from __future__ import annotations

import socket
import threading

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from agents.judges import LocalJudge, OpenAIJudge
from agents.policy import Policy
from agents.serving import ChatServer, make_chat_app
from envace_gym.judging import Checklist, ChecklistItem, JudgeError, score_with_judge
from envace_gym.types import Message, Task, ToolCall, Trajectory
from tests.judge_models import fixed_reply_policy


@pytest.fixture(scope="module")
def tokenizer(smol_tokenizer):
    return smol_tokenizer  # tiny-random speaks SmolLM2's tokenizer


@pytest.fixture(scope="module")
def yes_policy(tokenizer):
    return fixed_reply_policy(tokenizer, '{"answer": true}')


@pytest.fixture(scope="module")
def no_policy(tokenizer):
    return fixed_reply_policy(tokenizer, "No.")


@pytest.fixture(scope="module")
def random_policy(tokenizer, tiny_model):
    return Policy(tiny_model, tokenizer, kv_cache=False)


def trajectory() -> Trajectory:
    task = Task("t", "lab", [[Message("user", "move the lamp")], [Message("user", "ship it")]], [], "lab")
    call = ToolCall("move", {"item": "lamp", "shelf": "B"}, id="c1")
    return Trajectory(
        task=task,
        messages=[
            Message("user", "move the lamp"),
            Message("assistant", "", tool_calls=[call]),
            Message("tool", '{"ok": true}', tool_call_id="c1", name="move"),
            Message("assistant", "Done."),
            Message("user", "ship it"),
            Message("assistant", "Shipped."),
        ],
    )


CHECKLIST = Checklist(
    "t",
    [
        [ChecklistItem("moved the lamp", 3.0), ChecklistItem("no error", 1.0)],
        [ChecklistItem("shipped the lamp")],
        [ChecklistItem("a third turn that never came", 5.0)],
    ],
)


def test_a_judge_that_says_yes_scores_every_reached_turn(yes_policy):
    judge = LocalJudge(policy=yes_policy, max_new_tokens=16)
    reward, info = score_with_judge(trajectory(), CHECKLIST, judge)
    # turns 1 and 2 fully met, turn 3 never reached (0 without asking): (1 + 1 + 0) / 3
    assert reward == pytest.approx(2 / 3)
    assert [t["reached"] for t in info["turns"]] == [True, True, False]
    assert [t["score"] for t in info["turns"]] == [1.0, 1.0, 0.0]
    assert info["judged"] == 3 and info["unparseable"] == 0
    assert judge.stats.verdicts == 3 and judge.stats.generated == 3


def test_the_weighted_fraction_of_a_turn(no_policy):
    checklist = Checklist("t", [[ChecklistItem("moved the lamp", 3.0), ChecklistItem("no error", 1.0)]])
    reward, info = score_with_judge(trajectory(), checklist, LocalJudge(policy=no_policy, max_new_tokens=8))
    assert reward == 0.0 and [r["verdict"] for r in info["turns"][0]["items"]] == [False, False]


def test_unparseable_verdicts_score_as_configured_and_are_counted(random_policy):
    judge = LocalJudge(policy=random_policy, max_new_tokens=6)
    checklist = Checklist("t", CHECKLIST.turns[:2])
    reward, info = score_with_judge(trajectory(), checklist, judge, unparseable_score=0.25)
    assert reward == pytest.approx(0.25)
    assert info["unparseable"] == 3 and judge.stats.unparseable == 3 and judge.stats.verdicts == 0
    reward, _ = score_with_judge(trajectory(), checklist, judge)  # the default: 0
    assert reward == 0.0
    assert judge.stats.cache_hits == 3 and judge.stats.generated == 3  # the same prompts: answered from the cache
    with pytest.raises(ValueError, match="unparseable_score"):
        score_with_judge(trajectory(), checklist, judge, unparseable_score=2.0)
    with pytest.raises(ValueError, match="checklist of task 'other'"):
        score_with_judge(trajectory(), Checklist("other", checklist.turns), judge)


def test_a_served_judge_gives_the_local_judges_verdicts(yes_policy, random_policy):
    local = LocalJudge(policy=yes_policy, max_new_tokens=16)
    local_random = LocalJudge(policy=random_policy, max_new_tokens=6)
    with (
        ChatServer(make_chat_app(yes_policy, "yes")) as yes_server,
        ChatServer(make_chat_app(random_policy, "rnd")) as rnd,
    ):
        served = OpenAIJudge("yes", yes_server.base_url, max_tokens=16, concurrency=2)
        assert score_with_judge(trajectory(), CHECKLIST, served) == score_with_judge(trajectory(), CHECKLIST, local)
        served_random = OpenAIJudge("rnd", rnd.base_url, max_tokens=6)
        prompts = [[Message("user", f"question {i}")] for i in range(3)]
        assert served_random.complete(prompts) == local_random.complete(prompts)  # greedy: the same text
        assert served.stats.generated == 3 and served_random.stats.generated == 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_endpoint_is_a_judge_error():
    judge = OpenAIJudge("m", f"http://127.0.0.1:{free_port()}/v1", max_retries=1, timeout=2.0)
    with pytest.raises(JudgeError, match="APIConnectionError"):
        judge.complete([[Message("user", "hi")]])
    assert judge.stats.generated == 0


def test_a_slow_endpoint_times_out_as_a_judge_error(random_policy):
    with ChatServer(make_chat_app(random_policy, "rnd", max_tokens_limit=4096)) as server:
        judge = OpenAIJudge("rnd", server.base_url, timeout=0.05, max_retries=0, max_tokens=400)
        with pytest.raises(JudgeError, match="APITimeoutError"):
            judge.complete([[Message("user", "write a long story")]])


def test_a_failing_endpoint_is_retried(yes_policy):
    """A real server that answers 503 to its first chat request (an overloaded endpoint), then serves the model."""
    seen = {"chat": 0}
    lock = threading.Lock()
    inner = make_chat_app(yes_policy, "yes")

    async def flaky(scope, receive, send):
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            with lock:
                seen["chat"] += 1
                first = seen["chat"] == 1
            if first:
                await JSONResponse({"error": {"message": "overloaded"}}, status_code=503)(scope, receive, send)
                return
        await inner(scope, receive, send)

    app = Starlette(routes=[Route("/", lambda r: JSONResponse({})), Mount("", app=flaky)])
    with ChatServer(app) as server:
        judge = OpenAIJudge("yes", server.base_url, max_retries=2, timeout=10.0, max_tokens=16)
        assert judge.complete([[Message("user", "is it done?")]]) == ['{"answer": true}']
        assert seen["chat"] == 2
        no_retry = OpenAIJudge("yes", server.base_url, max_retries=0, max_tokens=16)
        seen["chat"] = 0
        with pytest.raises(JudgeError, match="InternalServerError"):
            no_retry.complete([[Message("user", "is it done now?")]])


def test_bad_judge_settings_are_refused(yes_policy):
    with pytest.raises(ValueError, match="max_new_tokens"):
        LocalJudge(policy=yes_policy, max_new_tokens=0)
    with pytest.raises(ValueError, match="timeout"):
        OpenAIJudge("m", "http://127.0.0.1:1/v1", timeout=0)
    with pytest.raises(ValueError, match="cache_size"):
        LocalJudge(policy=yes_policy, cache_size=-1)


def test_a_reply_prefix_is_continued_and_kept(smol_tokenizer):
    policy = fixed_reply_policy(smol_tokenizer, " true}", after='{"answer":')
    judge = LocalJudge(policy=policy, max_new_tokens=4, reply_prefix='{"answer":')
    assert judge.complete([[Message("user", "Did it ship?")]]) == ['{"answer": true}']
    reward, info = score_with_judge(trajectory(), Checklist("t", [[ChecklistItem("moved the lamp")]]), judge)
    assert reward == 1.0 and info["turns"][0]["items"][0]["reply"] == '{"answer": true}'
    # without the prefix the same model is not steered into its answer: nothing readable
    assert LocalJudge(policy=policy, max_new_tokens=4).complete([[Message("user", "Did it ship?")]]) != [
        '{"answer": true}'
    ]
