"""`envace pipeline` (the README's main job) end to end on the tiny model with tiny budgets, and resume."""

from __future__ import annotations

import dataclasses
import json

import pytest

from agents.cli import build_parser, main
from agents.config import dataclass_from_args, load_dataclass
from agents.pipeline import (
    REHEARSAL_STAGE,
    SAME_TASKS_ROW,
    PipelineConfig,
    run_pipeline,
    same_tasks_row,
    stage_rows,
    stage_table,
)

ARGS = [
    "--model",
    "tiny-random",
    "--sft.max-steps",
    "1",
    "--sft.max-demos",
    "1",
    "--grpo.num-steps",
    "1",
    "--eval.limit",
    "1",
    "--grpo.max-new-tokens",
    "4",
    "--eval.max-new-tokens",
    "4",
    "--grpo.rehearse-max-new-tokens",
    "4",
    "--grpo.max-steps-per-turn",
    "2",
    "--eval.max-steps-per-turn",
    "2",
    "--min-solvable-fraction",
    "0",
]


@pytest.mark.slow
def test_pipeline_runs_every_stage_then_resumes_without_redoing_them(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["pipeline", "--run-dir", str(run), *ARGS]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["evals"]) == {"eval_base", "eval_sft", "eval_grpo"}
    # the recipe without the stage fields the pipeline sets (placeholders there); the stages' own configs have them
    assert "model" not in summary["config"]["sft"] and "threads" not in summary["config"]["grpo"]["run"]
    assert summary["stage_configs"]["sft"]["model"] == summary["config"]["model"]
    for stage in ("eval_base", "sft", "eval_sft", "grpo", "eval_grpo"):
        assert (run / stage / "stage_done.json").is_file()
    assert (run / "sft" / "checkpoints").is_dir() and (run / "grpo" / "metrics.jsonl").is_file()
    assert (run / "plots" / "stages.png").stat().st_size > 1000
    assert (run / "eval_grpo" / "summary.csv").is_file()
    out = capsys.readouterr().out
    assert "eval_grpo" in out and "stages took" in out
    assert main(["pipeline", "--run-dir", str(run), *ARGS]) == 0
    again = capsys.readouterr().out
    assert out.count("already done") == 0 and again.count("already done") == 5
    # a resumed run prints each evaluation's numbers as the run that made them did
    evals = [line for line in out.splitlines() if line.startswith("[pipeline] eval_")]
    assert len(evals) == 3 and all(line in again.splitlines() for line in evals), (evals, again)
    # another budget on the same folder refuses, naming the field, instead of reporting the old run as its own
    for stage, option in (("sft", "--sft.optim.lr"), ("grpo", "--grpo.optim.lr")):
        assert main(["pipeline", "--run-dir", str(run), *ARGS, option, "0.5"]) == 2
        err = capsys.readouterr().err
        assert f"{run / stage} was run with other settings (optim.lr)" in err, err
    # what may change on resume (a group's name in RESUME_IGNORES covers its fields) does not refuse
    assert main(["pipeline", "--run-dir", str(run), *ARGS, "--grpo.run.keep-checkpoints", "5"]) == 0
    assert capsys.readouterr().out.count("already done") == 5
    # a moved run folder is still the same run: every stage is skipped
    moved = tmp_path / "moved"
    run.rename(moved)
    assert main(["pipeline", "--run-dir", str(moved), *ARGS]) == 0
    assert capsys.readouterr().out.count("already done") == 5


