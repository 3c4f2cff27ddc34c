"""The project's measured results, rendered into one page: ``docs/results.md``.

Each measuring script writes a ``results.json`` (with its PNGs) into its ``--out`` folder. This command copies
those files into ``docs/results/<kind>/`` (the kind read from the file: ``lab_tiny_sft`` (and its ``_blind`` and
``_steps`` kinds), ``lab_ablations``, ``lab_ablations_budget``, ``lab_grpo_budget_valid``, ``lab_grpo_budget``,
``lab_anchor_valid``, ``lab_env_cost`` (each also with a world infix, ``_blind`` or ``_stated``), ``lab_ttr`` (and its
``_blind``, ``_stated``, ``_memory_tasks``, ``_outcomes`` and ``_rl`` kinds), ``lab_rehearsal_rl`` (and its
``_blind``, ``_stated``, ``_outcomes`` and ``_restated`` kinds), ``judge_agreement``, ``engines_equal_work``) and
renders every stored result into ``docs/results.md``; with no folder given it only re-renders. Numbers appear in the
page only as this command writes them: edit a script or rerun it, never the page.

    python -m benchmarks.results runs/lab_tiny_sft runs/lab_ablations   # store these runs' results and render
    python -m benchmarks.results                                        # render what docs/results/ holds
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
STORE = DOCS / "results"
PAGE = DOCS / "results.md"


MOVED_COMMANDS = {
    "python benchmarks/perf/lab_ablations.py": "python -m benchmarks.experiments.lab_ablations",
    "python -m benchmarks.lab.tiny_sft": "python -m benchmarks.experiments.lab_tiny_sft",
    "python -m benchmarks.perf.lab_grpo_budget": "python -m benchmarks.experiments.lab_grpo_budget",
    "python -m benchmarks.perf.lab_ttr": "python -m benchmarks.experiments.lab_ttr",
}
"""Commands a ``results.json`` recorded before the experiment scripts moved to ``benchmarks/experiments/``, and
the command that starts the same run now (the arguments are unchanged)."""


def current_command(command: str) -> str:
    """`command` as it runs today: a recorded command of a moved script (`MOVED_COMMANDS`) with its arguments,
    so the page never shows a command that no longer runs; any other command as recorded."""
    for old, new in MOVED_COMMANDS.items():
        if command == old or command.startswith(old + " "):
            return new + command[len(old) :]
    return command


def kind_of(result: dict[str, Any]) -> str:
    """The kind of a ``results.json`` (its ``kind`` field, else recognised by its keys).

    Raises:
        ValueError: neither.
    """
    if "kind" in result:
        return str(result["kind"])
    if "teacher_forced_mean" in result:
        return "lab_tiny_sft"
    if "rows" in result and "fidelity" in result:
        return "lab_ablations"
    raise ValueError(f"not a results.json this page knows (keys {sorted(result)[:8]}); give it a 'kind'")


def store(folder: Path, target: Path = STORE) -> Path:
    """Copy ``folder/results.json`` and the PNGs beside it into ``target/<kind>/``, replacing what was there
    only once the copy is complete.

    Raises:
        FileNotFoundError: no ``results.json`` in `folder`.
        ValueError: its kind has no renderer (`RENDERERS`), or `folder` is that stored folder itself.
    """
    import tempfile

    source = Path(folder) / "results.json"
    if not source.is_file():
        raise FileNotFoundError(f"{source} does not exist: run the script that writes it (its --out folder)")
    kind = kind_of(json.loads(source.read_text()))
    if kind not in RENDERERS:
        raise ValueError(f"{source}: kind {kind!r} has no renderer; known kinds: {sorted(RENDERERS)}")
    dest = Path(target) / kind
    if dest.resolve() == Path(folder).resolve():
        raise ValueError(f"{folder} is already the stored copy; give the script's --out folder")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=dest.parent))
    shutil.copy2(source, staging / "results.json")
    for png in Path(folder).glob("*.png"):
        shutil.copy2(png, staging / png.name)
    if dest.exists():
        shutil.rmtree(dest)
    staging.rename(dest)
    return dest


def _ci(mean: float | None, half: float | None, digits: int = 3) -> str:
    if mean is None:
        return "n/a"
    return f"{mean:.{digits}f}" + ("" if half is None else f" ± {half:.{digits}f}")


def _commit(commit: str | None, dirty: bool | None) -> str:
    if not commit:
        return "an unknown commit"
    return f"commit {commit[:7]}" + (" with local changes" if dirty else "")


def _date(result: dict[str, Any]) -> str:
    """`` (date, commit abc1234)`` from a result's `benchmarks.provenance.provenance` fields (what it holds),
    ``written at commit def5678`` when the checkout moved while the run ran, and ``of its stages, 40 ran at
    commit 0123456, 1 ran before stages recorded their commit, ...`` when a resumed job read back stages run
    elsewhere."""
    parts = [result["date"]] if "date" in result else []
    if result.get("commit"):
        parts.append(_commit(result["commit"], result.get("dirty")))
    if result.get("commit_at_write"):  # the checkout moved while the run ran (`benchmarks.provenance`)
        parts.append(f"written at {_commit(result['commit_at_write'], result.get('dirty_at_write'))}")
    stages = result.get("stages")
    if stages:  # a resumed job whose stages ran at other checkouts (or before stages recorded theirs)
        where = [f"{s['stages']} ran at {_commit(s['commit'], s['dirty'])}" for s in stages["ran_at"]]
        if stages["unrecorded"]:
            earlier = stages.get("earlier")
            seen = (
                f", in a folder whose earlier results name {_commit(earlier['commit'], earlier['dirty'])}"
                if earlier
                else ""
            )
            where.append(f"{stages['unrecorded']} ran before stages recorded their commit{seen}")
        ran = "of its stages, " + ", ".join(where)
        parts = [*parts[:-1], f"{parts[-1]}; {ran}"] if parts else [ran]
    return f" ({', '.join(parts)})" if parts else ""


def render_tiny_sft(result: dict[str, Any], folder: Path) -> list[str]:
    """The SFT-from-scratch section (`benchmarks.experiments.lab_tiny_sft`); a run on the blind variant (kind
    ``lab_tiny_sft_blind``) or at another budget than the recipe's (kinds ending ``_steps``) is its own section."""
    s = result["settings"]
    seeds = result["seeds"]
    families = list(seeds[0]["success"])
    command = current_command(result.get("command", "python -m benchmarks.experiments.lab_tiny_sft"))
    lines = [
        "## lab-tiny learns the hidden-rules lab"
        + _world(str(result.get("kind", "")))
        + " by SFT from scratch"
        + (f", {s['steps']} steps" if str(result.get("kind", "")).endswith("_steps") else ""),
        "",
        f"`{command}`{_date(result)}",
        "",
        f"{s['layers']} layers, width {s['hidden']}, {s['heads']} heads"
        + (", mimetic attention initialisation" if s.get("mimetic_init", False) else "")
        + f"; {s['steps']} steps of {s['rows']} "
        f"{'length-bucketed' if s['group_by_length'] else 'shuffled'} rows, lr {s['lr']}"
        + (f" with {s['lr_schedule']} decay" if s.get("lr_schedule", "constant") != "constant" else "")
        + (f", {s['error_demos']} error demonstration(s) per task" if s.get("error_demos") else "")
        + ". Greedy test success on "
        f"the real backend, {seeds[0]['test_tasks']} test tasks, one row per initialisation seed; mean ± the "
        f"half-width of a 95% t-interval over seeds.",
        "",
        "| seed | SFT s | " + " | ".join(families) + " |",
        "|---" * (len(families) + 2) + "|",
    ]
    for r in seeds:
        lines.append(
            f"| {r['seed']} | {r['sft_s']:.0f} | " + " | ".join(f"{r['success'][f]:.3f}" for f in families) + " |"
        )
    mean_s = sum(r["sft_s"] for r in seeds) / len(seeds)
    lines.append(
        f"| mean | {mean_s:.0f} | "
        + " | ".join(_ci(result["mean"][f]["mean"], result["mean"][f]["ci95"]) for f in families)
        + " |"
    )
    copies = result.get("teacher_forced_mean", {})
    if copies:
        lines += [
            "",
            "Teacher-forced accuracy of the target token on test demonstrations, by kind (mean over seeds; an "
            "item by chance 1/24):",
            "",
            "| " + " | ".join(copies) + " |",
            "|---" * len(copies) + "|",
            "| " + " | ".join(_ci(v["mean"], v["ci95"], 2) for v in copies.values()) + " |",
        ]
    one_step = result.get("one_step_fidelity_mean")
    if one_step:
        calls = {g: sum(r.get("one_step_fidelity", {}).get(g, {}).get("outputs", 0) for r in seeds) for g in one_step}
        lines += [
            "",
            "One-step rehearsal fidelity: exact match of the REHEARSE role's greedy output given the real history "
            "up to the call (test demonstrations, each with one mistaken call; mean over seeds, outputs summed). "
            "Error kinds: breaks (a move onto a full shelf), no_box (a label no packed box has), no_item (an "
            "unknown item), repeat (the last move or ship again):",
            "",
            "| " + " | ".join(one_step) + " |",
            "|---" * len(one_step) + "|",
            "| "
            + " | ".join(
                "n/a" if v is None else f"{_ci(v['mean'], v['ci95'])} ({calls[g]})" for g, v in one_step.items()
            )
            + " |",
        ]
    fidelity = result.get("fidelity_mean")
    if fidelity:
        lines += [
            "",
            "Rehearsed-rollout fidelity (exact match of the REHEARSE role's outputs against the real backend's "
            "in rollouts the policy rehearsed, where an error usually follows from an earlier rehearsed output the "
            f"real world contradicts; first {s['fidelity_limit']} test tasks per family; mean over seeds, calls "
            "summed):",
            "",
            "| " + " | ".join(f"{k} outputs" for k in fidelity) + " |",
            "|---" * len(fidelity) + "|",
            "| "
            + " | ".join(
                "n/a"
                if v is None
                else f"{_ci(v['mean'], v['ci95'])} ({sum(r['fidelity'][k]['calls'] for r in seeds)} calls)"
                for k, v in fidelity.items()
            )
            + " |",
        ]
    return lines


