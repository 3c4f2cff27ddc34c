"""The printed table of the lab ablations' ``results.json`` (`benchmarks.experiments.lab_ablations` prints it
after every seed; `benchmarks.results` puts it on the results page).

A helper module, not a script: both import it instead of one importing the other.
"""

from __future__ import annotations

from typing import Any

from benchmarks.experiments.result_tables import claim_verdict
from benchmarks.stats import plus_minus

__all__ = ["FIDELITY_METRICS", "PAPER_COMPARISONS", "comparisons", "table"]

FIDELITY_METRICS = ("exact_match", "json_structure_match", "token_f1")
"""The rehearsal fidelity metrics the ablations report, before and after GRPO."""

PAPER_COMPARISONS: tuple[tuple[str, str, str, int], ...] = (
    ("grpo", "Role-wise GRPO beats plain GRPO", "paper: τ² 31.2 plain → 36.7 role-wise", -1),
    ("per_role", "One shared model beats a model per role", "paper: τ² 35.5 per role → 36.7 shared", -1),
    (
        "real_rollouts",
        "Training on rehearsed rollouts reaches training on real ones, without real tool calls in the loop",
        "paper: rehearsal training matches real-rollout training",
        0,
    ),
    (
        "null_rehearser",
        "The world model is what helps: rehearsed outputs replaced by a constant do worse",
        "control; the paper's mechanism predicts role_grpo ahead",
        -1,
    ),
    (
        "role_grpo_act_only",
        "The policy gradient on REHEARSE tokens helps: REHEARSE advantages set to 0 do worse",
        "control; the paper's mechanism predicts role_grpo ahead",
        -1,
    ),
    *(
        (
            name,
            "A world model anchored to real outputs (the world-model loss on real demonstrations, errors included, "
            f"at weight {weight}) makes rehearsed GRPO do better",
            "this project's test of the reading that the outcome reward makes the world model optimistic; "
            "predicted: the anchored row ahead",
            1,
        )
        for name, weight in (("role_grpo_wm_demos", "1"), ("role_grpo_wm_demos_w0.1", "0.1, chosen on validation"))
    ),
    (
        "warm start (SFT, pre-RL)",
        "Role-wise GRPO improves on its warm start",
        "paper: RL gains over SFT; one warm start, so the interval is over the GRPO seeds trained from it",
        -1,
    ),
    (
        "told: role_grpo",
        "Rules told in the prompt help: the gap is what a world model learned from outputs would have to make up",
        "expected: told rules ahead; each world has one warm start, so the interval is over GRPO seeds, not over SFT "
        "runs",
        1,
    ),
)
"""The comparisons `comparisons` reads: (row paired with ``role_grpo``, the claim, its source or expectation, the
sign of row − ``role_grpo`` the claim predicts: −1 ``role_grpo`` ahead, +1 the row ahead, 0 no difference,
where only the row resolved ahead contradicts the claim: ``role_grpo`` reaches it)."""


