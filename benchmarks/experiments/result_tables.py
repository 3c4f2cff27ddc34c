"""The printed tables of the lab's budget, test-time rehearsal, rehearsal-aware RL and environment-cost experiments
and of the judge-against-verifier agreement, shared by their scripts and the results page (`benchmarks.results`),
which may not import a script."""

from __future__ import annotations

import textwrap
from typing import Any

__all__ = [
    "claim_verdict",
    "grpo_budget_table",
    "ttr_claims",
    "ttr_table",
    "rehearsal_rl_table",
    "env_cost_table",
    "judge_agreement_table",
    "format_matrix",
]


def _fmt(mean: float | None, half: float | None, signed: bool = False, digits: int = 3) -> str:
    if mean is None:
        return "n/a"
    text = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    return text + ("" if half is None else f" +- {half:.{digits}f}")


def claim_verdict(diff: float, half: float | None, sign: int, first: str, second: str) -> str:
    """What a paired difference ``first − second`` (`diff`, with `half` the half-width of its 95% t-interval over
    seeds, None for one seed) says about a claim that predicts its sign: +1 `first` ahead, -1 `second` ahead, 0
    no difference (`first` reaches `second`). Resolved when the interval excludes 0. A claim of no difference is
    contradicted only by `second` resolved ahead; not resolving a difference is not shown equality, so the
    sentence names how far ahead `second` may still be."""
    if half is None:
        return "one seed: no interval, not resolved"
    if abs(diff) <= half:
        return "not resolved (the 95% interval includes 0)" + (
            f", consistent with the claim, though {second} may be ahead by up to {half - diff:.3f}" if sign == 0 else ""
        )
    if sign == 0:
        return (
            f"resolved: {first} ahead, so it reaches {second} and more (the claim predicts no difference)"
            if diff > 0
            else f"resolved: {second} ahead, against the claim"
        )
    ahead = first if diff > 0 else second
    return f"resolved: {ahead} ahead, " + ("as claimed" if (diff > 0) == (sign > 0) else "against the claim")


def split_name(split: str) -> str:
    """How a table or a plot names an evaluated split (``valid``: ``validation``)."""
    return {"valid": "validation"}.get(split, split)


def grpo_budget_table(results: dict[str, Any]) -> list[str]:
    """`benchmarks.experiments.lab_grpo_budget`'s printed (and rendered) table: one row per arm and checkpoint."""
    done = results.get("seeds_done", results["seeds"])
    g = results["grpo"]
    partial = f" (PARTIAL: {done} of {results['seeds']} seeds done)" if done < results["seeds"] else ""
    lr = f"lr {g['lr']}" if g.get("lr") is not None else "lr " + " / ".join(f"{x:g}" for x in g["lrs"])
    width = max([16, *(len(arm) for arm in results["arms"])])
    lines = [
        f"GRPO budget on EnvACE-Lab: {results['model']}, {done} seeds, B={g['batch_tasks']} x K={g['group_size']}, "
        f"{lr}, {results['test_tasks']} {split_name(results.get('split', 'test'))} tasks{partial}",
        f"warm start (SFT): {results['warm_success']:.3f}",
        f"{'arm':<{width}} {'step':>5}  {'success':<16} {'vs warm start':<17} {'tasks +/-':<11} resolved seeds",
    ]
    for arm, row in results["arms"].items():
        n = len(row["seeds"])
        for step, c in row["checkpoints"].items():
            lines.append(
                f"{arm:<{width}} {step:>5}  {_fmt(c['mean'], c['ci95']):<16} "
                f"{_fmt(c['diff_mean'], c['diff_ci95'], signed=True):<17} "
                f"{'+' + str(c['gained']) + '/-' + str(c['lost']):<11} {c['resolved_seeds']}/{n}"
            )
    if str(results.get("kind", "")).startswith("lab_anchor_valid"):  # on any lab world
        lines += ["", *textwrap.wrap(anchor_choice(results), 116)]
    elif results.get("split") == "valid":
        lines += ["", *textwrap.wrap(budget_choice(results), 116)]
    return lines


