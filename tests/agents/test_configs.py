"""One way to build configs and CLIs: every command's options come from its config's fields (help text
included), YAML files round-trip, and a bad value names its field."""

from __future__ import annotations

import dataclasses
import io
import typing
from contextlib import redirect_stdout

import pytest
import yaml

from agents.cli import main
from agents.config import MemoryConfig, OptimConfig, RunConfig, TrainConfig, load_dataclass
from agents.evaluation.evaluate import EvalConfig
from agents.pipeline import PipelineConfig
from agents.training.sft import SFTConfig

COMMANDS = {"train": TrainConfig, "sft": SFTConfig, "eval": EvalConfig, "pipeline": PipelineConfig}


def _help(command: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        main([command, "--help"])
    return " ".join(out.getvalue().split())


def _options(cls: type, prefix: str = "") -> list[tuple[str, str]]:
    """(option, help) of every settable field, nested stage configs as ``--stage.field``."""
    out, hints = [], typing.get_type_hints(cls)
    for f in (f for f in dataclasses.fields(cls) if f.init):
        if dataclasses.is_dataclass(hints[f.name]):
            out += _options(hints[f.name], f"{prefix}{f.name}.")
        else:
            out.append((f"--{prefix}{f.name.replace('_', '-')}", f.metadata["help"]))
    return out


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_field_is_an_option_with_its_help(command):
    text = _help(command)
    for option, help_text in _options(COMMANDS[command]):
        assert f"{option} " in text, option
        assert " ".join(help_text.split())[:40] in text, option


def test_the_shared_groups_are_options_one_and_two_levels_down_with_each_commands_defaults():
    train, sft, pipeline = _help("train"), _help("sft"), _help("pipeline")
    assert "--optim.lr OPTIM.LR AdamW learning rate" in train and "--grpo.optim.lr GRPO.OPTIM.LR AdamW" in pipeline
    # the help's default is the command's own: envace train, envace sft, and the pipeline's stages
    assert "(default: 1e-05) --optim.weight-decay OPTIM.WEIGHT_DECAY AdamW weight decay (default: 0.01)" in train
    assert "(default: 2e-05) --optim.weight-decay OPTIM.WEIGHT_DECAY AdamW weight decay (default: 0.0)" in sft
    assert "--sft.optim.lr SFT.OPTIM.LR AdamW learning rate (the paper's 8B GRPO run used 1e-6) (default: 0.0001)" in (
        pipeline
    )
    assert "--sft.run.save-every SFT.RUN.SAVE_EVERY" in pipeline and "(and at the end) (default: 3)" in pipeline
    for command in ("train", "sft"):  # the old flat spellings are gone
        with pytest.raises(SystemExit):
            main([command, "--lr", "1e-3"])


def test_each_command_keeps_its_defaults_in_the_shared_groups():
    assert TrainConfig().optim == OptimConfig(lr=1e-5, weight_decay=0.01, lr_schedule="constant")
    assert SFTConfig().optim == OptimConfig(lr=2e-5, weight_decay=0.0, lr_schedule="cosine")
    assert (TrainConfig().run, SFTConfig().run) == (RunConfig(save_every=1), RunConfig(save_every=50))
    assert TrainConfig().memory == SFTConfig().memory == MemoryConfig()
    # a mapping lays its fields over the command's defaults, not the group class's
    assert TrainConfig(optim={"lr": 3e-6}).optim == OptimConfig(lr=3e-6, weight_decay=0.01)
    assert SFTConfig(optim={"warmup_steps": 4}).optim.lr_schedule == "cosine"


@pytest.mark.parametrize(
    "group, message",
    [
        ({"optim": {"lr": 0}}, "invalid OptimConfig: optim.lr must be > 0, got 0.0"),
        ({"optim": {"adam_beta2": 1.0}}, "invalid OptimConfig: optim.adam_beta2 must be in [0, 1), got 1.0"),
        ({"optim": {"lr_schedule": "step"}}, "invalid OptimConfig: optim.lr_schedule must be one of"),
        ({"run": {"save_every": 0}}, "invalid RunConfig: run.save_every must be >= 1, got 0"),
        ({"run": {"device": "gpu"}}, "invalid RunConfig: run.device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"),
        ({"memory": {"logprob_chunk_size": "x"}}, "invalid MemoryConfig: memory.logprob_chunk_size must be an integer"),
    ],
)
def test_a_shared_group_validates_once_with_the_same_message_in_every_command(group, message):
    messages = []
    for build in (TrainConfig, SFTConfig, lambda **kw: PipelineConfig(grpo=kw), lambda **kw: PipelineConfig(sft=kw)):
        with pytest.raises(ValueError) as err:
            build(**group)
        messages.append(str(err.value))
    assert messages[0].startswith(message) and len(set(messages)) == 1, messages


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_yaml_round_trips(command, tmp_path):
    cls = COMMANDS[command]
    extra = {"model": "tiny-random"}
    if cls is TrainConfig:
        extra["suite"] = "scripted"
    config = cls(**extra)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(dataclasses.asdict(config), sort_keys=False))
    assert load_dataclass(cls, path) == config


