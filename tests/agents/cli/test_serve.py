"""``envace serve``: a real server process on 127.0.0.1 (a free port, printed at start) answers the official ``openai``
client with OpenAI's schema (usage counts, finish reasons, greedy at temperature 0), refuses what it does not
support with OpenAI's error body, and stops on Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from agents.cli import main

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def server():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agents.cli",
            "serve",
            "--model",
            "tiny-random",
            "--port",
            "0",
            "--max-tokens-limit",
            "64",
            "--default-max-tokens",
            "8",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # the model loads first, then the bound address is printed
        match = re.search(r"at (http://127\.0\.0\.1:\d+/v1)", line)
        if not match:
            proc.kill()
            raise AssertionError(f"no address in {line!r}; stderr: {proc.communicate(timeout=30)[1]}")
        yield proc, match.group(1)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_the_server_answers_the_openai_client(server):
    _, url = server
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny-random"]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Is the lamp on shelf B?"}]
    first = client.chat.completions.create(model="tiny-random", messages=messages, max_tokens=5, temperature=0)
    again = client.chat.completions.create(model="tiny-random", messages=messages, max_tokens=5, temperature=0)
    (choice,) = first.choices
    assert choice.message.role == "assistant" and choice.finish_reason == "length"  # the random model never stops
    assert first.usage.completion_tokens == 5 and first.usage.prompt_tokens > 10
    assert first.usage.total_tokens == first.usage.prompt_tokens + 5
    assert choice.message.content == again.choices[0].message.content  # greedy: the same text
    parts = [{"role": "user", "content": [{"type": "text", "text": "Is the lamp "}, {"type": "text", "text": "on B?"}]}]
    short = client.chat.completions.create(model="tiny-random", messages=parts, max_completion_tokens=2, temperature=0)
    assert short.usage.completion_tokens == 2


@pytest.mark.parametrize(
    ("extra", "error", "param"),
    [
        ({"model": "gpt-4o"}, openai.NotFoundError, "model"),
        ({"stream": True}, openai.BadRequestError, "stream"),
        ({"n": 2}, openai.BadRequestError, "n"),
        ({"max_tokens": 65}, openai.BadRequestError, "max_tokens"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, openai.BadRequestError, "messages.0.role"),
        ({"messages": []}, openai.BadRequestError, "messages"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, openai.BadRequestError, "tools"),
    ],
)
def test_unsupported_requests_get_openai_errors(server, extra, error, param):
    _, url = server
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
    request = {"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}
    with pytest.raises(error) as err:
        client.chat.completions.create(**request)
    assert err.value.body["param"] == param and err.value.body["type"] == "invalid_request_error"


def test_a_body_that_is_not_json_is_a_400(server):
    _, url = server
    req = urllib.request.Request(f"{url}/chat/completions", data=b"{oops", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 400 and "not JSON" in json.loads(err.value.read())["error"]["message"]


def test_ctrl_c_stops_the_server(server):
    proc, url = server
    with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=10) as r:
        assert json.loads(r.read()) == {"status": "ok"}
    proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.returncode == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "70000"], "--port"),
        (["--default-max-tokens", "0"], "--default-max-tokens"),
        (["--default-max-tokens", "100", "--max-tokens-limit", "50"], "--max-tokens-limit"),
    ],
)
def test_bad_options_fail_before_the_model_loads(no_model_loads, capsys, argv, message):
    assert main(["serve", "--model", "tiny-random", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("envace serve: error:") and message in err
