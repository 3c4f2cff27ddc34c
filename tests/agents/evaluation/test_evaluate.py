"""`envace eval` and `envace report` on the scripted suite: output files and columns, accuracy equal to the
episodes' rewards (BFCL-style unweighted category mean), rehearsal and fidelity columns, PNG plots."""

from __future__ import annotations

import csv
import dataclasses
import json
import re

import gymnasium as gym
import pytest

import tests.testing_env  # noqa: F401
from agents.cli import main
from agents.evaluation.evaluate import EPISODE_FIELDS, FIDELITY_FIELDS, SUMMARY_FIELDS, EvalConfig, evaluate, summarize
from tests.wrappers.test_test_time_rehearsal import ScriptedPolicy, always


def _read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def _rule(ctx):
    """Answer scripted_0 right (add 2) and scripted_1 wrong (adds 3 + 5 = 8, target 7)."""
    pieces = ctx.split("<|im_start|>user\n")
    k = max(i for i, p in enumerate(pieces) if i > 0 and not p.startswith("Rehearsal memory"))
    last = "<|im_start|>user\n".join(pieces[k:])  # the request being played and all after it (memory, tools)
    if "<|im_start|>tool" in last:
        return "done"
    n = int(re.search(r"[Aa]dd (-?\d+)", last).group(1))
    return f"[add(value={n + 1 if last.startswith('Now') else n})]"