def anchor_choice(results: dict[str, Any], reference: str = "role_grpo") -> str:
    """The world-model anchor weight a validation run (`benchmarks.experiments.lab_grpo_budget`, kind
    ``lab_anchor_valid``) chooses to test, by a rule fixed before the run: among the rows with a world-model weight
    > 0, the largest mean validation success at the last checkpoint (ties: the smaller weight). It only picks which
    anchor the test split then measures, so no interval is required; the sentence gives the chosen row's mean
    difference to `reference` at that checkpoint and the same learning rate (the same warm start, seeds and tasks).
    Before every seed is in, nothing is chosen."""
    done = results.get("seeds_done", results["seeds"])
    if done < results["seeds"]:
        return f"No choice yet: {done} of {results['seeds']} seeds are in."
    last = str(results["steps"])
    anchors = [
        (row["checkpoints"][last]["mean"], -row["world_model_loss_weight"], name)
        for name, row in results["arms"].items()
        if row.get("world_model_loss_weight", 0.0) > 0 and last in row["checkpoints"]
    ]
    if not anchors:
        return f"No world-model anchor row with a checkpoint at step {last}: nothing to choose."
    mean, weight, name = max(anchors)
    lr = results["arms"][name].get("lr")
    refs = [
        row
        for n, row in results["arms"].items()
        if row.get("arm", n.split(" lr=")[0]) == reference and row.get("lr") == lr
    ]
    versus = ""
    if refs and last in refs[0]["checkpoints"]:
        versus = f", {mean - refs[0]['checkpoints'][last]['mean']:+.3f} against {reference} at the same lr"
    return (
        f"Chosen by the rule fixed before the run (largest mean validation success at step {last} among the anchor "
        f"weights): {name}, weight {-weight:g}: {mean:.3f}{versus}. The test split measures this arm."
    )


def budget_choice(results: dict[str, Any], arm: str = "role_grpo") -> str:
    """The budget a validation run (`benchmarks.experiments.lab_grpo_budget` ``--split valid``) chooses for `arm`,
    by a rule fixed before any run: among `arm`'s rows (one per learning rate) and checkpoints, the largest mean
    paired gain over the warm start whose 95% interval lies above 0 (ties: fewer steps, then the lower lr); when
    no interval lies above 0, nothing is chosen and the sentence names the largest mean difference instead.
    Before every seed is in, nothing is chosen either."""
    done = results.get("seeds_done", results["seeds"])
    if done < results["seeds"]:
        return f"No choice yet: {done} of {results['seeds']} seeds are in."
    cells = [
        (round(c["diff_mean"], 9), c["diff_ci95"], int(step), row.get("lr"), name)
        for name, row in results["arms"].items()
        if row.get("arm", name.split(" lr=")[0]) == arm
        for step, c in row["checkpoints"].items()
        if c.get("diff_ci95") is not None
    ]
    if not cells:
        return f"No {arm} checkpoint with an interval (one seed, or no {arm} row): nothing to choose."
    resolved = [c for c in cells if c[0] - c[1] > 0]
    pool = resolved or cells
    best = max(pool, key=lambda c: (c[0], -c[2], -(c[3] or 0.0)))
    where = f"{best[4]} at {best[2]} steps: {_fmt(best[0], best[1], signed=True)} over the warm start"
    if resolved:
        return (
            f"Chosen by the rule fixed before the run (largest validation gain whose interval lies above 0): {where}."
        )
    return (
        f"Nothing chosen: no {arm} learning rate and step count here beats the warm start on the validation split "
        f"(no interval lies above 0). The largest mean difference is {where}."
    )


def _ttr_training(results: dict[str, Any]) -> str:
    """How `ttr_table`'s policies past the warm start were trained: the kinds its rows hold."""
    policies = [r["policy"] for r in results["rows"]]
    kinds = []
    if any(p.endswith("_sft") for p in policies):
        kinds.append(f"continuations (*_sft): {results['sft_steps']} SFT steps")
    if any(p.endswith("_scratch") for p in policies):
        kinds.append(f"from scratch (*_scratch): the recipe's SFT, {results['scratch_steps']} steps")
    if results.get("rl_steps"):
        kinds.append(
            f"RL continuations (*_rl): {results['rl_steps']} role-wise GRPO steps, a memory-trained policy's rollouts "
            f"rehearsing {results['rl_n']} attempts first"
        )
    return "; ".join(kinds) or "no training past the warm start"


FAMILY_SETTINGS = ("N=2", "N=2, real outputs (oracle)")
"""The test-time rehearsal rows `ttr_table` also splits by task family: the paper's setting and the oracle memory."""


