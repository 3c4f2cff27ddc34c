"""`benchmarks.results`: a script's results.json is stored under docs/results/<kind>/ and rendered into the page."""

from __future__ import annotations

import json
import random

import pytest

from benchmarks import results
from benchmarks.stats import mean_ci95


def _tiny_sft_result(rng: random.Random) -> dict:
    families = ["ship", "overall"]
    seeds = [
        {"seed": s, "sft_s": rng.uniform(100, 200), "test_tasks": 200, "success": {f: rng.random() for f in families}}
        for s in range(3)
    ]
    mean = {f: dict(zip(("mean", "ci95"), mean_ci95([r["success"][f] for r in seeds]))) for f in families}
    settings = {
        "layers": 4,
        "hidden": 128,
        "heads": 2,
        "mimetic_init": True,
        "steps": 600,
        "rows": 16,
        "group_by_length": False,
        "lr": 0.002,
    }
    return {
        "kind": "lab_tiny_sft",
        "command": "python -m benchmarks.experiments.lab_tiny_sft --seeds 0 1 2",
        "settings": settings,
        "seeds": seeds,
        "mean": mean,
        "teacher_forced_mean": {"act/item": {"mean": 0.5, "ci95": 0.1}},
    }


def test_a_stored_result_is_rendered_with_its_numbers_and_command(tmp_path):
    rng = random.Random(7)
    run = tmp_path / "run"
    run.mkdir()
    data = _tiny_sft_result(rng)
    (run / "results.json").write_text(json.dumps(data))
    (run / "curve.png").write_bytes(b"\x89PNG")
    store = tmp_path / "docs" / "results"
    dest = results.store(run, store)
    assert dest == store / "lab_tiny_sft" and (dest / "curve.png").is_file()
    page = results.render(store, tmp_path / "docs" / "results.md").read_text()
    assert data["command"] in page and "do not edit by hand" in page
    overall = data["mean"]["overall"]
    assert f"{overall['mean']:.3f} ± {overall['ci95']:.3f}" in page
    for r in data["seeds"]:
        assert (
            f"| {r['seed']} | {r['sft_s']:.0f} | {r['success']['ship']:.3f} | {r['success']['overall']:.3f} |" in page
        )


def test_an_empty_store_renders_a_page_that_says_so_and_unknown_files_are_refused(tmp_path):
    page = results.render(tmp_path / "none", tmp_path / "results.md").read_text()
    assert "No result is stored yet" in page
    (tmp_path / "results.json").write_text(json.dumps({"accuracy": 1.0}))
    with pytest.raises(ValueError, match="kind"):
        results.store(tmp_path, tmp_path / "store")
    with pytest.raises(FileNotFoundError, match="results.json"):
        results.store(tmp_path / "missing", tmp_path / "store")
    (tmp_path / "results.json").write_text(json.dumps({"kind": "../elsewhere"}))
    with pytest.raises(ValueError, match="no renderer"):
        results.store(tmp_path, tmp_path / "store")


def test_storing_the_stored_copy_is_refused_and_keeps_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(_tiny_sft_result(random.Random(1))))
    stored = results.store(run, tmp_path / "store")
    with pytest.raises(ValueError, match="already the stored copy"):
        results.store(stored, tmp_path / "store")
    assert (stored / "results.json").is_file()


def test_a_command_recorded_before_the_scripts_moved_is_shown_as_it_runs_now(tmp_path):
    assert (
        results.current_command("python benchmarks/perf/lab_ablations.py --out runs/lab_ablations")
        == "python -m benchmarks.experiments.lab_ablations --out runs/lab_ablations"
    )
    assert (
        results.current_command("python -m benchmarks.lab.tiny_sft") == "python -m benchmarks.experiments.lab_tiny_sft"
    )
    assert results.current_command("python -m benchmarks.lab.tiny_sftx") == "python -m benchmarks.lab.tiny_sftx"
    store = tmp_path / "results"
    (store / "lab_tiny_sft").mkdir(parents=True)
    old = dict(_tiny_sft_result(random.Random(3)), command="python -m benchmarks.lab.tiny_sft --seeds 0 1 2")
    (store / "lab_tiny_sft" / "results.json").write_text(json.dumps(old))
    page = results.render(store, tmp_path / "results.md").read_text()
    assert "`python -m benchmarks.experiments.lab_tiny_sft --seeds 0 1 2`" in page and "benchmarks.lab." not in page


