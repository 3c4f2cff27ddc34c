"""`benchmarks/experiments/judge_agreement.py` and `make_checklists.py` at tiny size: the scripted policy's mistakes
fail the verifier and its clean episodes pass, every episode is judged on its derived checklist, and the confusion
matrix counts them; a model policy plays on the real backend; the checklists round-trip through JSONL."""

from __future__ import annotations

import json

import pytest

from benchmarks.experiments import judge_agreement, make_checklists
from benchmarks.experiments.result_tables import format_matrix
from envace_gym.judging import load_checklists


def test_confusion_counts_agreement_and_kappa():
    c = judge_agreement.confusion([(True, True), (True, False), (False, False), (False, False)])
    assert (c["both_pass"], c["verifier_only"], c["judge_only"], c["both_fail"]) == (1, 1, 0, 2)
    assert c["agreement"] == 0.75 and c["kappa"] == pytest.approx(0.5)
    assert judge_agreement.confusion([(True, True)] * 3)["kappa"] is None  # one class only: chance agreement is 1


def test_the_agreement_of_a_weak_judge_at_tiny_size(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--judge", "tiny-random", "--episodes", "6", "--judge-tokens", "4", "--mistake-rate", "0.5"]
    report = judge_agreement.main([*argv, "--out", str(out)])
    records = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert report["episodes"] == 6 and len(records) == 6
    assert any(r["mistake"] for r in records) and any(not r["mistake"] for r in records)
    for r in records:  # the reference solution passes the verifier; every drawn mistake is a real failure
        assert r["verifier"] == (0.0 if r["mistake"] else 1.0)
        assert r["items"] and all(i["verdict"] is None for i in r["items"])  # tiny-random says nothing readable
    c = report["confusion"]
    assert c["both_pass"] + c["verifier_only"] + c["judge_only"] + c["both_fail"] == 6
    assert c["both_pass"] == c["judge_only"] == 0  # an unreadable judge (scored 0) never passes an episode
    assert report["unparseable"] == sum(len(r["items"]) for r in records)
    printed = capsys.readouterr().out
    assert "verifier pass" in printed and "agreement" in printed
    # the stored result renders on the results page with the printed matrix
    from benchmarks import results

    store = tmp_path / "docs" / "results"
    results.store(out, store)
    page = results.render(store, tmp_path / "results.md").read_text()
    assert format_matrix(c) in page and "--mistake-rate 0.5" in page


def test_a_model_policy_plays_on_the_real_backend():
    report = judge_agreement.main(
        [
            "--policy",
            "tiny-random",
            "--judge",
            "tiny-random",
            "--episodes",
            "2",
            "--max-new-tokens",
            "4",
            "--max-steps-per-turn",
            "2",
            "--judge-tokens",
            "2",
        ]
    )
    assert report["episodes"] == 2 and report["confusion"]["both_pass"] + report["confusion"]["judge_only"] == 0


def test_bad_options_fail_fast():
    with pytest.raises(SystemExit):
        judge_agreement.parse_args(["--threshold", "2"])
    with pytest.raises(SystemExit, match="no checklist"):
        judge_agreement.main(["--suite", "bfcl", "--judge", "tiny-random"])


def test_derived_checklists_are_written_as_jsonl(tmp_path):
    out = tmp_path / "lab.jsonl"
    n = make_checklists.main(["--suite", "lab-stated", "--categories", "count", "ship", "--out", str(out)])
    checklists = load_checklists(out)
    assert n == len(checklists) > 0
    count = next(c for task_id, c in checklists.items() if task_id.startswith("count"))
    assert "free slots" in count.turns[-1][-1].item