def ttr_table(results: dict[str, Any]) -> list[str]:
    """`benchmarks.experiments.lab_ttr`'s printed (and rendered) table: one row per policy and setting."""
    done = results.get("seeds_done", results["seeds"])
    partial = f" (PARTIAL: {done} of {results['seeds']} seeds done)" if done < results["seeds"] else ""
    others = results.get("other_memory_demos") or {}
    if "real_memory_demos" in results:  # written before the sets were named by their folders
        others = {"memory_demos_real": results["real_memory_demos"]}
    # the memory demonstration sets the run recorded, by folder (only those its policies train on)
    sets = ({"memory_demos": results["memory_demos"]} if results["memory_demos"] or not others else {}) | others
    counts = [(name, sum(f["written"] for f in files.values())) for name, files in sets.items()]
    demos = counts[0][1] or "no"  # (no policy of the run trains on a memory)
    extra = "".join(f", {n} in {name}" for name, n in counts[1:])
    extra = f" in {counts[0][0]}{extra}" if len(counts) > 1 or counts[0][0] != "memory_demos" else ""
    w = max([14, *(len(r["policy"]) for r in results["rows"])])
    layout = "" if results.get("memory", "trace") == "trace" else f"; {results['memory']} memory (no reply lines)"
    lines = [
        f"Test-time rehearsal on EnvACE-Lab: {results['model']}, {done} seeds, {results['test_tasks']} test tasks; "
        f"{_ttr_training(results)}; {demos} memory demonstrations{extra}{layout}{partial}",
        "paired with the same policy at N=0 (mean +- 95% CI over seeds); tasks +/- summed over seeds; seeds p<.05: "
        "the seeds whose own tasks resolve the difference up/down (exact McNemar)",
        f"{'policy':<{w}} {'setting':<34} {'success':<16} {'vs N=0':<17} {'tasks +/-':<11} {'seeds p<.05':<12} "
        "rehearsal tokens/task",
    ]
    for r in results["rows"]:
        vs = "" if r["setting"] == "N=0" else _fmt(r["diff_mean"], r["diff_ci95"], signed=True)
        counts = "" if r["setting"] == "N=0" else f"+{r['gained']}/-{r['lost']}"
        p = "" if r["setting"] == "N=0" else f"+{r['resolved_up']}/-{r['resolved_down']}"
        lines.append(
            f"{r['policy']:<{w}} {r['setting']:<34} {_fmt(r['mean'], r['ci95']):<16} {vs:<17} {counts:<11} {p:<12} "
            f"{r['tokens_per_task']:.0f}"
        )
    used = [r for r in results["rows"] if r.get("memory_use")]
    if used:
        lines += [
            "",
            "reading the memory: each row's rehearsed tasks (with calls in their reference) split by how many attempts "
            "made the reference's calls (all: the memory shows only the right calls, a reader can copy them), each "
            "part paired with N=0 on the same tasks; share: of the rehearsed tasks",
            f"{'policy':<{w}} {'setting':<34} {'attempts':<9} {'share':<6} {'success':<16} {'vs N=0':<17} tasks +/-",
        ]
        for r in used:
            for part, use in r["memory_use"].items():
                share = sum(use["share"]) / len(use["share"])
                head = f"{r['policy']:<{w}} {r['setting']:<34} {part:<9} {share:<6.2f}"
                if "mean" not in use:  # some seed had no such task
                    lines.append(f"{head} -")
                    continue
                diff = _fmt(use["diff_mean"], use["diff_ci95"], signed=True)
                lines.append(f"{head} {_fmt(use['mean'], use['ci95']):<16} {diff:<17} +{use['gained']}/-{use['lost']}")
    split = [r for r in results["rows"] if r.get("by_family") and r["setting"] in FAMILY_SETTINGS]
    if split:
        families = list(split[0]["by_family"])
        lines += [
            "",
            "by task family: the row against the same policy at N=0 on that family's tasks (mean +- 95% CI over seeds)",
            f"{'policy':<{w}} {'setting':<27} " + " ".join(f"{f:<13}" for f in families),
        ]
        for r in split:
            cells = [
                _fmt(c["diff_mean"], c["diff_ci95"], signed=True, digits=2) for c in map(r["by_family"].get, families)
            ]
            lines.append(f"{r['policy']:<{w}} {r['setting']:<27} " + " ".join(f"{c:<13}" for c in cells))
    if results.get("memory_cost"):
        lines += [
            "",
            "what memory training costs without rehearsal: N=0, paired with the same training without memories",
        ]
        pairs = [c["policy"] + " - " + c["reference"] for c in results["memory_cost"]]
        width = max(w + 17, *(len(p) for p in pairs))
        for c, pair in zip(results["memory_cost"], pairs):
            lines.append(
                f"  {pair:<{width}} {_fmt(c['diff_mean'], c['diff_ci95'], signed=True):<17} "
                f"tasks +{c['gained']}/-{c['lost']}, seeds p<.05 +{c['resolved_up']}/-{c['resolved_down']}"
            )
    return lines


