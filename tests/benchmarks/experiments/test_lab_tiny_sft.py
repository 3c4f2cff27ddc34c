"""`benchmarks.experiments.lab_tiny_sft`: the lab-tiny SFT protocol runs end to end, reads a finished seed back instead
of retraining it, and refuses another run's folder."""

from __future__ import annotations

import json

import pytest

from benchmarks.experiments import lab_tiny_sft
from benchmarks.results import render as render_page
from benchmarks.results import store
from benchmarks.stats import mean_ci95

SMOKE = ["--steps", "2", "--rows", "4", "--limit", "1", "--categories", "ship", "--warmup-steps", "1"]


def test_smoke_run_reports_each_seed_and_reads_finished_seeds_back(tmp_path, capsys):
    out = tmp_path / "run"
    fid = ["--fidelity-limit", "1"]
    result = lab_tiny_sft.main(SMOKE + fid + ["--seeds", "0", "1", "--out", str(out)])
    assert [r["seed"] for r in result["seeds"]] == [0, 1]
    assert all(0.0 <= r["success"]["ship"] <= 1.0 and r["test_tasks"] == 1 for r in result["seeds"])
    kinds = result["seeds"][0]["teacher_forced"]
    assert set(kinds) == {"act", "rehearse"} and {"item", "dock", "letter", "other"} <= set(kinds["act"])
    assert (out / "seed_1" / "eval" / "episodes.jsonl").is_file()
    assert json.loads((out / "results.json").read_text())["mean"]["overall"]["ci95"] is not None
    for r in result["seeds"]:  # rehearsal fidelity on ordinary and error outputs, None where no call had one
        assert {"ordinary", "error"} <= set(r["fidelity"])
        for group in ("ordinary", "error"):
            f = r["fidelity"][group]
            assert (f["exact_match"] is None) == (f["calls"] == 0) and 0.0 <= (f["exact_match"] or 0.0) <= 1.0
    assert (out / "seed_0" / "fidelity" / "episodes.jsonl").is_file()
    printed = capsys.readouterr().out
    assert "lab-tiny SFT from scratch" in printed and "rehearsal fidelity, exact match" in printed
    assert "one-step rehearsal fidelity" in printed and "ordinary" in result["one_step_fidelity_mean"]
    stamp = (out / "seed_0" / "report.json").stat().st_mtime_ns
    lab_tiny_sft.main(SMOKE + fid + ["--seeds", "0", "--out", str(out)])
    assert (out / "seed_0" / "report.json").stat().st_mtime_ns == stamp  # read back, not retrained
    with pytest.raises(SystemExit, match="other settings"):
        lab_tiny_sft.main(SMOKE[:-2] + fid + ["--warmup-steps", "2", "--seeds", "0", "--out", str(out)])
    # a folder whose settings.json predates --fidelity-limit (no such key) resumes when the option is not given
    old = tmp_path / "old"
    (old / "seed_0").mkdir(parents=True)
    (old / "seed_0" / "report.json").write_bytes((out / "seed_0" / "report.json").read_bytes())
    settings = json.loads((out / "settings.json").read_text())
    del settings["fidelity_limit"]
    (old / "settings.json").write_text(json.dumps(settings))
    assert "fidelity_mean" not in lab_tiny_sft.main(SMOKE + ["--seeds", "0", "--out", str(old)])
    with pytest.raises(SystemExit, match="other settings"):  # fidelity is not added to a run made without it
        lab_tiny_sft.main(SMOKE + fid + ["--seeds", "0", "--out", str(old)])


def test_token_kind_accuracy_is_one_for_a_model_that_predicts_the_demonstration(tmp_path):
    """A stand-in model whose logits put the demonstration's own next token first scores 1 on every kind; one
    that always predicts the end token scores 0 on items."""
    import torch

    from agents.training.demonstrations import build_demonstrations
    from benchmarks.lab.lab_tiny import build_lab_tokenizer

    tokenizer = build_lab_tokenizer()
    demos, _ = build_demonstrations(tokenizer, "lab", ["ship"], "test", limit=3, max_tokens=None)
    vocab = len(tokenizer)

    class Oracle(torch.nn.Module):
        def __init__(self, next_of):
            super().__init__()
            self.next_of = next_of

        def forward(self, input_ids):
            ids = input_ids[0].tolist()
            logits = torch.zeros(1, len(ids), vocab)
            for t in range(len(ids)):
                logits[0, t, self.next_of(ids, t)] = 1.0
            return type("Out", (), {"logits": logits})()

    by_sequence = {tuple(d.token_ids): d.token_ids for d in demos}
    perfect = lab_tiny_sft.token_kind_accuracy(
        Oracle(lambda ids, t: by_sequence[tuple(ids)][min(t + 1, len(ids) - 1)]), tokenizer, demos
    )
    assert all(v == 1.0 for kinds in perfect.values() for v in kinds.values()) and "item" in perfect["act"]
    eos = lab_tiny_sft.token_kind_accuracy(Oracle(lambda ids, t: tokenizer.eos_token_id), tokenizer, demos)
    assert eos["act"]["item"] == 0.0 and eos["rehearse"]["dock"] == 0.0


def test_mean_ci95_matches_the_t_table():
    mean, half = mean_ci95([0.2, 0.4, 0.6])
    assert mean == pytest.approx(0.4) and half == pytest.approx(4.303 * 0.2 / 3**0.5)
    assert mean_ci95([0.5]) == (0.5, None)
    with pytest.raises(ValueError):
        mean_ci95([])


def test_a_negative_fidelity_limit_is_refused_before_any_training(capsys):
    with pytest.raises(SystemExit):
        lab_tiny_sft.parse_args(["--fidelity-limit", "-1"])
    assert "--fidelity-limit must be >= 0" in capsys.readouterr().err
    assert lab_tiny_sft.parse_args(["--fidelity-limit", "0"]).fidelity_limit == 0


def test_the_default_budget_is_the_lab_recipes():
    import yaml

    from benchmarks.experiments.lab_ttr import RECIPE

    assert lab_tiny_sft.STEPS == yaml.safe_load(RECIPE.read_text())["sft"]["max_steps"]


def test_the_blind_variant_trains_on_its_own_world_and_writes_its_own_kind(tmp_path):
    out = tmp_path / "blind"
    argv = ["--steps", "2", "--rows", "4", "--limit", "1", "--categories", "relocate", "--warmup-steps", "1"]
    result = lab_tiny_sft.main([*argv, "--suite", "lab-blind", "--seeds", "0", "--out", str(out)])
    assert result["kind"] == "lab_tiny_sft_blind_steps" and result["settings"]["suite"] == "lab-blind"  # not 600
    assert json.loads((out / "seed_0/sft/config.json").read_text())["data"] == ["lab-blind"]
    assert json.loads((out / "seed_0/eval/eval_config.json").read_text())["suite"] == "lab-blind"
    stored = store(out, tmp_path / "results")
    page = render_page(stored.parent, tmp_path / "results.md").read_text()
    assert "## lab-tiny learns the hidden-rules lab's blind variant (suite lab-blind: no look tools" in page
    assert "by SFT from scratch, 2 steps\n" in page
    with pytest.raises(SystemExit, match="other settings"):  # the default world is another run
        lab_tiny_sft.main([*argv, "--seeds", "0", "--out", str(out)])