def test_the_engine_benchmark_is_rendered_one_row_per_workload_and_batch(tmp_path):
    rng = random.Random(3)

    def engine() -> dict:
        return {"tokens_per_s": rng.uniform(50, 9000), "ms_per_step": rng.uniform(1, 800), "call_s": 1.0}

    rows = [
        {"workload": w, "model": m, "batch": b, "prompt_tokens": rng.uniform(40, 300), "hf": engine(),
         "vllm": engine(), "load_before": rng.uniform(0, 4), "load_after": rng.uniform(0, 4)}
        for w, m in (("lab-tiny", "lab-tiny"), ("bfcl", "smollm2-135m")) for b in (8, 32)
    ]  # fmt: skip
    data = {
        "kind": "engines_equal_work",
        "command": "python -m benchmarks.perf.engines_equal_work --out runs/e",
        "date": "2026-12-05",
        "settings": {"k": 8, "new": 64, "threads": 1, "repeats": 3, "cpus": 2},
        "rows": rows,
    }
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(data))
    store = tmp_path / "docs" / "results"
    assert results.store(run, store) == store / "engines_equal_work"
    page = results.render(store, tmp_path / "results.md").read_text()
    assert data["command"] in page and "1 torch thread(s) on 2 CPUs" in page
    for r in rows:
        ratio = r["vllm"]["tokens_per_s"] / r["hf"]["tokens_per_s"]
        hf_speed = r["hf"]["tokens_per_s"]
        assert (
            f"| {r['workload']} ({r['model']}, {r['prompt_tokens']:.0f}) | {r['batch']} | {hf_speed:.0f} "
            f"| {r['hf']['ms_per_step']:.1f} | {r['vllm']['tokens_per_s']:.0f} | {r['vllm']['ms_per_step']:.1f} "
            f"| {ratio:.2f}x |" in page
        )


def test_a_result_shows_the_commit_it_ran_on_and_whether_the_tree_had_local_changes(tmp_path):
    from benchmarks.provenance import provenance

    here = provenance()
    assert here["commit"] is None or len(here["commit"]) == 40  # a checkout gives its HEAD; an installed copy none
    run = tmp_path / "run"
    run.mkdir()
    data = _tiny_sft_result(random.Random(1)) | {"date": "2026-12-05", "commit": "0123456789abcdef" * 2 + "01234567"}
    store = tmp_path / "store"
    for dirty, shown in ((False, "(2026-12-05, commit 0123456)"), (True, "(2026-12-05, commit 0123456 with local")):
        (run / "results.json").write_text(json.dumps(data | {"dirty": dirty}))
        results.store(run, store)
        assert shown in results.render(store, tmp_path / "results.md").read_text()


@pytest.fixture
def git_repo(tmp_path, monkeypatch):
    """An empty git repository that `benchmarks.provenance` reads as the checkout, and a function running git in it
    (returning its stdout)."""
    import shutil
    import subprocess

    from benchmarks import provenance as prov

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True, capture_output=True
        )
        return done.stdout.decode().strip()

    git("init", "-q")
    monkeypatch.setattr(prov, "ROOT", repo)
    return repo, git


def test_provenance_counts_changed_and_new_files_as_local_changes_but_not_ignored_ones(git_repo):
    """A results file made with a new, uncommitted script or recipe did not run on the recorded commit alone."""
    from benchmarks import provenance as prov

    repo, git = git_repo
    (repo / ".gitignore").write_text("runs/\n")
    (repo / "recipe.yaml").write_text("lr: 1\n")
    git("add", ".")
    git("commit", "-q", "-m", "first")

    def started() -> dict:
        prov.mark_start()  # a process starting now
        return prov.provenance()

    clean = started()
    assert clean["dirty"] is False and len(clean["commit"]) == 40 and "commit_at_write" not in clean
    (repo / "runs").mkdir()
    (repo / "runs" / "results.json").write_text("{}")  # outputs of a run: ignored
    assert started()["dirty"] is False
    (repo / "new_script.py").write_text("print(1)\n")  # a new file git does not ignore
    assert started()["dirty"] is True
    (repo / "new_script.py").unlink()
    (repo / "recipe.yaml").write_text("lr: 2\n")  # a changed tracked file
    assert started() == {"date": clean["date"], "commit": clean["commit"], "dirty": True}