def ttr_claims(results: dict[str, Any]) -> list[str]:
    """One markdown bullet per paper claim or control of `benchmarks.experiments.lab_ttr.TTR_CLAIMS` that the run
    measured (its ``claims``), with one nested bullet per policy: the paired difference (mean and 95% t-interval over
    seeds, tasks gained and lost summed over seeds, the seeds whose own tasks resolve it) and its verdict
    (`claim_verdict`), under a paragraph that says how many would resolve by chance. Results written before claims
    were recorded give none."""
    claims = results.get("claims", [])
    if not claims:
        return []
    tests = sum(len(c["policies"]) for c in claims)
    lines = [
        "The paper's claims and the controls, each a paired difference between two settings of the same policy on the "
        "same seeds and test tasks: mean +- the half-width of a 95% t-interval over seeds, resolved when the interval "
        "excludes 0; tasks: gained / lost, summed over seeds; seeds p<.05: the seeds whose own tasks resolve it up / "
        "down (exact McNemar). At 95%, about one comparison in 20 resolves by chance where nothing differs, and there "
        f"are {tests} here: one resolved comparison is weak evidence; a claim resolved for every policy is stronger. "
        "A claim whose settings the run did not measure (N=3 without --n 3) is left out.",
        "",
    ]
    for c in claims:
        lines.append(f"- **{c['claim']}** ({c['source']}):")
        for p in c["policies"]:
            verdict = claim_verdict(p["diff_mean"], p["diff_ci95"], c["sign"], c["setting"], p["reference"])
            lines.append(
                f"    - {p['policy']}: `{c['setting']}` − `{p['reference']}`: "
                f"{_fmt(p['diff_mean'], p['diff_ci95'], signed=True)} (tasks +{p['gained']}/-{p['lost']}; seeds "
                f"p<.05 +{p['resolved_up']}/-{p['resolved_down']}): {verdict}."
            )
    return lines


def rehearsal_rl_table(results: dict[str, Any]) -> list[str]:
    """`benchmarks.experiments.lab_rehearsal_rl`'s printed (and rendered) table: one row per policy and N."""
    done = results.get("seeds_done", results["seeds"])
    g = results["grpo"]
    partial = f" (PARTIAL: {done} of {results['seeds']} seeds done)" if done < results["seeds"] else ""
    layout = "" if results.get("memory", "trace") == "trace" else f", {results['memory']} memory (no reply lines)"
    layout += ", the request restated after each memory" if results.get("restate_request") else ""
    lines = [
        f"Rehearsal-aware RL on EnvACE-Lab: {results['model']}, {done} seeds, {results['test_tasks']} test tasks; "
        f"GRPO B={g['batch_tasks']} x K={g['group_size']}, lr {g['lr']}, N={results['n']} attempts{layout}{partial}",
        f"paired with {results['reference']} at the same N (mean +- 95% CI over seeds); tasks +/- summed over seeds; "
        "seeds p<.05: the seeds whose own tasks resolve the difference up/down (exact McNemar)",
        f"{'policy':<23} {'N':<4} {'success':<16} {'vs ' + results['reference']:<34} {'tasks +/-':<11} "
        f"{'seeds p<.05':<12} {'train steps':<12} {'train tokens (k)':<17} eval rehearsal tokens/task",
    ]
    for r in results["rows"]:
        ref = r["policy"] == results["reference"]
        vs = "" if ref else _fmt(r["diff_mean"], r["diff_ci95"], signed=True)
        counts = "" if ref else f"+{r['gained']}/-{r['lost']}"
        p = "" if ref else f"+{r['resolved_up']}/-{r['resolved_down']}"
        steps = "/".join(str(s) for s in r["train_steps"]) or "-"
        tokens = "/".join(f"{t / 1000:.0f}" for t in r["train_generated_tokens"]) or "-"
        lines.append(
            f"{r['policy']:<23} {r['setting'][2:]:<4} {_fmt(r['mean'], r['ci95']):<16} {vs:<34} {counts:<11} {p:<12} "
            f"{steps:<12} {tokens:<17} {r['tokens_per_task']:.0f}"
        )
    return lines