def table(results: dict[str, Any]) -> list[str]:
    """The printed table: one line per row of `results` (`run`'s; the told rows, where run, among them), then the
    notes and the fidelity lines (before and after GRPO: the hidden world's warm start and ``role_grpo``)."""
    done = results.get("seeds_done", results["seeds"])
    progress = "" if done == results["seeds"] else f" (PARTIAL: {done} of {results['seeds']} seeds done)"
    lines = [
        f"EnvACE-Lab ablations: {results['model']}, {done} seeds, {results['grpo_steps']} GRPO steps "
        f"(B={results['grpo']['batch_tasks']}, K={results['grpo']['group_size']}), {results['test_tasks']} test tasks, "
        f"success on the real backend, mean +- 95% CI over seeds{progress}",
        f"{'row':<40} {'success':<15} {'vs role_grpo':>15} {'tasks +/-':>9} {'real calls':>10} {'replays':>8} "
        f"{'seconds':>8} {'fid ord':>7} {'fid err':>7}",
    ]
    one_step = any((row.get("fidelity") or {}).get("one-step error exact") is not None for row in results["rows"])
    if one_step:  # measured since the pipeline's fidelity stages score it: older results have no such columns
        lines[-1] += f" {'1-step ord':>10} {'1-step err':>10}"
    for row in results["rows"]:
        s = row["success"]
        success = f"{s['mean']:.3f}" + ("" if s["ci95"] is None else f" +- {s['ci95']:.3f}")
        diff = (
            ""
            if "diff_mean" not in s
            else (f"{s['diff_mean']:+.3f}" + ("" if s["diff_ci95"] is None else f" +- {s['diff_ci95']:.3f}"))
        )
        paired = f"+{row['paired_tasks']['gained']}/-{row['paired_tasks']['lost']}" if "paired_tasks" in row else ""
        calls = "" if row.get("real_tool_calls") is None else f"{row['real_tool_calls']:.0f}"
        replays = "" if row.get("verifier_replay_calls") is None else f"{row['verifier_replay_calls']:.0f}"
        secs = f"{row['wall_s']:.0f}" if "wall_s" in row else ""
        fid = row.get("fidelity") or {}
        ordinary, error, one_ordinary, one_error = (
            ("" if fid.get(k) is None else f"{fid[k]:.3f}")
            for k in ("ordinary exact", "error exact", "one-step ordinary exact", "one-step error exact")
        )
        lines.append(
            f"{row['row']:<40} {success:<15} {diff:>15} {paired:>9} {calls:>10} {replays:>8} {secs:>8} "
            f"{ordinary:>7} {error:>7}" + (f" {one_ordinary:>10} {one_error:>10}" if one_step else "")
        )
    lines.append(
        "tasks +/-: the test tasks the row solved that role_grpo did not / that role_grpo solved and the row "
        "did not, summed over seeds; a success without +- is one model's (a warm start serves every seed)"
        + ("; one seed: no interval over seeds (no +-)" if done < 2 else "")
    )
    lines.append(
        "real calls: executions on the real backend in training per run (warm start: its demonstrations' reference "
        "calls; world-model anchor rows: their demonstrations' calls, reference and mistaken); replays: the "
        "verifier's replays of the rollouts' calls to score them"
    )
    if any(row["row"].startswith("told: ") for row in results["rows"]):
        lines.append(
            f"told: rows on suite {results.get('told_suite') or 'lab-told'} (the same test tasks, each prompt also "
            "telling the rules' facts of the task's initial state), from their own warm start; vs role_grpo and "
            "tasks +/- pair them with the hidden world's role_grpo (same seed, same task ids)"
        )
    if results.get("fidelity_tasks"):
        lines.append(
            f"fid ord / fid err: rehearsal fidelity, exact match on ordinary / error tool outputs of rehearsed "
            f"rollouts, mean over seeds, on {results['fidelity_tasks']} test tasks"
            + (
                "; 1-step ord / err: each real output of their demonstrations (one mistaken call each) predicted "
                "from the real history"
                if one_step
                else ""
            )
        )
    where = [(row["row"], row["where_failed"]) for row in results["rows"] if row.get("where_failed")]
    if where:
        lines.append(
            "failed test episodes by where they first left the reference solution (mean per seed; envace failures): "
            "at call 1 (before any tool output) / at a later call / elsewhere (stopped early, extra call, no call)"
        )
        lines += [
            f"  {name:<38} {w['failed']:>6.1f} failed: {w['at call 1']:>6.1f} / {w['at a later call']:>6.1f} / "
            f"{w['other']:>5.1f}"
            for name, w in where
        ]
    rewards = [(row["row"], row["train_reward"]) for row in results["rows"] if row.get("train_reward")]
    if rewards:
        lines.append(
            "training rollouts' mean reward (the rehearsed world's, unless the row's rollouts are real), mean per "
            "seed: first 5 steps -> last 5 steps (all steps)"
        )
        lines += [f"  {name:<38} {r['first']:.3f} -> {r['last']:.3f} ({r['mean']:.3f})" for name, r in rewards]
    before, after = results["fidelity"]["before"], results["fidelity"]["after"]
    for m in FIDELITY_METRICS:
        b = "n/a" if before[m] is None else f"{before[m]:.3f}"
        a = after[m]
        lines.append(
            f"fidelity {m:<21} before GRPO {b:>6}   after {plus_minus(a['mean'], a['ci95'])}"
            if a["n"]
            else f"fidelity {m:<21} before GRPO {b:>6}   after n/a"
        )
    return lines


def comparisons(results: dict[str, Any]) -> list[str]:
    """One markdown bullet per `PAPER_COMPARISONS` entry whose row is in `results`: the paired difference
    ``role_grpo`` − row (mean and 95% t-interval over seeds, tasks gained and lost summed over seeds) and what it
    says about the claim: resolved (the interval excludes 0) in or against the claim's direction, or not resolved.
    A claim of no difference (sign 0, "reaches") is contradicted only by the row resolved ahead; not resolving
    a difference is not shown equality, so the sentence names how far ahead the row may still be.
    Rows absent from `results` (arms not run) are left out."""
    rows = {row["row"]: row for row in results["rows"]}
    lines = []
    for name, claim, source, sign in PAPER_COMPARISONS:
        row = rows.get(name)
        if row is None or "diff_mean" not in row["success"] or "role_grpo" not in rows:
            continue
        d, h = -row["success"]["diff_mean"], row["success"]["diff_ci95"]  # role_grpo - row
        seeds = rows["role_grpo"]["success"]["n"]
        paired = row.get("paired_tasks") or {}
        tasks = (
            f"; test tasks only role_grpo solved / only {name} solved, summed over {seeds} seed"
            f"{'s' if seeds != 1 else ''}: {paired.get('lost')} / {paired.get('gained')}"
        )
        interval = "" if h is None else f" +- {h:.3f}"
        measured = f"role_grpo − {name}: {d:+.3f}{interval}{tasks if paired else ''}"
        verdict = claim_verdict(d, h, -sign, "role_grpo", name)
        # (not str.capitalize: it would lower-case the rest, row names such as "SFT" included)
        lines.append(f"- **{claim}** ({source}). Here {measured}. {verdict[0].upper()}{verdict[1:]}.")
    return lines