def test_an_eval_yaml_and_options_combine_and_bools_take_a_bare_flag(tmp_path):
    import tests.testing_env  # noqa: F401  (registers the scripted suites)

    path = tmp_path / "eval.yaml"
    path.write_text("model: tiny-random\nsuite: scripted\nsplit: all\nlimit: 1\nmax_new_tokens: 4\n")
    out = tmp_path / "ev"
    assert (
        main(
            [
                "eval",
                "--config",
                str(path),
                "--max-steps-per-turn",
                "1",
                "--min-solvable-fraction",
                "0",
                "--out",
                str(out),
                "--overwrite",
            ]
        )
        == 0
    )
    saved = yaml.safe_load((out / "eval_config.json").read_text())
    assert (saved["model"], saved["suite"], saved["limit"], saved["max_steps_per_turn"]) == (
        "tiny-random",
        "scripted",
        1,
        1,
    )


def test_bad_values_name_their_field():
    with pytest.raises(ValueError, match="invalid EvalConfig: limit must be an integer"):
        EvalConfig(limit="many")
    with pytest.raises(ValueError, match="rehearsal_mode must be one of"):
        EvalConfig(rehearsal_mode="both")


def test_domains_is_another_name_for_the_categories_of_eval_and_train():
    from agents.cli import build_parser
    from agents.config import dataclass_from_args

    parser = build_parser()
    config = dataclass_from_args(
        EvalConfig, parser.parse_args(["eval", "--suite", "tau2", "--domains", "airline", "retail"])
    )
    assert config.categories == ["airline", "retail"]
    config = dataclass_from_args(TrainConfig, parser.parse_args(["train", "--suite", "tau2", "--domains", "retail"]))
    assert config.categories == ["retail"]


def test_no_categories_means_the_suites_default_in_every_command():
    """``--suite lab`` alone trains on every lab family (it used to inherit BFCL's multi_turn_base and fail)."""
    from agents.cli import build_parser
    from agents.config import dataclass_from_args
    from agents.pipeline import PipelineConfig
    from agents.training.sft import SFTConfig
    from envace_gym.suites import make_suite

    parser = build_parser()
    train = dataclass_from_args(TrainConfig, parser.parse_args(["train", "--suite", "lab"]))
    sft = dataclass_from_args(SFTConfig, parser.parse_args(["sft", "--data", "lab"]))
    recipe = PipelineConfig(suite="lab")
    stages = [recipe.sft_config("r/sft", []), recipe.grpo_config("r/grpo", "m"), recipe.eval_config("r/eval", "m")]
    assert train.categories is sft.categories is None and all(s.categories is None for s in stages)
    lab = make_suite("lab")
    families = {t.metadata["category"] for t in lab.tasks(train.categories, "train")}
    assert families == {"relocate", "ship", "fill", "make_room", "ship_two", "full_job"}
    bfcl = make_suite("bfcl").tasks(TrainConfig().categories, "train")  # BFCL's default is unchanged
    assert bfcl and {t.metadata["category"] for t in bfcl} == {"multi_turn_base"}
    assert PipelineConfig(suite="lab", categories=["fill"]).grpo_config("r", "m").categories == ["fill"]