def test_cli_eval_writes_jsonl_and_csv_with_the_right_columns(tmp_path):
    out = tmp_path / "ev"
    rc = main(
        [
            "eval",
            "--model",
            "tiny-random",
            "--suite",
            "scripted",
            "--split",
            "all",
            "--limit",
            "2",
            "--max-new-tokens",
            "6",
            "--max-steps-per-turn",
            "1",
            "--min-solvable-fraction",
            "0",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    episodes = [json.loads(line) for line in open(out / "episodes.jsonl", encoding="utf-8")]
    assert [e["task_id"] for e in episodes] == ["scripted_0", "scripted_1"]
    assert all(list(e) == EPISODE_FIELDS for e in episodes)
    fields, rows = _read_csv(out / "summary.csv")
    assert fields == SUMMARY_FIELDS and [r["category"] for r in rows] == ["scripted", "overall"]
    doc = json.loads((out / "summary.json").read_text())
    assert doc["config"]["model"] == "tiny-random" and doc["config"]["rehearsal_n"] == 0
    assert doc["overall_accuracy"] == sum(e["reward"] for e in episodes) / 2


def test_accuracy_matches_rewards_and_rehearsal_columns(tmp_path):
    policy = ScriptedPolicy(_rule)
    config = EvalConfig(
        model="tiny-random",
        suite="scripted",
        split="all",
        limit=2,
        max_new_tokens=6,
        max_steps_per_turn=3,
        rehearsal_n=1,
        memory_tokens=32,
        attempt_max_steps=1,
        min_solvable_fraction=0.0,
        critique_tokens=4,
        memory="summary",
        out=str(tmp_path / "r"),
    )
    result = evaluate(config, policy=policy, log=None)
    rewards = {e["task_id"]: e["reward"] for e in result.episodes}
    assert rewards == {"scripted_0": 1.0, "scripted_1": 0.0}
    assert result.overall_accuracy == 0.5 == result.summary[0]["accuracy"]
    e0, e1 = result.episodes
    assert (e0["steps"], e0["turns"], e0["tool_call_fraction"]) == (2, 1, 0.5)  # add, then "done"
    assert (e1["steps"], e1["turns"], e1["num_turns"]) == (4, 2, 2)
    assert e0["rehearsal_turns"] == 1 and e1["rehearsal_turns"] == 2 and e1["rehearsal_attempts"] == 2
    assert 0 < e1["memory_tokens"] <= 2 * 32
    assert e0["valid"] is True and e1["valid"] is False and e0["parse_errors"] == 0
    # transcripts.jsonl: what each episode said, and where each turn's memory went in it
    transcripts = {
        t["task_id"]: t for t in map(json.loads, open(tmp_path / "r" / "transcripts.jsonl", encoding="utf-8"))
    }
    t1 = transcripts["scripted_1"]
    assert t1["reward"] == 0.0 and len(t1["rehearsals"]) == 2
    assert all(m["role"] != "system" for m in t1["messages"])
    user = [m["content"] for m in t1["messages"] if m["role"] == "user"]
    assert [r["memory"] for r in t1["rehearsals"]] == [u for u in user if u.startswith("Rehearsal memory")]
    assert sum(m["role"] == "assistant" for m in t1["messages"]) == e1["steps"]
    assert len(t1["rehearsals"][0]["attempts"]) == 1 and len(t1["rehearsals"][0]["critiques"]) == 1
    # the default memory is the trace: no critique, the same rewards (the scripted policy ignores the memory)
    trace = evaluate(dataclasses.replace(config, memory="trace", out=str(tmp_path / "t")), policy=policy, log=None)
    assert {e["task_id"]: e["reward"] for e in trace.episodes} == rewards
    first = json.loads(open(tmp_path / "t" / "transcripts.jsonl", encoding="utf-8").readline())["rehearsals"][0]
    assert first["critiques"] == [] and first["memory"].startswith("Rehearsal memory")


def test_transcripts_leave_out_the_system_prompt_and_keep_the_rest(tmp_path):
    """The lab suite opens every episode with a system prompt (the world's rules and tools); the transcript drops only
    it."""
    from agents.evaluation.evaluate import _transcript_record

    policy = ScriptedPolicy(always("done"))
    config = EvalConfig(
        model="tiny-random",
        suite="lab-stated",
        categories=["ship"],
        split="test",
        limit=1,
        max_new_tokens=6,
        max_steps_per_turn=2,
        min_solvable_fraction=0.0,
        out=str(tmp_path / "lab"),
    )
    evaluate(config, policy=policy, log=None)
    (t,) = map(json.loads, open(tmp_path / "lab" / "transcripts.jsonl", encoding="utf-8"))
    assert [m["role"] for m in t["messages"]][:2] == ["user", "assistant"]
    assert t["messages"][1]["content"] == "done" and t["reward"] == 0.0 and t["rehearsals"] == []
    # the same record from a live env: its trajectory does hold the system prompt the record leaves out
    env = gym.make("EnvACE-Tool-v0", suite="lab-stated", model="tiny-random", categories=["ship"], split="test")
    env.reset(seed=0, options={"task_id": t["task_id"]})
    env.step("done")
    full = [m.to_dict() for m in env.unwrapped.trajectory.messages]
    assert full[0]["role"] == "system" and "You run a warehouse" in full[0]["content"]  # the world's rules
    record = _transcript_record(env.unwrapped.task, env, {"reward": 0.0, "rehearsals": []})
    assert record["messages"] == full[1:] == t["messages"][: len(full) - 1]
    env.close()


def test_overall_is_the_unweighted_category_mean():
    eps = [dict(category="a", reward=1.0, valid=True, steps=1, parse_errors=0, tool_call_fraction=1.0)] * 3
    eps += [dict(category="b", reward=0.0, valid=False, steps=3, parse_errors=1, tool_call_fraction=0.0)]
    rows = summarize(eps)
    assert [r["accuracy"] for r in rows] == [1.0, 0.0, 0.5]  # not 3/4 (the task mean)
    assert rows[-1]["n_tasks"] == 4


def test_fidelity_eval_and_report_write_tables_and_pngs(tmp_path):
    policy = ScriptedPolicy(_rule)
    fid = evaluate(
        EvalConfig(
            model="tiny-random",
            suite="scripted",
            split="all",
            limit=1,
            max_new_tokens=6,
            max_steps_per_turn=2,
            fidelity=True,
            min_solvable_fraction=0.0,
            out=str(tmp_path / "fid"),
        ),
        policy=policy,
        log=None,
    )
    assert fid.episodes[0]["fidelity_calls"] == 1 and fid.fidelity_calls[0]["real"] == '{"total": 2}'
    fields, rows = _read_csv(tmp_path / "fid" / "fidelity_per_tool.csv")
    assert fields == FIDELITY_FIELDS and [r["group"] for r in rows] == ["add", "all"]
    assert rows[0]["n_calls"] == "1"
    # a run folder: training metrics plus eval summaries at N = 0, 1, 2 in both modes
    run = tmp_path
    with open(run / "metrics.jsonl", "w") as f:
        for step in (1, 2, 3):
            f.write(
                json.dumps(
                    {
                        "step": step,
                        "rollout/reward_mean": 0.1 * step,
                        "rollout/reward_mean/act": 0.1,
                        "rollout/reward_mean/rehearse": 0.2,
                        "train/loss": 1.0 / step,
                        "train/clip_fraction": 0.01,
                        "train/approx_kl": 0.001,
                        "train/kl": 0.0,
                    }
                )
                + "\n"
            )
    for n, mode, acc in [
        (0, "parallel", 0.2),
        (1, "parallel", 0.3),
        (2, "parallel", 0.4),
        (1, "sequential", 0.25),
        (2, "sequential", 0.35),
    ]:
        d = run / f"ev_n{n}_{mode}"
        d.mkdir()
        (d / "summary.json").write_text(
            json.dumps(
                {
                    "config": {"rehearsal_n": n, "rehearsal_mode": mode, "fidelity": False},
                    "overall_accuracy": acc,
                    "categories": {},
                }
            )
        )
    assert main(["report", str(run)]) == 0
    pngs = sorted(p.name for p in (run / "plots").glob("*.png"))
    assert pngs == ["accuracy_vs_rehearsal_n.png", "fidelity_per_tool_fid.png", "training_curves.png"]
    for p in (run / "plots").glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 1
    # a fidelity CSV written before outcome_match existed still plots (its three metrics)
    old = tmp_path / "old" / "fid_old"
    old.mkdir(parents=True)
    csv_text = (run / "fid" / "fidelity_per_tool.csv").read_text().splitlines()
    cut = [",".join(line.split(",")[:-1]) for line in csv_text]  # outcome_match is the last column
    assert csv_text[0].endswith(",outcome_match") and "outcome_match" not in cut[0]
    (old / "fidelity_per_tool.csv").write_text("\n".join(cut) + "\n")
    assert main(["report", str(tmp_path / "old")]) == 0
    assert (tmp_path / "old" / "plots" / "fidelity_per_tool_fid_old.png").stat().st_size > 1000


class InterruptAfter(ScriptedPolicy):
    """`_rule`'s policy that raises KeyboardInterrupt (a Ctrl-C) on its `n`-th ACT call, and counts contexts."""

    def __init__(self, n=None):
        super().__init__(_rule)
        self.n, self.contexts = n, 0

    def act(self, contexts, **kw):
        if self.n is not None and self.act_calls + 1 >= self.n:
            raise KeyboardInterrupt
        self.contexts += len(contexts)
        return super().act(contexts, **kw)


def _cfg(out, **kw):
    return EvalConfig(
        model="tiny-random",
        suite="scripted",
        split="all",
        limit=2,
        max_new_tokens=6,
        max_steps_per_turn=3,
        min_solvable_fraction=0.0,
        out=str(out),
        **kw,
    )


def test_an_interrupted_eval_keeps_finished_tasks_and_resumes(tmp_path):
    out = tmp_path / "ev"
    # scripted_0 finishes after 2 ACT rounds; the interrupt comes on round 3, with scripted_1 unfinished
    with pytest.raises(KeyboardInterrupt):
        evaluate(_cfg(out), policy=InterruptAfter(3), log=None, progress=False)
    kept = [json.loads(line)["task_id"] for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert kept == ["scripted_0"]
    with open(out / "episodes.jsonl", "a") as f:  # and a line cut by the interruption
        f.write('{"task_id": "scripted_1", "rew')
    with open(out / "transcripts.jsonl", "a") as f:  # killed after scripted_1's transcript, before its episode line
        f.write(json.dumps({"task_id": "scripted_1", "reward": 0.0, "messages": [], "rehearsals": []}) + "\n")
    lines = []
    policy = InterruptAfter()
    result = evaluate(_cfg(out), policy=policy, log=lines.append, progress=False)
    assert any("1 of 2 tasks already done" in line for line in lines)
    assert [e["task_id"] for e in result.episodes] == ["scripted_0", "scripted_1"]
    straight = evaluate(_cfg(tmp_path / "straight"), policy=InterruptAfter(), log=None, progress=False)
    timeless = [{k: v for k, v in e.items() if k != "wall_s"} for e in (result.episodes[0], straight.episodes[0])]
    assert timeless[0] == timeless[1] and result.summary[-1]["accuracy"] == straight.summary[-1]["accuracy"]
    assert policy.contexts == straight.episodes[1]["steps"]  # only scripted_1 was played again
    transcripts = [json.loads(line)["task_id"] for line in (out / "transcripts.jsonl").read_text().splitlines()]
    assert sorted(transcripts) == ["scripted_0", "scripted_1"]  # one each, scripted_0's kept from the first run
    replayed = json.loads((out / "transcripts.jsonl").read_text().splitlines()[-1])
    assert replayed["messages"]  # the stale scripted_1 line went; the one written now is the real episode


def test_an_eval_with_other_settings_refuses_the_folder_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "ev"
    evaluate(_cfg(out, fidelity=True), policy=InterruptAfter(), log=None, progress=False)
    assert (out / "fidelity_per_tool.csv").is_file()
    with pytest.raises(ValueError, match="another evaluation.*fidelity.*--overwrite"):
        evaluate(_cfg(out), policy=InterruptAfter(), log=None, progress=False)
    evaluate(_cfg(out, overwrite=True), policy=InterruptAfter(), log=None, progress=False)
    assert not (out / "fidelity_per_tool.csv").exists() and (out / "summary.csv").is_file()


def test_a_folder_from_before_the_trace_memory_resumes_plainly_and_refuses_other_rehearsal(tmp_path):
    """Folders written before `memory` existed ran the English summary with 3-step attempts; a plain
    evaluation does not depend on either, a test-time rehearsal one does."""
    from agents.evaluation.evaluate import _prepare_out

    out = tmp_path / "e"
    plain = EvalConfig(model="tiny-random", suite="scripted", out=str(out))
    stored = dataclasses.asdict(plain)
    for key in ("out", "min_solvable_fraction", "overwrite", "memory"):
        stored.pop(key)

    def old_run(**changes):
        out.mkdir(exist_ok=True)
        (out / "eval_config.json").write_text(json.dumps({**stored, "attempt_max_steps": 3, **changes}))
        (out / "episodes.jsonl").write_text("")

    old_run()
    assert _prepare_out(out, plain) == ([], [])  # resumes: nothing finished yet, nothing refused
    old_run(rehearsal_n=2)
    rehearsal = dataclasses.replace(plain, rehearsal_n=2)
    with pytest.raises(ValueError, match="differing fields: attempt_max_steps, memory"):
        _prepare_out(out, rehearsal)
    old_run(rehearsal_n=2)
    _prepare_out(out, dataclasses.replace(rehearsal, memory="summary", attempt_max_steps=3))  # what it ran


def test_the_other_task_control_reads_the_next_tasks_recorded_memories(tmp_path):
    from agents.evaluation.evaluate import other_task_memories
    from agents.training.run_folder import read_jsonl

    def rule(ctx):  # one call per user turn, then close it
        after_user = ctx.rsplit("<|im_start|>user", 1)[-1]
        return (
            "done"
            if "<|im_start|>tool" in after_user
            else '<tool_call>{"name": "add", "arguments": {"value": 3}}</tool_call>'
        )

    policy = ScriptedPolicy(rule)
    common = dict(
        model="tiny-random",
        suite="scripted",
        split="all",
        max_new_tokens=6,
        max_steps_per_turn=3,
        rehearsal_n=1,
        memory_tokens=200,
        attempt_max_steps=1,
        min_solvable_fraction=0.0,
    )
    own = tmp_path / "own"
    evaluate(EvalConfig(**common, out=str(own)), policy=policy, log=None)
    recorded = {r["task_id"]: [m["memory"] for m in r["rehearsals"]] for r in read_jsonl(own / "transcripts.jsonl")}
    assert [len(recorded[f"scripted_{i}"]) for i in range(3)] == [1, 2, 3]  # one memory per user turn

    other = tmp_path / "other"
    evaluate(EvalConfig(**common, out=str(other), memory_from=str(own)), policy=policy, log=None)
    for r in read_jsonl(other / "transcripts.jsonl"):
        source = {"scripted_0": "scripted_1", "scripted_1": "scripted_2", "scripted_2": "scripted_0"}[r["task_id"]]
        memories = recorded[source]
        got = [m["memory"] for m in r["rehearsals"]]  # turn t reads the other task's turn-t memory (its last)
        assert got == [memories[min(t, len(memories) - 1)] for t in range(len(got))]
        assert all(m["attempts"] == [] and m["memory_kind"] == "provided" for m in r["rehearsals"])
        assert all(m["generated_tokens"] == 0 for m in r["rehearsals"])  # no attempt ran

    with pytest.raises(ValueError, match="memory_from replaces"):
        EvalConfig(**{**common, "rehearsal_n": 0}, memory_from=str(own))
    with pytest.raises(ValueError, match="has no transcripts.jsonl"):
        EvalConfig(**common, memory_from=str(tmp_path))
    with pytest.raises(ValueError, match="ran with rehearsal_n=1"):  # memories of another N are another control
        EvalConfig(**{**common, "rehearsal_n": 2}, memory_from=str(own))
    with pytest.raises(ValueError, match="attempt_outputs shapes test-time rehearsal"):
        EvalConfig(**{**common, "rehearsal_n": 0}, attempt_outputs="null")
    with pytest.raises(ValueError, match="restate_request repeats the request after a rehearsal memory"):
        EvalConfig(**{**common, "rehearsal_n": 0}, restate_request=True)
    assert EvalConfig(**{**common, "attempt_outputs": "null"}).out.endswith("n1-parallel-null")
    from tests.testing_env import TASKS

    with pytest.raises(ValueError, match="holds no memory for 1 tasks"):
        other_task_memories(own, [*TASKS, dataclasses.replace(TASKS[0], id="scripted_9")])
