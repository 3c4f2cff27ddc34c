"""Every bad command-line or YAML input fails fast: before any model loads, exit code 2, one line on stderr
that names the field (no traceback); values YAML reads as strings are coerced by the field's type."""

from __future__ import annotations

import pytest

import tests.testing_env  # noqa: F401  (registers the scripted suites)
from agents.cli import main
from agents.config import TrainConfig, load_config

TRAIN = [
    "train",
    "--model",
    "tiny-random",
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
BAD_TRAIN = [
    (["--temperature", "nan"], "temperature"),
    (["--optim.max-grad-norm", "-1"], "optim.max_grad_norm"),
    (["--optim.warmup-steps", "-3"], "optim.warmup_steps"),
    (["--batch-tasks", "100000"], "batch-tasks"),
    (["--run.threads", "-1"], "run.threads"),
    (["--run.device", "gpu"], "run.device"),
    (["--optim.lr", "nan"], "optim.lr"),
    (["--optim.weight-decay", "-1"], "optim.weight_decay"),
    (["--optim.adam-beta1", "2.0"], "optim.adam_beta1"),
    (["--memory.logprob-chunk-size", "0"], "memory.logprob_chunk_size"),
    (["--suite", "bfcl", "--categories", "foo"], "unknown BFCL category 'foo'"),
    (["--task-ids", "bogus_1"], "task_ids"),
    (["--suite", "nosuch"], "unknown suite 'nosuch'"),
    (["--max-episode-tokens", "0"], "max_episode_tokens"),
    (["--generated-token-budget", "1000", "--optim.lr-schedule", "cosine"], "generated_token_budget needs"),
    (["--rehearsal-restate-request"], "rehearsal_restate_request repeats the request"),
]
BAD_YAML = [
    ("num_steps: 2.5", "num_steps must be an integer"),
    ("optim: {adam_beta2: -1}", "optim.adam_beta2"),
    ("optim: {learning_rate: 1}", "unknown OptimConfig field(s) ['learning_rate']"),
    ("run: 3", "run must be a RunConfig or a mapping of its fields"),
    ("clip_eps_high: .inf", "clip_eps_high must be a finite number"),
    ("seed: -5", "seed"),
    ("model: ''", "model must name a model"),
    ("group_size: four", "group_size must be an integer"),
    ("tensorboard: maybe", "tensorboard must be true or false"),
    # YAML keeps the last of two equal keys silently: a recipe copied with a field left in twice must not run
    ("seed: 1\nnum_steps: 2\nseed: 3", "'seed' is given twice in one mapping (line 1 and line 3); keep one (line 3, "),
    ("optim: {lr: 0.1, lr: 0.2}", "'lr' is given twice in one mapping"),
    ("num_steps: [2", "c.yaml: expected ',' or ']', but got '<stream end>' (line 2, column 1)"),
    ("? [1, 2]\n: 3", "found unhashable key"),
]


@pytest.mark.parametrize("extra, field", BAD_TRAIN, ids=[" ".join(a) for a, _ in BAD_TRAIN])
def test_bad_train_options_fail_fast_naming_the_field(tmp_path, no_model_loads, capsys, extra, field):
    assert main([*TRAIN, "--run-dir", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("envace train: error: ") and field in err and "Traceback" not in err, err


@pytest.mark.parametrize("line, message", BAD_YAML, ids=[y for y, _ in BAD_YAML])
def test_bad_yaml_values_fail_fast_naming_the_field(tmp_path, no_model_loads, capsys, line, message):
    path = tmp_path / "c.yaml"
    path.write_text(line + "\n")
    assert main(["train", "--run-dir", str(tmp_path / "run"), "--config", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_a_bad_yaml_file_is_one_line_naming_the_file(tmp_path, no_model_loads, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 1\nseed: 2\n")
    assert main(["train", "--run-dir", str(tmp_path / "run"), "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"envace train: error: {path}: 'seed' is given twice") and err.count("\n") == 1, err


def test_yaml_merge_keys_still_load_and_a_merged_key_may_be_overridden(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("base: &base {lr: 0.1, weight_decay: 0.5}\noptim:\n  <<: *base\n  lr: 0.2\n")
    from agents.config import _read_yaml

    assert _read_yaml(path)["optim"] == {"lr": 0.2, "weight_decay": 0.5}


def test_yaml_strings_are_coerced_by_the_field_type(tmp_path):
    """PyYAML reads 1e-5 as a string and quoted booleans stay strings: each field's type decides."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "optim: {lr: 1e-5}\ngroup_size: '4'\ntensorboard: 'false'\nrun: {resume: 'no'}\nmax_episode_tokens: null\n"
    )
    config = load_config(path)
    assert (config.optim.lr, config.group_size, config.tensorboard, config.run.resume) == (1e-5, 4, False, False)
    assert config.max_episode_tokens is None and isinstance(TrainConfig(optim={"lr": 1}).optim.lr, float)


@pytest.mark.parametrize(
    "extra, field",
    [
        (["--temperature", "-1"], "temperature"),
        (["--max-new-tokens", "0"], "max_new_tokens"),
        (["--max-steps-per-turn", "0"], "max_steps_per_turn"),
        (["--categories", "foo"], "unknown BFCL category 'foo'"),
    ],
)
def test_bad_eval_options_fail_fast(tmp_path, no_model_loads, capsys, extra, field):
    assert main(["eval", "--model", "tiny-random", "--limit", "1", "--out", str(tmp_path / "ev"), *extra]) == 2
    assert field in capsys.readouterr().err


def test_eval_out_pointing_at_a_file_fails_fast(tmp_path, no_model_loads, capsys):
    (tmp_path / "f").write_text("x")
    assert main(["eval", "--model", "tiny-random", "--limit", "1", "--out", str(tmp_path / "f")]) == 2
    assert "is a file" in capsys.readouterr().err


def test_bad_sft_inputs_fail_fast(tmp_path, no_model_loads, capsys):
    sft = ["sft", "--model", "tiny-random", "--run-dir", str(tmp_path / "s")]
    assert main([*sft, "--data", str(tmp_path / "missing.jsonl")]) == 2
    assert "no JSONL file" in capsys.readouterr().err
    assert main([*sft, "--categories", "foo"]) == 2
    assert "unknown BFCL category 'foo'" in capsys.readouterr().err
    assert main([*sft, "--optim.lr", "nan"]) == 2
    assert "optim.lr must be a finite number" in capsys.readouterr().err
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text('{"task_id": "x"}\nnot json at all\n{"task_id": "y"}\n')
    assert main([*sft, "--data", str(corrupt)]) == 2
    assert "corrupt.jsonl:2: not a JSON record" in capsys.readouterr().err


def test_a_refused_train_leaves_no_run_folder(tmp_path, no_model_loads, capsys):
    run = tmp_path / "never"
    assert main([*TRAIN, "--run-dir", str(run), "--max-new-tokens", "4", "--min-solvable-fraction", "0.9"]) == 2
    err = capsys.readouterr().err
    assert not run.exists() and err.count("envace train") == 1, err


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["train", "--lr", "1e-3"], "--lr: did you mean --optim.lr?"),
        (["train", "--save-every=3"], "--save-every: did you mean --run.save-every?"),
        (["sft", "--gradient-checkpointing", "true"], "did you mean --memory.gradient-checkpointing?"),
        (["pipeline", "--grpo.lr", "1e-3"], "--grpo.lr: did you mean --grpo.optim.lr?"),
    ],
)
def test_a_top_level_spelling_of_a_grouped_option_names_the_grouped_one(capsys, argv, hint):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "unrecognized arguments" in err and hint in err, err


def test_an_unknown_option_with_no_grouped_twin_gets_no_hint(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--no-such-option", "1"])
    assert "did you mean" not in capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "sft"])
def test_a_top_level_yaml_field_of_a_group_names_the_group(tmp_path, no_model_loads, capsys, command):
    path = tmp_path / "c.yaml"
    path.write_text("lr: 0.1\nthreads: 1\n")
    assert main([command, "--config", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "(lr is optim.lr; threads is run.threads)" in err, err


@pytest.mark.parametrize("argv", [["serve", "--lr", "1"], ["eval", "--lr", "1"]])
def test_a_hint_names_only_an_option_of_the_chosen_command(capsys, argv):
    with pytest.raises(SystemExit):
        main(argv)
    err = capsys.readouterr().err
    assert "unrecognized arguments: --lr 1" in err and "did you mean" not in err, err