def render_ablations(result: dict[str, Any], folder: Path) -> list[str]:
    """The ablation section (`benchmarks.experiments.lab_ablations`): its printed table and its plot."""
    from benchmarks.experiments.ablations_table import comparisons, table

    kind = str(result.get("kind", "lab_ablations"))
    world = _world(kind)
    title = (
        f"The paper's comparisons on the lab{world} at {result['grpo_steps']} GRPO steps, lr {result['grpo']['lr']:g}"
        if kind.startswith("lab_ablations_budget")
        else f"The paper's comparisons on the lab{world}"
    )
    after = []
    if result.get("wall_s", 0) >= 60 and "stage_minutes" in result:  # (a re-read of finished stages takes seconds)
        after += [
            f"Time: the process that wrote these results ran {result['wall_s'] / 60:.0f} min (wall clock, its "
            f"workers included); its stages took {result['stage_minutes']:.0f} min summed over the processes that "
            "ran them (a resumed run's wall clock misses the stages it read back; their time is in the sum).",
        ]
    bullets = comparisons(result)
    if bullets:
        after += [
            *([""] if after else []),
            "Each comparison, paired on the same seeds and test tasks (mean ± the half-width of a 95% t-interval "
            "over seeds; resolved when the interval excludes 0):",
            "",
            *bullets,
        ]
    command = {"command": "python -m benchmarks.experiments.lab_ablations"}  # results written before it was recorded
    return _table_section(title, table(result), command | result, folder, True, after)