def test_bad_pipeline_config_fails_fast():
    with pytest.raises(ValueError, match="group_size K=1"):
        PipelineConfig(grpo={"group_size": 1})
    with pytest.raises(ValueError, match="the pipeline sets grpo.seed itself; set --seed"):
        PipelineConfig(grpo={"seed": 3})
    with pytest.raises(ValueError, match="the pipeline sets sft.task_ids itself; leave it out"):
        PipelineConfig(sft={"task_ids": ["x"]})
    with pytest.raises(ValueError, match="unknown PipelineConfig field"):
        load_dataclass(PipelineConfig, None, sft_steps=3)
    # a field of a stage's shared group that the pipeline sets, named as typed, with the pipeline option to use
    with pytest.raises(ValueError, match=r"the pipeline sets grpo.run.threads itself; set --threads for every stage"):
        dataclass_from_args(PipelineConfig, build_parser().parse_args(["pipeline", "--grpo.run.threads", "3"]))
    with pytest.raises(ValueError, match="the pipeline sets sft.model itself; set --model for every stage"):
        PipelineConfig(sft={"model": "tiny-random"})
    with pytest.raises(ValueError, match="the pipeline sets sft.data itself; set --suite for every stage"):
        PipelineConfig(sft={"data": ["lab"]})
    with pytest.raises(ValueError, match="the pipeline sets grpo.run_dir itself; each stage writes to its own folder"):
        PipelineConfig(grpo={"run_dir": "elsewhere"})
    assert PipelineConfig(grpo={"run": {"save_every": 1, "device": "cpu"}}).grpo.run.threads == 0  # not set: fine
    with pytest.raises(ValueError, match="the pipeline sets eval.out itself"):
        PipelineConfig(eval={"out": "elsewhere"})
    with pytest.raises(ValueError, match="sets eval.fidelity itself; set --fidelity true"):
        PipelineConfig(eval={"fidelity": True})
    with pytest.raises(ValueError, match="sets eval.rehearsal_n itself; set --test-time-rehearsal-n"):
        PipelineConfig(eval={"rehearsal_n": 2})
    with pytest.raises(ValueError, match="test_time_rehearsal_n must be >= 0"):
        PipelineConfig(test_time_rehearsal_n=-1)
    with pytest.raises(ValueError, match=r"test_time_rehearsal_limit must be between 1 and eval.limit \(4\)"):
        PipelineConfig(test_time_rehearsal_n=1, test_time_rehearsal_limit=5)  # more than the evaluations play
    with pytest.raises(ValueError, match="test_time_rehearsal_limit must be >= 1"):
        PipelineConfig(test_time_rehearsal_n=1, test_time_rehearsal_limit=0, eval={"limit": None})
    with pytest.raises(ValueError, match="runs only with --test-time-rehearsal-n N > 0"):
        PipelineConfig(test_time_rehearsal_limit=1)
    assert (
        PipelineConfig(
            test_time_rehearsal_n=1, test_time_rehearsal_limit=5, eval={"limit": None}
        ).rehearsal_subset_limit()
        == 5
    )
    assert (
        PipelineConfig(test_time_rehearsal_n=1, test_time_rehearsal_limit=3).rehearsal_subset_limit() == 3
    )  # eval.limit 4
    assert (
        PipelineConfig(test_time_rehearsal_n=1, test_time_rehearsal_limit=4).rehearsal_subset_limit() is None
    )  # all 4
    assert PipelineConfig(test_time_rehearsal_n=1).rehearsal_subset_limit() is None


def test_stage_configs_compose_from_options_and_yaml(tmp_path):
    from agents.cli import build_parser

    path = tmp_path / "p.yaml"
    path.write_text("seed: 7\nsft:\n  optim: {lr: 0.001}\n  max_steps: 2\neval:\n  limit: 2\n")
    args = build_parser().parse_args(
        [
            "pipeline",
            "--config",
            str(path),
            "--sft.max-steps",
            "5",
            "--grpo.optim.lr",
            "3e-6",
            "--sft.optim.warmup-steps",
            "2",
        ]
    )
    config = dataclass_from_args(PipelineConfig, args)
    assert (config.sft.optim.lr, config.sft.max_steps, config.sft.max_seq_len) == (
        0.001,
        5,
        3584,
    )  # file, option, default
    # two levels: the file's and the option's fields of sft.optim merge over this job's (constant), not envace sft's
    assert (config.sft.optim.warmup_steps, config.sft.optim.lr_schedule, config.sft.run.save_every) == (
        2,
        "constant",
        50,
    )
    assert (config.grpo.optim.lr, config.grpo.optim.weight_decay, config.grpo.run.save_every) == (3e-6, 0.01, 3)
    assert (config.grpo.group_size, config.eval.limit) == (2, 2)
    none = dataclass_from_args(PipelineConfig, build_parser().parse_args(["pipeline", "--eval.limit", "none"]))
    assert none.eval.limit is None  # an explicit none is a value, not "not given"
    grpo = config.grpo_config(tmp_path / "g", init="some/ckpt")
    assert (grpo.seed, grpo.init, grpo.split, grpo.optim.lr, grpo.run.threads) == (7, "some/ckpt", "train", 3e-6, 2)
    sft = config.sft_config(tmp_path / "s", ["t1"])
    assert (sft.run_dir, sft.task_ids, sft.run.threads, sft.optim.lr) == (str(tmp_path / "s"), ["t1"], 2, 0.001)
    ev = config.eval_config(tmp_path / "e", model="m")
    assert (ev.seed, ev.model, ev.split, ev.out, ev.limit) == (7, "m", "test", str(tmp_path / "e"), 2)


