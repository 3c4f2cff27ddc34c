"""Crash-safe run folders: corrupt checkpoints are skipped, metrics are trimmed on resume, one writer at a
time, no silent config change on resume, safe unpickling, cut JSONL lines, and picklable envs."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401
import tests.testing_env  # noqa: F401
from agents.cli import main
from agents.config import TrainConfig
from agents.training.checkpoint import CheckpointError, load_checkpoint
from agents.training.run_folder import RunFolderError, read_jsonl
from agents.training.trainer import RoleWiseGRPOTrainer

FAST = dict(
    model="tiny-random",
    suite="scripted-length",
    categories=[],
    batch_tasks=2,
    group_size=2,
    max_new_tokens=6,
    rehearse_max_new_tokens=6,
    max_steps_per_turn=2,
    min_solvable_fraction=0.0,
    optim={"lr": 1e-3},
    tensorboard=False,
    beta=0.05,  # a KL term, so every step updates (the tests need weights that move)
)


def _trainer(folder, **kw):
    return RoleWiseGRPOTrainer(TrainConfig(run_dir=str(folder), **{**FAST, **kw}), log=LOG.append)


LOG: list[str] = []


def _steps(run):
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("victim", ["model/model.safetensors", "optimizer.pt"])
def test_resume_skips_a_corrupt_newest_checkpoint(tmp_path, victim):
    t = _trainer(tmp_path, num_steps=2, run={"save_every": 1})
    t.train(progress=False)
    t.close()
    path = tmp_path / "checkpoints" / "step_000002" / victim
    path.write_bytes(path.read_bytes()[:100])  # truncated, as a full disk or a kill mid-copy leaves it
    LOG.clear()
    resumed = _trainer(tmp_path, num_steps=2, run={"save_every": 1})
    assert resumed.step == 1
    assert any("skipped step_000002" in line and victim.split("/")[-1] in line for line in LOG)
    assert _steps(tmp_path) == [1]  # the step after the good checkpoint is redone, not kept twice


def test_metrics_are_trimmed_to_the_resumed_step(tmp_path):
    t = _trainer(tmp_path, num_steps=2)
    t.train(progress=False)
    t.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:  # a step logged by a run killed before its checkpoint
        f.write(json.dumps({"step": 3}) + "\n" + '{"step": 4, "rollout/rew')
    resumed = _trainer(tmp_path, num_steps=3)
    assert _steps(tmp_path) == [1, 2]
    resumed.train(progress=False)
    assert _steps(tmp_path) == [1, 2, 3]


def test_a_second_writer_is_refused_and_a_stale_lock_taken_over(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; from agents.training.run_folder import RunLock; "
                "lock = RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)"
            ),
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderError, match="another process"):
            _trainer(tmp_path, num_steps=1)
    finally:
        holder.kill()
        holder.wait()
    # the holder was killed: its lock is stale, so the next trainer takes the folder
    t = _trainer(tmp_path, num_steps=1)
    assert (tmp_path / ".lock").is_file()
    t.close()
    assert not (tmp_path / ".lock").exists()


def test_resuming_with_changed_settings_refuses_unless_allowed(tmp_path):
    t = _trainer(tmp_path, num_steps=1)
    t.train(progress=False)
    t.close()
    with pytest.raises(RunFolderError, match=r"optim.lr: 0\.001 -> 0\.002.*--run.allow-config-change"):
        _trainer(tmp_path, num_steps=2, optim={"lr": 2e-3})
    resumed = _trainer(tmp_path, num_steps=2, optim={"lr": 2e-3}, run={"allow_config_change": True, "save_every": 5})
    assert resumed.step == 1 and resumed.optimizers["model"].param_groups[0]["lr"] == pytest.approx(2e-3)
    resumed.close()
    _trainer(tmp_path, num_steps=5, run={"save_every": 5}).close()  # num_steps, run.save_every may change freely


def test_a_tampered_checkpoint_cannot_run_code(tmp_path):
    t = _trainer(tmp_path, num_steps=1)
    t.train(progress=False)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    folder = tmp_path / "checkpoints" / "step_000001"
    with open(folder / "rng.pt", "wb") as f:
        pickle.dump({"python": Evil()}, f)
    with pytest.raises(CheckpointError, match="rng.pt"):
        load_checkpoint(folder, t.models, t.optimizers, t.schedulers)
    assert not marker.exists()


def test_a_cut_last_jsonl_line_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": 3, "b"')
    with pytest.warns(UserWarning, match="cut last line"):
        assert [r["a"] for r in read_jsonl(path)] == [1, 2]
    path.write_text('{"a": 1}\nnot json\n{"a": 3}\n')
    with pytest.raises(ValueError, match=":2: not a JSON record"):
        list(read_jsonl(path))


@pytest.mark.parametrize("command", ["train", "sft"])
def test_help_text_keeps_the_percent(capsys, command):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0 and "30% slower" in capsys.readouterr().out


def test_tool_env_pickles_mid_episode():
    env = gym.make("EnvACE-Tool-v0", suite="scripted")
    env.reset(seed=0, options={"task_id": "scripted_1"})
    env.step("[add(value=3)]")
    copy = pickle.loads(pickle.dumps(env))
    assert copy.step("[add(value=4)]")[0] == env.step("[add(value=4)]")[0]


def test_lone_surrogates_and_huge_actions_never_raise():
    tool = gym.make("EnvACE-Tool-v0", suite="scripted")
    rehearse = gym.make("EnvACE-Rehearse-v0", suite="scripted", model="tiny-random", max_new_tokens=4)
    for env in (tool, rehearse):
        env.reset(seed=0, options={"task_id": "scripted_2"})
        for action in (
            "\ud800",
            "x\udfff[add(value=1)]",
            "y" * 1_000_000,
            '<tool_call>{"name": "echo\ud800"}</tool_call>',
        ):
            obs, reward, terminated, truncated, info = env.step(action)
            assert "\ud800" not in obs and "\udfff" not in obs
            if terminated or truncated:
                env.reset(seed=0, options={"task_id": "scripted_2"})
        messages = env.unwrapped.trajectory.messages
        for m in messages:
            m.content.encode("utf-8")  # raises on a lone surrogate


def test_a_truncated_init_model_names_its_folder(tmp_path, capsys):
    t = _trainer(tmp_path / "a", num_steps=1)
    t.train(progress=False)
    t.close()
    model_dir = tmp_path / "a" / "checkpoints" / "step_000001" / "model"
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:50])
    args = [
        "train",
        "--run-dir",
        str(tmp_path / "b"),
        "--init",
        str(model_dir),
        "--suite",
        "scripted",
        "--categories",
        "--batch-tasks",
        "2",
        "--group-size",
        "2",
        "--min-solvable-fraction",
        "0",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"cannot load the model in {model_dir}" in err and "Traceback" not in err