def render_grpo_budget(result: dict[str, Any], folder: Path) -> list[str]:
    """The GRPO-budget section (`benchmarks.experiments.lab_grpo_budget`): its printed table and its plot; the
    run on the validation split (kind ``lab_grpo_budget_valid``) is the section that chose the budget, and one with
    world-model anchor arms (kind ``lab_anchor_valid``) the section that chose the anchor's weight, and one whose
    rollouts are all real (kind ``lab_grpo_budget_real``) the section the learning regression test's budget comes
    from."""
    from benchmarks.experiments.result_tables import grpo_budget_table as table

    kind = str(result.get("kind", ""))
    world = _world(kind)
    titles = {
        "lab_anchor_valid": "Choosing the world-model anchor's weight on the validation split",
        "lab_grpo_budget_valid": "Selecting GRPO's learning rate and steps on the validation split",
        "lab_grpo_budget_real": "GRPO with real-backend rollouts against its budget",
    }
    base = next((k for k in titles if kind.startswith(k)), None)
    title = (
        (titles[base] + (f", on the lab{world}" if world else ""))
        if base
        else f"Role-wise GRPO against its budget on the lab{world}"
    )
    if kind == "lab_grpo_budget_real":  # the default world's: tests/benchmarks/lab/test_lab_learning_hidden.py
        title += " (the learning regression test's)"
    return _table_section(title, table(result), result, folder, True)