def test_the_pipeline_runs_on_a_suite_defined_in_tests(tmp_path):
    import tests.testing_env  # noqa: F401  (registers the scripted suites)

    run = tmp_path / "run"
    assert (
        main(
            [
                "pipeline",
                "--run-dir",
                str(run),
                "--suite",
                "scripted-user",
                "--categories",
                *ARGS[:-2],
                "--min-solvable-fraction",
                "0",
                "--grpo.max-new-tokens",
                "24",
                "--eval.max-new-tokens",
                "24",
            ]
        )
        == 0
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["config"]["suite"] == "scripted-user"
    ran = summary["stage_configs"]
    assert ran["sft"]["model"] == ran["grpo"]["model"] == "tiny-random" and ran["sft"]["data"] == ["scripted-user"]
    assert ran["eval_grpo"]["out"] == str(run / "eval_grpo") and ran["grpo"]["init"].startswith(str(run / "sft"))
    sft = json.loads((run / "sft" / "stage_done.json").read_text())
    assert sft["task_ids"] == ["user_0"]  # the demonstration came from the test suite's reference solution
    episodes = [json.loads(line) for line in open(run / "eval_grpo" / "episodes.jsonl", encoding="utf-8")]
    assert [e["task_id"] for e in episodes] == ["user_0"]


@pytest.mark.slow
def test_pipeline_adds_fidelity_and_test_time_rehearsal_stages(tmp_path, capsys):
    run = tmp_path / "lab"
    lab = [
        "--suite",
        "lab-stated",
        "--categories",
        "ship",
        "--fidelity",
        "true",
        "--test-time-rehearsal-limit",
        "1",
        "--test-time-rehearsal-n",
        "1",
    ]
    assert main(["pipeline", "--run-dir", str(run), *ARGS, "--eval.limit", "2", *lab]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["evals"]) == {
        "eval_base",
        "fidelity_base",
        "eval_sft",
        "fidelity_sft",
        "eval_grpo",
        "fidelity_grpo",
        REHEARSAL_STAGE,
    }
    assert summary["stage_configs"][REHEARSAL_STAGE]["rehearsal_n"] == 1
    assert summary["stage_configs"]["fidelity_sft"]["fidelity"] is True
    assert (
        summary["stage_configs"][REHEARSAL_STAGE]["limit"] == 1 and summary["stage_configs"]["eval_grpo"]["limit"] == 2
    )
    assert set(summary["budgets"]) == {"grpo", "eval", REHEARSAL_STAGE}
    rows = summary["rows"]
    assert list(rows) == ["base", "sft", "grpo", SAME_TASKS_ROW, "grpo+rehearsal"]
    assert rows["grpo"]["n_tasks"] == 2 and rows[SAME_TASKS_ROW]["n_tasks"] == rows["grpo+rehearsal"]["n_tasks"] == 1
    plain = [json.loads(line) for line in open(run / "eval_grpo" / "episodes.jsonl", encoding="utf-8")]
    assert rows[SAME_TASKS_ROW]["accuracy"] == plain[0]["reward"]  # the first task of the two
    assert rows["grpo"]["fidelity_calls"] == len(
        (run / "fidelity_grpo" / "fidelity_calls.jsonl").read_text().splitlines()
    )
    grpo = rows["grpo"]
    assert grpo["fidelity_error_calls"] + grpo["fidelity_ordinary_calls"] == grpo["fidelity_calls"]
    out = capsys.readouterr().out
    assert "grpo+rehearsal" in out and "fid exact" in out and "error outputs" in out
    fidelity = [line for line in out.splitlines() if line.startswith("[pipeline] fidelity_")]
    assert sum("rehearsed calls" in line for line in fidelity) == sum("one-step" in line for line in fidelity) == 3
    assert main(["pipeline", "--run-dir", str(run), *ARGS, "--eval.limit", "2", *lab]) == 0
    again = capsys.readouterr().out.splitlines()
    assert all(line in again for line in fidelity)  # a resumed run reprints them
    changed = dataclass_from_args(
        PipelineConfig,
        build_parser().parse_args(["pipeline", "--run-dir", str(run), *ARGS, "--eval.limit", "2", *lab[:-1], "2"]),
    )  # test_time_rehearsal_n 1 -> 2
    with pytest.raises(ValueError, match="eval_grpo_rehearsal was run with other settings .*rehearsal_n"):
        run_pipeline(changed)


def test_stage_rows_merge_fidelity_and_the_table_marks_what_was_not_measured():
    evals = {
        "eval_base": {"accuracy": 0.25, "tool_call_fraction": 0.0, "parse_errors_per_task": 1.0, "n_tasks": 4},
        "fidelity_base": {
            "accuracy": 0.0,
            "fidelity_exact_match": None,
            "fidelity_json_structure_match": None,
            "fidelity_token_f1": None,
            "fidelity_calls": 0,
        },
        "eval_grpo": {"accuracy": 0.5, "tool_call_fraction": 0.75, "parse_errors_per_task": 0.0, "n_tasks": 4},
        "fidelity_grpo": {
            "accuracy": 0.4,
            "fidelity_exact_match": 0.6,
            "fidelity_json_structure_match": 0.8,
            "fidelity_token_f1": 0.9,
            "fidelity_calls": 10,
        },
        REHEARSAL_STAGE: {"accuracy": 0.75, "tool_call_fraction": 0.5, "parse_errors_per_task": 0.0, "n_tasks": 4},
    }
    rows = stage_rows(evals)
    assert list(rows) == ["base", "grpo", "grpo+rehearsal"]
    assert rows["grpo"]["accuracy"] == 0.5 and rows["grpo"]["rehearsed_world_accuracy"] == 0.4
    assert rows["grpo"]["fidelity_exact_match"] == 0.6 and "fidelity_exact_match" not in rows["grpo+rehearsal"]
    lines = stage_table(rows, {"eval_grpo": 30.0, "fidelity_grpo": 12.0, REHEARSAL_STAGE: 7.0, "grpo": 100.0})
    by_model = {line[:16].strip(): line[16:].split() for line in lines[1:]}
    assert by_model["base"][4:7] == ["n/a", "n/a", "n/a"]  # fidelity stage ran, nothing to score
    assert by_model["grpo"][4:] == ["0.600", "0.800", "0.900", "42"]  # eval + fidelity seconds
    assert by_model["grpo+rehearsal"] == ["4", "0.750", "0.500", "0.00", "7"]  # no fidelity stage: blank
    assert by_model["grpo (training)"] == ["100"]


def test_a_rehearsal_stage_on_fewer_tasks_is_compared_with_the_plain_evaluation_on_the_same_tasks(tmp_path):
    def episode(task_id, category, reward):
        return {
            "task_id": task_id,
            "category": category,
            "reward": reward,
            "valid": True,
            "steps": 2,
            "parse_errors": 0,
            "tool_call_fraction": 1.0,
        }

    plain, rehearsed = tmp_path / "eval_grpo", tmp_path / REHEARSAL_STAGE
    for folder, episodes in (
        (
            plain,
            [episode("a_0", "a", 1.0), episode("a_1", "a", 0.0), episode("b_0", "b", 1.0), episode("b_1", "b", 0.0)],
        ),
        (rehearsed, [episode("a_0", "a", 0.0), episode("b_0", "b", 1.0)]),
    ):
        folder.mkdir()
        (folder / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    row = same_tasks_row(plain, rehearsed)
    assert row["n_tasks"] == 2 and row["accuracy"] == 1.0  # a_0 and b_0 solved; all four tasks: 0.5
    (rehearsed / "episodes.jsonl").write_text(json.dumps(episode("a_1", "a", 0.0)) + "\n")
    assert same_tasks_row(plain, rehearsed)["accuracy"] == 0.0
    evals = {
        "eval_grpo": {"accuracy": 0.5, "tool_call_fraction": 1.0, "parse_errors_per_task": 0.0},
        REHEARSAL_STAGE: {"accuracy": 0.0, "tool_call_fraction": 1.0, "parse_errors_per_task": 0.0},
    }
    rows = stage_rows(evals, row)
    assert list(rows) == ["grpo", SAME_TASKS_ROW, "grpo+rehearsal"]
    line = next(line for line in stage_table(rows, {REHEARSAL_STAGE: 9.0}) if line.startswith(SAME_TASKS_ROW))
    assert line[16:].split() == ["2", "1.000", "1.000", "0.00"]  # its seconds are another stage's: blank
    (rehearsed / "episodes.jsonl").write_text(json.dumps(episode("c_0", "c", 0.0)) + "\n")
    with pytest.raises(ValueError, match=r"did not play the tasks \['c_0'\]"):
        same_tasks_row(plain, rehearsed)


@pytest.mark.slow  # builds smollm2-lab's tokenizer on a fresh cache (~45 s)
def test_the_lab_recipe_loads_and_its_budgets_leave_the_tasks_winnable(no_model_loads):
    from pathlib import Path

    from agents.pipeline import check_budgets

    recipe = Path(__file__).resolve().parents[2] / "configs" / "recipes" / "lab-stated.yaml"
    config = load_dataclass(PipelineConfig, str(recipe))
    assert (config.suite, config.model, config.fidelity) == ("lab-stated", "smollm2-lab", True)
    assert config.grpo.group_size > 1 and config.eval.temperature == 0.0
    lines = []
    budgets = check_budgets(config, log=lines.append)
    assert budgets and lines


def test_the_demo_recipe_is_the_hidden_world_on_lab_tiny_and_its_budgets_leave_the_tasks_winnable(no_model_loads):
    from pathlib import Path

    from agents.pipeline import check_budgets

    recipe = Path(__file__).resolve().parents[2] / "configs" / "recipes" / "lab.yaml"
    config = load_dataclass(PipelineConfig, str(recipe))
    assert (config.suite, config.model, config.fidelity) == ("lab", "lab-tiny", True)
    assert config.test_time_rehearsal_n == 2 and config.rehearsal_subset_limit() == 10  # beside the plain eval
    assert config.grpo.batch_tasks * config.grpo.group_size >= 128 and config.sft.group_by_length is False
    budgets = check_budgets(config, log=lambda *_: None)
    assert budgets["grpo"]["fraction"] == budgets["eval"]["fraction"] == 1.0
    # error demonstrations on the recipe's own suite; a suite that proposes no mistakes is refused up front
    sft = config.sft_config("runs/x/sft", ["relocate_1"])
    assert sft.data == ["lab"] and sft.error_demos == 1
    sft.check_error_demos()
    with pytest.raises(ValueError, match="suite 'bfcl' proposes no mistakes"):
        load_dataclass(PipelineConfig, str(recipe), suite="bfcl")


@pytest.mark.parametrize("variant", ["told", "blind"])
def test_a_variant_recipe_is_the_demo_recipe_on_its_suite_and_its_budgets_leave_the_tasks_winnable(
    no_model_loads, variant
):
    from pathlib import Path

    from agents.pipeline import check_budgets

    recipes = Path(__file__).resolve().parents[2] / "configs" / "recipes"
    recipe = load_dataclass(PipelineConfig, str(recipes / f"lab-{variant}.yaml"))  # a key given twice fails here
    lab = load_dataclass(PipelineConfig, str(recipes / "lab.yaml"))
    assert (recipe.suite, recipe.run_dir) == (f"lab-{variant}", f"runs/lab-{variant}")
    assert dataclasses.replace(recipe, suite="lab", run_dir="runs/lab") == lab
    budgets = check_budgets(recipe, log=lambda *_: None)
    assert budgets["grpo"]["fraction"] == budgets["eval"]["fraction"] == 1.0


def test_every_shipped_recipe_loads_through_its_config():
    from pathlib import Path

    from agents.config import TrainConfig

    recipes = sorted((Path(__file__).resolve().parents[2] / "configs" / "recipes").glob("*.yaml"))
    assert len(recipes) >= 5
    for path in recipes:
        cls = TrainConfig if path.name == "envace_qwen3_8b.yaml" else PipelineConfig
        assert load_dataclass(cls, str(path)).model, path


def test_a_finished_stage_is_skipped_only_with_its_settings_wherever_the_run_folder_is(tmp_path, monkeypatch):
    """StageRunner compares the settings a stage ran with, its own paths read as if the run folder were here:
    relative or absolute, moved, or "."; fields in `ignore` may differ, others refuse, naming the field."""
    from pathlib import Path

    from agents.pipeline import StageRunner

    def settings(run):
        run = Path(run)  # as the pipeline builds its stage configs: run / "name"
        return {
            "run_dir": str(run / "train/grpo"),
            "init": str(run / "sft/checkpoints/step_1/model"),
            "model": "smollm2-lab",
            "lr": 1e-5,
            "threads": 2,
            "elsewhere": "runs/ax/model",
        }  # starts like runs/a, is not in it

    def run_stage(run, ignore=("threads",), **changes):
        calls = []
        expected = {**settings(run), **changes}
        StageRunner(run, log=lambda *_: None).stage(
            "train/grpo", lambda _: calls.append(1) or {"config": expected}, expected, ignore
        )
        return len(calls)

    monkeypatch.chdir(tmp_path)
    assert run_stage("runs/a") == 1  # runs once, relative
    assert run_stage("runs/a") == 0 and run_stage(str(tmp_path / "runs/a")) == 0  # absolute: the same folder
    assert run_stage("runs/a", threads=1) == 0  # an ignored field
    with pytest.raises(ValueError, match=r"was run with other settings \(lr\)"):
        run_stage("runs/a", lr=2e-5)
    (tmp_path / "runs/a").rename(tmp_path / "moved")
    assert run_stage("moved") == 0  # its own paths follow it; "elsewhere" is not rewritten to "movedx/model"
    with pytest.raises(ValueError, match=r"other settings \(init\)"):
        run_stage("moved", init="moved/sft/checkpoints/step_2/model")
    monkeypatch.chdir(tmp_path / "moved")
    assert run_stage(".") == 0  # the run folder is the working directory
    # a field added since (FIELDS_ADDED) is read as what the stage ran with then: the old value resumes, another
    # refuses (a stage that lacks a field otherwise compares nothing for it)
    assert run_stage(".", rehearsal_memory="trace", rehearsal_restate_request=False) == 0
    with pytest.raises(ValueError, match=r"other settings \(rehearsal_memory\)"):
        run_stage(".", rehearsal_memory="outcomes")
    assert run_stage(".", some_new_field=3) == 0  # any other new field is not compared


def test_one_step_fidelity_scores_the_model_that_plays_rehearse(monkeypatch):
    """With ``rehearser_model`` set, another model plays REHEARSE: one-step fidelity is that model's, on the
    evaluated tasks; a suite that proposes no mistakes gets none."""
    import types

    import agents.evaluation.one_step
    import agents.training.demonstrations
    from agents.evaluation.evaluate import EvalConfig
    from agents.pipeline import _one_step

    loaded: list[tuple[str, str]] = []
    built: list[list[str]] = []

    class Store:
        def tokenizer(self, name):
            loaded.append(("tokenizer", name))
            return f"tok:{name}"

        def model(self, name):
            loaded.append(("model", name))
            return f"model:{name}"

    def demos(tokenizer, suite, categories, split, *, task_ids, **kwargs):
        built.append(list(task_ids))
        return [f"demo of {i}" for i in task_ids], None

    monkeypatch.setattr(agents.training.demonstrations, "build_demonstrations", demos)
    monkeypatch.setattr(
        agents.evaluation.one_step,
        "one_step_fidelity",
        lambda m, t, d, kind: {"scored": (m, t, d), "kind": kind("broke")},
    )
    result = types.SimpleNamespace(episodes=[{"task_id": "ship_test0"}, {"task_id": "fill_test0"}])
    config = EvalConfig(model="policy-folder", suite="lab", rehearser_model="world-model-folder")
    scored = _one_step(config, result, Store())
    assert scored["scored"] == (
        "model:world-model-folder",
        "tok:world-model-folder",
        ["demo of ship_test0", "demo of fill_test0"],
    )
    assert ("model", "policy-folder") not in loaded and built == [["ship_test0", "fill_test0"]]
    assert scored["kind"] == "breaks"  # error outputs split by the suite's own error kinds
    plain = _one_step(dataclasses.replace(config, rehearser_model=None), result, Store())
    assert plain["scored"][0] == "model:policy-folder"
    assert _one_step(dataclasses.replace(config, suite="bfcl"), result, Store()) is None