def env_cost_table(results: dict[str, Any]) -> list[str]:
    """`benchmarks.experiments.lab_env_cost`'s printed (and rendered) table: the warm start, then one row per arm."""
    done = results.get("seeds_done", results["seeds"])
    g = results["grpo"]
    partial = f" (PARTIAL: {done} of {results['seeds']} seeds done)" if done < results["seeds"] else ""
    fidelity = f" on {results['fidelity_tasks']} test tasks" if results.get("fidelity_tasks") else ""
    lines = [
        f"Environment cost on EnvACE-Lab: {results['model']}, {done} seeds, {results['grpo_steps']} GRPO steps "
        f"(B={g['batch_tasks']} x K={g['group_size']}, lr {g['lr']}), hybrid rollouts (p: share of tool calls answered "
        f"by the real backend), world-model loss weight {results['world_model_weight']:g} where on, "
        f"{results['test_tasks']} test tasks{partial}",
        "success on the real backend, mean +- 95% CI over seeds; vs p=0: paired by seed (same CI); tasks +/-: gained / "
        "lost against p=0, summed over seeds; real calls: executions on the real backend in training per run (the "
        "catch-up of rehearsed calls included); real answers: calls answered by the backend per run; fid ord / err: "
        f"rehearsal fidelity, exact match on ordinary / error outputs{fidelity}; seconds: training + evaluation per "
        "run",
        f"{'arm':<20} {'p':>5} {'wm':>3} {'success':<16} {'vs p=0':<17} {'tasks +/-':<11} {'real calls':>10} "
        f"{'real answers':>12} {'fid ord':>7} {'fid err':>7} {'seconds':>7}",
    ]

    def fid(value: float | None) -> str:
        return "" if value is None else f"{value:.3f}"

    warm = results["warm_start"]
    lines.append(
        f"{'warm start (SFT)':<20} {'':>5} {'':>3} {warm['success']:<16.3f} {'':<17} {'':<11} {'':>10} {'':>12} "
        f"{fid(warm['fidelity']['ordinary exact']):>7} {fid(warm['fidelity']['error exact']):>7} "
        f"{warm['seconds']:>7.0f}"
    )
    for r in results["rows"]:
        reference = r["real_call_prob"] == 0 and not r["world_model_loss_weight"]
        vs = "" if reference else _fmt(r["diff_mean"], r["diff_ci95"], signed=True)
        counts = "" if reference else f"+{r['gained']}/-{r['lost']}"
        lines.append(
            f"{r['arm']:<20} {r['real_call_prob']:>5g} {r['world_model_loss_weight']:>3g} "
            f"{_fmt(r['mean'], r['ci95']):<16} {vs:<17} {counts:<11} {r['real_tool_calls']:>10.0f} "
            f"{r['real_answers']:>12.0f} {fid(r['fidelity']['ordinary exact']):>7} "
            f"{fid(r['fidelity']['error exact']):>7} {r['seconds']:>7.0f}"
        )
    return lines


def format_matrix(c: dict[str, Any]) -> str:
    """The verifier-by-judge confusion matrix of `benchmarks.experiments.judge_agreement.confusion`, with agreement
    and Cohen's kappa."""
    rows = [
        "                    judge pass   judge fail",
        f"verifier pass     {c['both_pass']:>10}   {c['verifier_only']:>10}",
        f"verifier fail     {c['judge_only']:>10}   {c['both_fail']:>10}",
    ]
    kappa = "undefined" if c["kappa"] is None else f"{c['kappa']:.2f}"
    return "\n".join(rows) + f"\nagreement {c['agreement']:.2f}, Cohen's kappa {kappa}"


def judge_agreement_table(report: dict[str, Any]) -> list[str]:
    """`benchmarks.experiments.judge_agreement`'s printed result (and the results page's section): who played and
    judged, the confusion matrix, the judge's mean R per verifier class and its prompt and verdict counts."""
    mean = {k: "n/a" if v is None else f"{v:.2f}" for k, v in report["judge_mean_reward"].items()}
    stats = report["judge_stats"]
    prefix = "" if report["judge_prefix"] is None else f"; reply prefix {report['judge_prefix']!r}"
    return [
        f"{report['episodes']} {report['suite']} {report['split']} episodes played by {report['policy']!r}, judged "
        f"by {report['judge']!r} (pass: R >= {report['threshold']}{prefix})",
        format_matrix(report["confusion"]),
        f"judge mean R: {mean['verifier_pass']} on verifier passes, {mean['verifier_fail']} on verifier fails",
        f"judge: {stats['prompts']} prompts, {stats['generated']} generated, {stats['cache_hits']} cache hits, "
        f"{stats['verdicts']} verdicts, {stats['unparseable']} unparseable (scored {report['unparseable_score']}); "
        f"{report['total_s']} s",
    ]