def _table_section(
    title: str, table: list[str], result: dict[str, Any], folder: Path, plots: bool, after: list[str] | None = None
) -> list[str]:
    """A section of a printed table under its command and date, then the markdown lines `after` (a blank line
    before them), then the folder's PNGs when `plots`."""
    lines = [f"## {title}", "", f"`{current_command(result['command'])}`{_date(result)}", "", "```", *table, "```"]
    lines += ["", *after] if after else []
    for png in sorted(folder.glob("*.png")) if plots else []:
        lines += ["", f"![{png.stem}](results/{folder.name}/{png.name})"]
    return lines


WORLDS = {
    "_blind": "'s blind variant (suite lab-blind: no look tools, so only a rehearsal shows a move break an item)",
    "_stated": "'s stated-rules world (suite lab-stated)",
}
"""What a kind's world infix (``lab_ttr_blind``, ``lab_rehearsal_rl_stated``) adds to its section's title."""


LAB_WORLDS = ("", *WORLDS)
"""The world infixes of the lab experiments' kinds: the default lab (none) and `WORLDS`."""


def _world(kind: str) -> str:
    return next((title for infix, title in WORLDS.items() if infix + "_" in kind + "_"), "")


def render_ttr(result: dict[str, Any], folder: Path) -> list[str]:
    """The test-time rehearsal section (`benchmarks.experiments.lab_ttr`): its printed table and its plot. A run on
    the blind variant (kind ``lab_ttr_blind``), with another number of memory tasks than the script's default
    (kinds with ``_memory_tasks``), with the outcomes memory (``_outcomes``) or with RL continuations (kinds ending
    ``_rl``) is its own section."""
    from benchmarks.experiments.result_tables import ttr_claims, ttr_table

    kind = str(result.get("kind", "lab_ttr"))
    title = "Test-time rehearsal on the lab" + _world(kind)
    if "_memory_tasks" in kind:
        title += f", memory demonstrations of {result['memory_tasks']} train tasks per family and N"
    if kind.removesuffix("_rl").endswith("_outcomes"):
        title += ", outcomes memory (the trace without the attempts' replies)"
    if kind.endswith("_rl"):
        title += f", each policy also after {result['rl_steps']} RL steps"
    return _table_section(title, ttr_table(result), result, folder, True, ttr_claims(result))


def render_rehearsal_rl(result: dict[str, Any], folder: Path) -> list[str]:
    """The rehearsal-aware RL section (`benchmarks.experiments.lab_rehearsal_rl`): its printed table; a run on the blind
    variant (kind ``lab_rehearsal_rl_blind``), with the outcomes memory (``_outcomes``) or with the request restated
    after each memory (``_restated``) is its own section."""
    from benchmarks.experiments.result_tables import rehearsal_rl_table

    kind = str(result.get("kind", ""))
    title = "Rehearsal-aware RL on the lab" + _world(kind)
    if "_outcomes" in kind:
        title += ", outcomes memory (the trace without the attempts' replies)"
    if kind.endswith("_restated"):
        title += ", the request restated after each memory"
    return _table_section(title, rehearsal_rl_table(result), result, folder, plots=False)


def render_env_cost(result: dict[str, Any], folder: Path) -> list[str]:
    """The environment-cost section (`benchmarks.experiments.lab_env_cost`): its printed table and its plot."""
    from benchmarks.experiments.result_tables import env_cost_table

    title = f"Environment cost on the lab{_world(str(result.get('kind', '')))}: what real tool calls in training buy"
    return _table_section(title, env_cost_table(result), result, folder, plots=True)