def test_a_result_names_the_commit_its_process_started_on_and_the_one_it_was_written_at(tmp_path, git_repo):
    """A run of hours writes results.json after HEAD moved: the start commit is the code it ran."""
    from benchmarks import provenance as prov

    repo, git = git_repo
    (repo / "a.py").write_text("x = 1\n")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    prov.mark_start()
    first = git("rev-parse", "HEAD")
    (repo / "a.py").write_text("x = 2\n")
    git("commit", "-q", "-am", "second")  # committed while the run ran
    second = git("rev-parse", "HEAD")
    (repo / "b.py").write_text("y = 1\n")  # and an uncommitted file since
    recorded = prov.provenance()
    assert (recorded["commit"], recorded["dirty"]) == (first, False)
    assert (recorded["commit_at_write"], recorded["dirty_at_write"]) == (second, True)
    run, store = tmp_path / "run", tmp_path / "store"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(_tiny_sft_result(random.Random(1)) | recorded))
    results.store(run, store)
    page = results.render(store, tmp_path / "results.md").read_text()
    assert f"commit {first[:7]}, written at commit {second[:7]} with local changes)" in page


def test_a_resumed_job_names_the_commits_its_stages_ran_at(tmp_path, git_repo):
    """A job resumed at a later commit reads back stages an earlier process ran: the result lists where each ran."""
    from agents.pipeline import StageRunner
    from benchmarks import provenance as prov

    repo, git = git_repo
    (repo / "a.py").write_text("x = 1\n")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    first = git("rev-parse", "HEAD")
    prov.mark_start()
    jobs = tmp_path / "job"
    StageRunner(jobs).stage("old", lambda folder: {"eval": {}})  # a stage from before stages were stamped
    stages = StageRunner(jobs, stamp=prov.stamp)
    stages.stage("a", lambda folder: {"eval": {}})
    assert json.loads((jobs / "a" / "stage_done.json").read_text())["provenance"] == {"commit": first, "dirty": False}
    only_here = StageRunner(jobs, stamp=prov.stamp)
    only_here.stage("a", lambda folder: pytest.fail("a finished stage runs again"))
    assert only_here.stamps == {"a": {"commit": first, "dirty": False}} and "stages" not in prov.provenance(only_here)

    (repo / "a.py").write_text("x = 2\n")
    git("commit", "-q", "-am", "second")
    second = git("rev-parse", "HEAD")
    prov.mark_start()  # the resumed process
    resumed = StageRunner(jobs, stamp=prov.stamp)
    for name in ("old", "a", "b"):
        resumed.stage(name, lambda folder: {"eval": {}})
    recorded = prov.provenance(resumed)
    assert recorded["commit"] == second and recorded["stages"] == {
        "ran_at": [{"commit": first, "dirty": False, "stages": 1}, {"commit": second, "dirty": False, "stages": 1}],
        "unrecorded": 1,
        "earlier": None,  # no results.json was written before
    }
    # the folder's previous results.json names the commit that wrote it, the witness of the unrecorded stage
    (jobs / "results.json").write_text(json.dumps({"commit": "f" * 40, "dirty": True}))
    assert prov.provenance(resumed)["stages"]["earlier"] == {"commit": "f" * 40, "dirty": True}
    (jobs / "results.json").write_text(json.dumps(prov.provenance(resumed)))  # and a rewrite keeps it
    assert prov.provenance(resumed)["stages"]["earlier"] == {"commit": "f" * 40, "dirty": True}
    run, store = tmp_path / "run", tmp_path / "store"
    run.mkdir()
    recorded = prov.provenance(resumed)
    recorded["stages"]["ran_at"].append({"commit": None, "dirty": None, "stages": 2})  # a stage run outside git
    (run / "results.json").write_text(json.dumps(_tiny_sft_result(random.Random(1)) | recorded))
    results.store(run, store)
    page = results.render(store, tmp_path / "results.md").read_text()
    shown = f"commit {second[:7]}; of its stages, 1 ran at commit {first[:7]}, 1 ran at commit {second[:7]}, 2 ran "
    shown += "at an unknown commit, 1 ran before stages recorded their commit, in a folder whose earlier results name "
    assert shown + "commit fffffff with local changes)" in page
