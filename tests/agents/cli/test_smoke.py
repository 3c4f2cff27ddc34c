"""`envace smoke`: one ACT turn of a model on a real BFCL task, through the registered EnvACE-Rehearse-v0."""

from __future__ import annotations

from agents.cli import main


def test_envace_smoke_renders_a_real_task_generates_one_turn_and_steps_the_env(capsys):
    task = "multi_turn_base_0"
    args = ["smoke", "--model", "tiny-random", "--task-id", task, "--max-new-tokens", "8", "--temperature", "0"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"[smoke] task {task} (" in out and "rendered prompt" in out and "generated ACT turn" in out
    # an untrained model emits no parseable call: the env answers its turn and the counts name both roles
    assert "reward=" in out and "[smoke] tokens per role: " in out
    (ok,) = [line for line in out.splitlines() if line.startswith("[smoke] ok: ")]
    act = int(ok.rsplit("ACT tokens ", 1)[1])
    assert 1 <= act <= 8