def render_engines(result: dict[str, Any], folder: Path) -> list[str]:
    """The equal-work engine benchmark (`benchmarks.perf.engines_equal_work`): one row per workload and B."""
    settings = result["settings"]
    lines = [
        "## The HF and vLLM engines on equal work",
        "",
        f"`{current_command(result['command'])}`{_date(result)}",
        "",
        f"The first ACT call of B rollouts (K = {settings['k']} rows per task prompt), {settings['new']} new "
        "tokens per row with EOS ignored, from empty caches, fp32, "
        f"{settings['threads']} torch thread(s) on {settings['cpus']} CPUs. tok/s: B × new tokens over the whole "
        f"call (prefill included); ms/step: one decode step, (t(new) − t(1)) / (new − 1). Medians of "
        f"{settings['repeats']} rounds after an untimed one, the engines interleaved. load: the machine's "
        "1-minute load average before the workload and after the row (other jobs slow both engines).",
        "",
        "| workload (model, prompt tokens) | B | HF tok/s | HF ms/step | vLLM tok/s | vLLM ms/step | vLLM / HF tok/s "
        "| load |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        hf, vllm = r["hf"], r["vllm"]
        lines.append(
            f"| {r['workload']} ({r['model']}, {r['prompt_tokens']:.0f}) | {r['batch']} | {hf['tokens_per_s']:.0f} "
            f"| {hf['ms_per_step']:.1f} | {vllm['tokens_per_s']:.0f} | {vllm['ms_per_step']:.1f} "
            f"| {vllm['tokens_per_s'] / hf['tokens_per_s']:.2f}x | {r['load_before']:.1f} → {r['load_after']:.1f} |"
        )
    return lines


def render_judge_agreement(result: dict[str, Any], folder: Path) -> list[str]:
    """The judge-against-verifier section (`benchmarks.experiments.judge_agreement`): its printed table."""
    from benchmarks.experiments.result_tables import judge_agreement_table as table

    return _table_section("Judge against verifier on the lab", table(result), result, folder, plots=False)


RENDERERS: dict[str, Callable[[dict[str, Any], Path], list[str]]] = {
    "lab_tiny_sft": render_tiny_sft,
    "lab_tiny_sft_steps": render_tiny_sft,
    "lab_tiny_sft_blind": render_tiny_sft,
    "lab_tiny_sft_blind_steps": render_tiny_sft,
    **{
        f"{base}{world}": render_ablations for base in ("lab_ablations", "lab_ablations_budget") for world in LAB_WORLDS
    },
    **{
        f"{base}{world}": render_grpo_budget
        for base in ("lab_grpo_budget_valid", "lab_grpo_budget", "lab_grpo_budget_real", "lab_anchor_valid")
        for world in LAB_WORLDS
    },
    **{
        f"lab_ttr{world}{dose}{memory}{rl}": render_ttr
        for world in LAB_WORLDS
        for memory in ("", "_outcomes")
        for dose in ("", "_memory_tasks")
        for rl in ("", "_rl")
    },
    **{
        f"lab_rehearsal_rl{world}{memory}{restated}": render_rehearsal_rl
        for world in LAB_WORLDS
        for memory in ("", "_outcomes")
        for restated in ("", "_restated")
    },
    **{f"lab_env_cost{world}": render_env_cost for world in LAB_WORLDS},
    "judge_agreement": render_judge_agreement,
    "engines_equal_work": render_engines,
}
"""Section renderers by kind, in page order."""


def render(store_dir: Path = STORE, page: Path = PAGE) -> Path:
    """Write `page` from every ``<store_dir>/<kind>/results.json`` (kinds in `RENDERERS` order)."""
    lines = [
        "# Results",
        "",
        "Generated by `python -m benchmarks.results` from the `results.json` files under `docs/results/`; "
        "do not edit by hand. Each section names the command that measured it.",
        "",
    ]
    found = 0
    for kind, renderer in RENDERERS.items():
        source = store_dir / kind / "results.json"
        if source.is_file():
            lines += renderer(json.loads(source.read_text()), source.parent) + [""]
            found += 1
    if not found:
        lines += [
            "No result is stored yet: run a measuring script, then `python -m benchmarks.results <its --out>`.",
            "",
        ]
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("\n".join(lines))
    return page


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "folders", nargs="*", type=Path, help="--out folders of measuring scripts (each with a results.json)"
    )
    args = ap.parse_args(argv)
    for folder in args.folders:
        print(f"[results] stored {store(folder)}")
    page = render()
    print(f"[results] rendered {page}")
    return page


if __name__ == "__main__":
    main()
