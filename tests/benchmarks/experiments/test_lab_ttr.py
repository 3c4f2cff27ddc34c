"""`benchmarks/experiments/lab_ttr.py` end to end on the tiny model with tiny budgets: memory demonstrations, the two
continuations and the two SFT runs from scratch, every policy at N=0 and under rehearsal, the three controls, the
cost of memory training at N=0, the table and a resumed rerun, two seeds in two worker processes."""

from __future__ import annotations

import json

import pytest
import yaml

from benchmarks.experiments import lab_ttr
from benchmarks.results import render as render_page
from tests.benchmarks.experiments.test_lab_ablations import RECIPE


def test_compare_is_paired_with_the_reference_seed_by_seed():
    ref = [{"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 0.0}]
    rows = [{"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 0.0}]
    c = lab_ttr.compare(rows, ref)
    assert c["success"] == [1.0, 0.5] and c["diff_mean"] == pytest.approx(0.5)
    assert (c["gained"], c["lost"]) == (2, 0) and c["p_values"] == [1.0, 1.0]  # one discordant task per seed
    many = lab_ttr.compare([{f"t{i}": 0.0 for i in range(10)}], [{f"t{i}": 1.0 for i in range(10)}])
    assert many["p_values"] == [pytest.approx(2 / 1024)] and (many["resolved_up"], many["resolved_down"]) == (0, 1)


def test_a_claim_is_resolved_only_when_its_interval_excludes_zero_and_named_for_or_against_by_its_sign():
    from benchmarks.experiments.result_tables import claim_verdict

    assert claim_verdict(0.05, 0.02, 1, "N=2", "N=0") == "resolved: N=2 ahead, as claimed"
    assert claim_verdict(-0.05, 0.02, 1, "N=2", "N=0") == "resolved: N=0 ahead, against the claim"
    assert claim_verdict(-0.05, 0.02, -1, "N=3", "N=2") == "resolved: N=2 ahead, as claimed"
    assert claim_verdict(0.01, 0.02, -1, "N=3", "N=2").startswith("not resolved")
    assert claim_verdict(0.02, 0.02, 1, "N=2", "N=0").startswith("not resolved")  # an interval touching 0
    assert claim_verdict(0.01, None, 1, "N=2", "N=0").startswith("one seed")
    # a claim of no difference: only the second ahead contradicts it; not resolving it says by how much it may be
    assert claim_verdict(-0.05, 0.02, 0, "role_grpo", "real_rollouts").endswith("against the claim")
    assert "real_rollouts may be ahead by up to 0.030" in claim_verdict(-0.01, 0.02, 0, "role_grpo", "real_rollouts")


def _attempt(calls: list) -> dict:
    return {"messages": [{"role": "assistant", "content": "", "tool_calls": [c.to_openai() for c in calls]}]}


def test_memory_hits_counts_the_attempts_that_made_the_reference_calls_and_memory_use_pairs_each_part_with_n0(
    tmp_path,
):
    from envace_gym.suites import make_suite
    from envace_gym.types import ToolCall

    suite = make_suite("lab-blind")
    ship = suite.tasks(["ship"], "test")[:3]
    no_call = next(t for t in suite.tasks(["fill"], "test") if not suite.ground_truth(t)[0])  # the shelf is full
    tasks = {t.id: t for t in [*ship, no_call]}
    (a, b, d), c = [t.id for t in ship], no_call.id
    refs = {t: suite.ground_truth(tasks[t])[0] for t in (a, b, d)}
    assert [len(refs[a]), len(refs[a][1].arguments)] == [2, 2]  # pack, then ship(box, dock)
    wrong = ToolCall("move", {"item": "unicorn", "shelf": "A"})
    flipped = ToolCall(refs[a][1].name, dict(reversed(list(refs[a][1].arguments.items()))))
    assert list(flipped.arguments) != list(refs[a][1].arguments)
    # the reference's calls over two messages of the second attempt, the ship call's arguments in another order
    made = {"messages": [_attempt(refs[a][:1])["messages"][0], _attempt([flipped])["messages"][0]]}
    records = [
        {"task_id": a, "rehearsals": [{"turn": 0, "attempts": [_attempt([wrong]), made]}]},
        {"task_id": b, "rehearsals": [{"turn": 0, "attempts": [_attempt(refs[b][:1]), _attempt([wrong])]}]},
        {"task_id": d, "rehearsals": [{"turn": 0, "attempts": [_attempt(refs[d]), _attempt(refs[d])]}]},
        {"task_id": c, "rehearsals": [{"turn": 0, "attempts": [_attempt([])]}]},  # no call to make: left out
    ]
    (tmp_path / "transcripts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    hits = lab_ttr.memory_hits(tmp_path, suite, tasks)
    assert hits == {a: "some", b: "none", d: "all"}  # b's first attempt made only the first call: not the calls
    with pytest.raises(KeyError):
        lab_ttr.memory_hits(tmp_path, suite, {b: tasks[b], d: tasks[d]})
    # only the first rehearsal counts: one without attempts (another task's memory) leaves the task out
    records[0]["rehearsals"].insert(0, {"turn": 0, "attempts": []})
    (tmp_path / "transcripts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert lab_ttr.memory_hits(tmp_path, suite, tasks) == {b: "none", d: "all"}
    records[0]["rehearsals"] = [{"turn": 1, "attempts": [made]}]  # a lab task has one user turn
    (tmp_path / "transcripts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ValueError, match="user turn 1"):
        lab_ttr.memory_hits(tmp_path, suite, tasks)

    # two seeds, each with its own parts; the tasks outside a seed's hits (c) count in no part
    n0 = [{a: 1.0, b: 0.0, c: 1.0, d: 1.0}, {a: 1.0, b: 0.0, c: 0.0, d: 1.0}]
    rows = [{a: 0.0, b: 0.0, c: 1.0, d: 0.0}, {a: 1.0, b: 1.0, c: 1.0, d: 1.0}]
    use = lab_ttr.memory_use(rows, n0, [hits, {a: "none", b: "none", d: "all"}])
    assert [use[p]["share"] for p in lab_ttr.MADE] == [[1 / 3, 1 / 3], [1 / 3, 0.0], [1 / 3, 2 / 3]]
    assert use["some"]["tasks"] == 1 and "mean" not in use["some"]  # seed 1 has no such task: no comparison
    assert use["all"]["success"] == [0.0, 1.0] and (use["all"]["gained"], use["all"]["lost"]) == (0, 1)
    assert use["all"]["diff_mean"] == -0.5  # where every attempt made the calls, 0.5 below N=0
    assert use["none"]["tasks"] == 3 and use["none"]["success"] == [0.0, 1.0]  # seed 0: b; seed 1: a and b
    assert (use["none"]["gained"], use["none"]["lost"]) == (1, 0)
    assert lab_ttr.memory_use(rows, n0, [hits, {}]) is None  # a seed without attempts: nothing to read

    # the table's reading section: one line per part of each row that has it
    row = {"policy": "memory_scratch", "setting": "N=2", "mean": 0.5, "ci95": None, "diff_mean": 0.0}
    row |= {"diff_ci95": None, "gained": 0, "lost": 0, "resolved_up": 0, "resolved_down": 0, "tokens_per_task": 9}
    n0_row = {**row, "setting": "N=0"}
    results = {"model": "lab-tiny", "seeds": 2, "test_tasks": 3, "scratch_steps": 1, "memory_demos": {}}
    lines = lab_ttr.table({**results, "rows": [n0_row, {**row, "memory_use": use}]})
    at = next(i for i, line in enumerate(lines) if line.startswith("reading the memory"))
    parts = [line.split() for line in lines[at + 2 : at + 5]]
    assert [p[2:4] for p in parts] == [["all", "0.33"], ["some", "0.17"], ["none", "0.50"]]
    assert parts[0][4] == "0.500" and "-0.500" in parts[0] and parts[0][-1] == "+0/-1" and parts[1][-1] == "-"
    assert not any(line.startswith("reading") for line in lab_ttr.table({**results, "rows": [n0_row, row]}))


def test_options_are_checked():
    with pytest.raises(SystemExit):
        lab_ttr.parse_args(["--n", "1", "3"])  # the controls run at N=2
    with pytest.raises(SystemExit):
        lab_ttr.parse_args(["--n", "0"])
    assert lab_ttr.parse_args(["--n", "1", "--no-controls"]).n == [1]
    with pytest.raises(SystemExit):
        lab_ttr.parse_args(["--policies", "memory_scratch"])  # its N=0 is compared with plain_scratch's
    default = lab_ttr.parse_args([]).policies
    assert default == [p for p in lab_ttr.POLICIES if p not in lab_ttr.NAMED_ONLY] and "warm" in default
    assert "memory_restated_scratch" not in default and "memory_scratch" in default
    for bad in (["--rl-n", "3"], ["--rl-steps", "2", "--policies", "warm"], ["--rl-steps", "-1"]):
        with pytest.raises(SystemExit):  # --rl-n without --rl-steps; nothing to continue; a negative budget
            lab_ttr.parse_args(bad)
    assert (lab_ttr.parse_args(["--rl-steps", "2"]).rl_n, lab_ttr.parse_args([]).rl_n) == (lab_ttr.CONTROL_N, 2)
    assert lab_ttr.parse_args(["--policies", "memory_scratch", "plain_scratch"]).policies == [
        "warm",
        "plain_scratch",
        "memory_scratch",
    ]


def _row(policy: str, setting: str, success: float) -> dict:
    return {"policy": policy, "setting": setting, "mean": success, "ci95": None, "diff_mean": success - 0.5}


def test_the_table_names_only_the_training_its_rows_had(tmp_path):
    rows = [_row("warm", "N=0", 0.5), _row("plain_sft", "N=0", 0.5), _row("memory_sft", "N=0", 0.4)]
    for r in rows:
        r |= {"diff_ci95": None, "gained": 0, "lost": 1, "resolved_up": 0, "resolved_down": 0, "tokens_per_task": 0}
    before = {"model": "lab-tiny", "seeds": 1, "test_tasks": 6, "sft_steps": 150, "rows": rows}
    before["memory_demos"] = {"2": {"written": 4}}  # a results.json written before the runs from scratch existed
    header = lab_ttr.table(before)[0]
    assert "continuations (*_sft): 150 SFT steps; 4 memory demonstrations" in header and "scratch" not in header
    scratch = [{**r, "policy": r["policy"].replace("_sft", "_scratch")} for r in rows]
    cost = {"policy": "memory_scratch", "reference": "plain_scratch", "diff_mean": -0.1, "diff_ci95": None}
    cost |= {"gained": 0, "lost": 1, "resolved_up": 0, "resolved_down": 0}
    after = {**before, "rows": scratch, "scratch_steps": 600, "memory_cost": [cost]}
    lines = lab_ttr.table(after)
    assert "from scratch (*_scratch): the recipe's SFT, 600 steps" in lines[0] and "continuations" not in lines[0]
    # the other memory sets are counted by folder, from this key or from the one older runs wrote
    named_sets = {"memory_demos_real": {"2": {"written": 3}}}
    named = lab_ttr.table({**after, "other_memory_demos": named_sets})[0]
    legacy = lab_ttr.table({**after, "real_memory_demos": {"2": {"written": 3}}})[0]
    assert "4 memory demonstrations in memory_demos, 3 in memory_demos_real" in named and named == legacy
    # a run whose policies train on no rehearsed memory recorded none: its header names only the set it has
    only_real = lab_ttr.table({**after, "memory_demos": {}, "other_memory_demos": named_sets})[0]
    assert only_real.endswith("; 3 memory demonstrations in memory_demos_real") and "memory_demos," not in only_real
    assert lab_ttr.table({**after, "memory_demos": {}})[0].endswith("; no memory demonstrations")  # plain runs only
    assert lab_ttr.memory_sources(["warm", "plain_scratch", "real_memory_restated_scratch"]) == {("real", True)}
    assert lab_ttr.memory_sources(["memory_sft", "memory_scratch"]) == {("rehearsed", False)}
    assert lab_ttr.evaluated_policies(["warm", "plain_scratch"], 0) == ["warm", "plain_scratch"]
    assert lab_ttr.evaluated_policies(["warm", "plain_scratch"], 5) == ["warm", "plain_scratch", "plain_scratch_rl"]
    assert lab_ttr.base_policy("memory_scratch_rl") == "memory_scratch" == lab_ttr.base_policy("memory_scratch")
    assert lab_ttr.memory_folder(*lab_ttr.MEMORY_SOURCES["memory_restated_scratch"]) == "memory_demos_restated"
    long_name = lab_ttr.table({**after, "rows": [{**scratch[0], "policy": "real_memory_restated_scratch"}]})
    assert long_name[3].startswith("real_memory_restated_scratch N=0 ")  # the column fits the longest name
    assert lines[-1].split() == ["memory_scratch", "-", "plain_scratch", "-0.100", "tasks", "+0/-1,", "seeds"] + [
        "p<.05",
        "+0/-0",
    ]
    # a run on the blind variant or with another number of memory tasks is a section of its own, beside the default's
    store = tmp_path / "results"
    for suite, tasks, memory in (
        ("lab", lab_ttr.MEMORY_TASKS, "trace"),
        ("lab", 160, "trace"),
        ("lab-blind", lab_ttr.MEMORY_TASKS, "trace"),
        ("lab-blind", lab_ttr.MEMORY_TASKS, "outcomes"),
    ):
        kind = lab_ttr.result_kind(suite, tasks, memory)
        (store / kind).mkdir(parents=True)
        command = f"python -m benchmarks.experiments.lab_ttr --memory-tasks {tasks}"
        result = {**after, "kind": kind, "memory_tasks": tasks, "command": command, "memory": memory}
        (store / kind / "results.json").write_text(json.dumps(result))
    page = render_page(store, tmp_path / "results.md").read_text()
    assert "## Test-time rehearsal on the lab\n" in page
    assert "## Test-time rehearsal on the lab, memory demonstrations of 160 train tasks per family and N" in page
    assert "## Test-time rehearsal on the lab's blind variant (suite lab-blind" in page
    outcomes = "## Test-time rehearsal on the lab's blind variant (suite lab-blind: no look tools, so only a rehearsal "
    assert outcomes + "shows a move break an item), outcomes memory (the trace without the attempts' replies)" in page
    assert "memory demonstrations; outcomes memory (no reply lines)" in page  # its table's header says so too
    assert page.count("## Test-time rehearsal") == 4


def test_a_warm_start_trained_on_another_suite_is_refused(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))  # suite lab-stated
    sft, grpo = tmp_path / "sft", tmp_path / "grpo"
    sft.mkdir()
    (sft / "config.json").write_text(json.dumps({"data": ["lab-blind", "memories.jsonl"]}))
    grpo.mkdir()
    (grpo / "config.yaml").write_text("suite: lab-stated\n")
    argv = ["--recipe", str(recipe), "--out", str(tmp_path / "out"), "--threads", "1", "--memory-tasks", "1", "--warm"]
    with pytest.raises(ValueError, match=r"trained on \['lab-blind', 'memories.jsonl'\], the recipe's suite is 'lab-s"):
        lab_ttr.main([*argv, str(sft)])
    with pytest.raises(ValueError, match=r"leave --warm out; --warm none where it has a default"):
        lab_ttr.main([*argv, str(sft)])
    with pytest.raises(FileNotFoundError, match="no checkpoint"):  # the same suite: past the check, to the model
        lab_ttr.main([*argv, str(grpo)])


def test_a_run_on_a_suite_without_a_results_kind_is_refused_before_any_training(tmp_path, monkeypatch):
    import agents.pipeline

    def no_training(*args, **kwargs):
        raise AssertionError("the warm start was trained before the suite was checked")

    monkeypatch.setattr(agents.pipeline, "sft_stage", no_training)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "suite": "lab-told"}))
    with pytest.raises(ValueError, match=f"runs on suites lab, lab-blind, lab-stated; the recipe {recipe} names"):
        lab_ttr.main(["--recipe", str(recipe), "--out", str(tmp_path / "out"), "--threads", "1"])
    assert not (tmp_path / "out" / "warm_start").exists()
    # more memory tasks than a family's train split holds for three disjoint sets: refused before any training too
    recipe.write_text(yaml.safe_dump(RECIPE))
    with pytest.raises(
        ValueError, match=r"--memory-tasks 33 needs 99 train tasks .*; relocate has 96: give at most 32"
    ):
        lab_ttr.main(["--recipe", str(recipe), "--out", str(tmp_path / "out"), "--memory-tasks", "33"])
    assert not (tmp_path / "out" / "warm_start").exists()
    assert lab_ttr.result_kind("lab-blind", 160) == "lab_ttr_blind_memory_tasks"
    with pytest.raises(ValueError, match="runs on suites lab, lab-blind, lab-stated; the recipe's suite is 'lab-told'"):
        lab_ttr.result_kind("lab-told", lab_ttr.MEMORY_TASKS)


@pytest.mark.slow
def test_every_policy_setting_and_control_is_reported_and_a_rerun_resumes(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    out = tmp_path / "ttr"
    argv = ["--recipe", str(recipe), "--out", str(out), "--seeds", "2", "--workers", "2", "--threads", "1"]
    argv += ["--n", "1", "2"]
    argv += ["--memory-tasks", "1", "--sft-steps", "1", "--limit", "1"]
    argv += ["--policies", *lab_ttr.POLICIES[1:]]  # the diagnostic policies run only when named
    results = lab_ttr.main(argv)
    rows = {(r["policy"], r["setting"]): r for r in results["rows"]}
    settings = ["N=0", "N=1", "N=2"]
    controls = ["N=2, null outputs", "N=2, real outputs (oracle)", "N=2, other task's memory"]
    variants = ["N=2, sequential", "N=2, warm-start rehearser"]
    expected = {"warm": settings, "plain_sft": settings + variants, "memory_sft": settings + variants + controls}
    expected |= {"plain_scratch": expected["plain_sft"], "memory_scratch": expected["memory_sft"]}
    for policy in ("real_memory_scratch", "real_memory_restated_scratch", "memory_restated_scratch"):
        expected[policy] = expected["memory_sft"]
    assert list(rows) == [(p, s) for p in lab_ttr.POLICIES for s in expected[p]]
    assert results["kind"] == "lab_ttr_stated_memory_tasks"  # the stated world, --memory-tasks 1, not the default
    n_tasks = results["test_tasks"]
    assert n_tasks == len(RECIPE["categories"])
    for (_, setting), r in rows.items():
        assert r["n_seeds"] == 2 and len(r["success"]) == 2  # seed 1 from the second worker
        if setting == "N=0":
            assert r["diff_mean"] == 0 and r["tokens_per_task"] == 0 and "memory_use" not in r
        elif "other task" not in setting:
            assert r["tokens_per_task"] > 0  # attempts were generated
            assert [len(r["memory_use"][p]["share"]) for p in lab_ttr.MADE] == [2] * 3  # each seed's memories read
        else:
            assert r["tokens_per_task"] == 0  # the other task's memory is read, not rehearsed
            assert r["memory_use"] is None  # nor held by this task's attempts
    demos = results["memory_demos"]
    assert sorted(demos) == ["1", "2", "3"] and all(d["tasks"] == len(RECIPE["categories"]) for d in demos.values())
    sft = json.loads((out / "memory_sft/seed0/sft/stage_done.json").read_text())["config"]
    plain = json.loads((out / "plain_sft/seed0/sft/stage_done.json").read_text())["config"]
    assert sft["data"][1:] == [d["path"] for d in demos.values()] and plain["data"] == [sft["data"][0]]
    assert sft["init"] == plain["init"] == results["warm_start"] and sft["task_ids"] == plain["task_ids"]
    scratch = json.loads((out / "memory_scratch/seed0/sft/stage_done.json").read_text())["config"]
    scratch_plain = json.loads((out / "plain_scratch/seed0/sft/stage_done.json").read_text())["config"]
    warm_start = json.loads((out / "warm_start/sft/stage_done.json").read_text())
    assert scratch["data"] == sft["data"] and scratch_plain["data"] == plain["data"]
    # the recipe's own SFT stage (its init, tasks and budget), the memory demonstrations added
    assert scratch["init"] == scratch_plain["init"] == warm_start["config"]["init"] != results["warm_start"]
    assert scratch["task_ids"] == scratch_plain["task_ids"] == warm_start["task_ids"]
    assert scratch["max_steps"] == scratch_plain["max_steps"] == RECIPE["sft"]["max_steps"]
    # real_memory_scratch: the same stage on memories of the same attempts answered by the real backend
    real = results["other_memory_demos"]["memory_demos_real"]
    real_scratch = json.loads((out / "real_memory_scratch/seed0/sft/stage_done.json").read_text())["config"]
    assert real_scratch["data"] == [scratch["data"][0], *(d["path"] for d in real.values())]
    assert {k: v for k, v in real_scratch.items() if k not in ("data", "run_dir")} == {
        k: v for k, v in scratch.items() if k not in ("data", "run_dir")
    }
    assert [d["tasks"] for d in real.values()] == [d["tasks"] for d in demos.values()]
    real_stage = json.loads((out / "memory_demos_real/n2/stage_done.json").read_text())["config"]
    rehearsed_stage = json.loads((out / "memory_demos/n2/stage_done.json").read_text())["config"]
    assert real_stage == {**rehearsed_stage, "attempt_outputs": "real"}
    # real_memory_restated_scratch: the request again after each memory, in training and in every evaluation
    restated = json.loads((out / "memory_demos_real_restated/n2/stage_done.json").read_text())["config"]
    assert restated == {**real_stage, "restate_request": True}
    record = json.loads((out / "memory_demos_real_restated/n1.jsonl").read_text().splitlines()[0])
    users = [m["content"] for m in record["messages"] if m["role"] == "user"]
    assert users[1].startswith("Rehearsal memory") and users[2] == users[0]  # request, memory, request
    assert record["messages"][[m["role"] for m in record["messages"]].index("user") + 3]["role"] == "assistant"
    for row in ("n2", "n2_null", "n2_other", "n2_sequential"):  # (N=0 has no rehearsal field at all)
        config = json.loads((out / f"real_memory_restated_scratch/seed1/{row}/eval_config.json").read_text())
        assert config["restate_request"] is True
    assert not json.loads((out / "real_memory_scratch/seed1/n2/eval_config.json").read_text())["restate_request"]
    stats = json.loads((out / "memory_scratch/seed0/sft/data_stats.json").read_text())
    # the test recipe caps demonstrations (max_demos 2): that cap chose the task ids; no memory was cut
    assert RECIPE["sft"]["max_demos"] > 0 and [stats[d["path"]]["cut_by_max_demos"] for d in demos.values()] == [0] * 3
    costs = {c["policy"]: c for c in results["memory_cost"]}
    assert [(c["policy"], c["reference"]) for c in results["memory_cost"]] == list(lab_ttr.PLAIN_CONTROL.items())
    n0 = {p: rows[(p, "N=0")]["mean"] for p in lab_ttr.POLICIES}
    assert costs["memory_scratch"]["diff_mean"] == pytest.approx(n0["memory_scratch"] - n0["plain_scratch"])
    assert (out / "worker1.log").read_text().count("memory_scratch/seed1/sft") >= 1
    split = rows[("memory_sft", "N=2")]["by_family"]
    assert list(split) == RECIPE["categories"] and "by_family" not in rows[("memory_sft", "N=0")]
    # --limit 1: one task per family, so the families' differences average to the row's
    family_mean = sum(c["diff_mean"] for c in split.values()) / len(split)
    assert family_mean == pytest.approx(rows[("memory_sft", "N=2")]["diff_mean"])
    claims = {c["claim"]: c for c in results["claims"]}
    assert list(claims) == [c[0] for c in lab_ttr.TTR_CLAIMS if c[2] != "N=3"]  # --n 1 2: no N=3 row to compare
    parallel = {p["policy"]: p for p in claims["Parallel attempts beat sequential ones"]["policies"]}
    assert list(parallel) == list(lab_ttr.POLICIES[1:])  # the warm start has no sequential row
    sequential_gap = rows[("memory_sft", "N=2")]["mean"] - rows[("memory_sft", "N=2, sequential")]["mean"]
    assert parallel["memory_sft"]["diff_mean"] == pytest.approx(sequential_gap)
    other = claims["The memory is read: another task's memory does worse"]["policies"]
    assert [p["policy"] for p in other] == list(lab_ttr.PLAIN_CONTROL)  # controls run for memory-trained policies
    rehearser = claims["The trained rehearser is what helps: a base-model rehearser gives only a marginal gain"]
    assert {p["reference"] for p in rehearser["policies"]} == {"N=2, warm-start rehearser"}
    n0_claim = {p["policy"]: p for p in claims[lab_ttr.TTR_CLAIMS[0][0]]["policies"]}
    assert n0_claim["warm"]["diff_mean"] == pytest.approx(rows[("warm", "N=2")]["diff_mean"])  # the table's vs N=0
    sequential = json.loads((out / "memory_sft/seed0/n2_sequential/eval_config.json").read_text())
    assert sequential["rehearsal_mode"] == "sequential" and sequential["rehearser_model"] is None
    base = json.loads((out / "plain_sft/seed0/n2_warm_start/eval_config.json").read_text())
    assert base["rehearser_model"] == results["warm_start"] and base["rehearsal_mode"] == "parallel"
    assert (out / "ttr.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "Test-time rehearsal on EnvACE-Lab" in printed and "memory_scratch - plain_scratch" in printed
    assert "- **Parallel attempts beat sequential ones** (paper: N=2 parallel 40.9%, sequential 38.5%):" in printed
    assert "    - memory_sft: `N=2` − `N=2, sequential`: " in printed
    assert "by task family: the row against the same policy at N=0" in printed
    compared = sum(len(c["policies"]) for c in results["claims"])
    assert (
        f"about one comparison in 20 resolves by chance where nothing differs, and there are {compared} here" in printed
    )

    again = lab_ttr.main(argv)
    printed = capsys.readouterr().out
    assert "[stage] warm_start/sft ..." not in printed and "memory_demos/n1: already done" in printed
    assert again["rows"] == results["rows"]


@pytest.mark.slow
def test_rl_continuations_rehearse_only_for_memory_trained_policies_and_are_evaluated_like_the_others(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    out = tmp_path / "ttr"
    argv = ["--recipe", str(recipe), "--out", str(out), "--seeds", "1", "--n", "2", "--threads", "1"]
    argv += ["--memory-tasks", "1", "--limit", "1", "--memory", "outcomes", "--rl-steps", "1", "--rl-n", "1"]
    results = lab_ttr.main([*argv, "--policies", "plain_scratch", "memory_restated_scratch"])
    policies = ["warm", "plain_scratch", "plain_scratch_rl", "memory_restated_scratch", "memory_restated_scratch_rl"]
    assert results["policies"] == policies and results["kind"] == "lab_ttr_stated_memory_tasks_outcomes_rl"
    rows = {(r["policy"], r["setting"]) for r in results["rows"]}
    controls = ["N=2, null outputs", "N=2, real outputs (oracle)", "N=2, other task's memory"]
    assert {("memory_restated_scratch_rl", c) for c in controls} <= rows  # a memory-trained one's controls
    assert not {("plain_scratch_rl", c) for c in controls} & rows
    grpo = {p: json.loads((out / f"{p}_rl/seed0/grpo/stage_done.json").read_text())["config"] for p in policies[1::2]}
    memory = grpo["memory_restated_scratch"]
    assert (memory["rehearsal_n"], memory["rehearsal_memory"], memory["rehearsal_restate_request"]) == (
        1,
        "outcomes",
        True,
    )
    assert grpo["plain_scratch"]["rehearsal_n"] == 0 and grpo["plain_scratch"]["num_steps"] == memory["num_steps"] == 1
    assert memory["init"] != grpo["plain_scratch"]["init"]  # each continues its own SFT
    # the pre-RL rehearser of a continuation is its own start; its evaluations keep the start's layout
    config = json.loads((out / "memory_restated_scratch_rl/seed0/n2_pre_rl/eval_config.json").read_text())
    assert config["rehearser_model"] == memory["init"] and config["restate_request"] is True
    assert ("plain_scratch_rl", "N=2, pre-RL rehearser (its SFT start)") in rows
    assert ("plain_scratch_rl", "N=2, warm-start rehearser") not in rows and (
        "plain_scratch",
        "N=2, warm-start rehearser",
    ) in rows
    assert [(c["policy"], c["reference"]) for c in results["memory_cost"]] == [
        ("memory_restated_scratch", "plain_scratch"),
        ("memory_restated_scratch_rl", "plain_scratch_rl"),
    ]
    from benchmarks.results import store

    store(out, tmp_path / "store")
    page = render_page(tmp_path / "store", tmp_path / "results.md").read_text()
    assert ", outcomes memory (the trace without the attempts' replies), each policy also after 1 RL steps" in page
    assert "RL continuations (*_rl): 1 role-wise GRPO steps, a memory-trained policy's rollouts rehearsing 1" in page
