"""Plots for runs and evaluations (matplotlib, Agg backend: no display needed), and `report`.

* `plot_accuracy_vs_rehearsal`: overall accuracy against the test-time rehearsal budget N, one line per
  mode (``parallel``, ``sequential``), from ``summary.json`` files written by `agents.evaluation.evaluate`. An N = 0
  run has no mode: it is the first point of both lines.
* `plot_fidelity_per_tool`: bars of the fidelity metrics (`wrappers.fidelity.METRICS`: exact match, JSON-structure
  match, token F1, outcome match) per tool, from a ``fidelity_per_tool.csv``.
* `plot_training_curves`: from a run's ``metrics.jsonl`` (`agents.training.trainer`): reward mean overall and per
  role, ``train/loss``, ``train/clip_fraction``, ``train/approx_kl`` and ``train/kl`` against the step.
* `report(run_dir)`: every plot whose inputs are found under `run_dir` (searched recursively), written to
  ``run_dir/plots/``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = [
    "load_metrics",
    "plot_training_curves",
    "plot_accuracy_vs_rehearsal",
    "plot_fidelity_per_tool",
    "report",
]


def load_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The JSON lines of a ``metrics.jsonl`` (blank or unreadable lines skipped)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


def plot_training_curves(metrics: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Four panels against ``step``: rewards (overall, ACT, REHEARSE), loss, clip fraction, KL.

    Args:
        metrics: `agents.training.trainer` metric dicts (missing keys are skipped).
        path: the PNG to write.

    Raises:
        ValueError: `metrics` is empty.
    """
    if not metrics:
        raise ValueError("no metrics to plot")
    steps = [m.get("step", i + 1) for i, m in enumerate(metrics)]
    panels = [
        ("reward", ["rollout/reward_mean", "rollout/reward_mean/act", "rollout/reward_mean/rehearse"]),
        ("loss", ["train/loss", "train/pg_loss"]),
        ("clip fraction", ["train/clip_fraction"]),
        ("KL", ["train/approx_kl", "train/kl"]),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (title, keys) in zip(axes.flat, panels):
        for k in keys:
            xs = [s for s, m in zip(steps, metrics) if isinstance(m.get(k), (int, float))]
            ys = [m[k] for m in metrics if isinstance(m.get(k), (int, float))]
            if ys:
                ax.plot(xs, ys, marker="o", markersize=3, label=k)
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def _accuracy_points(summaries: Sequence[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    zero = [
        s["overall_accuracy"]
        for s in summaries
        if s["config"].get("rehearsal_n", 0) == 0 and not s["config"].get("fidelity")
    ]
    lines: dict[str, list[tuple[int, float]]] = {}
    for mode in ("parallel", "sequential"):
        pts = [
            (int(s["config"]["rehearsal_n"]), float(s["overall_accuracy"]))
            for s in summaries
            if s["config"].get("rehearsal_n", 0) > 0 and s["config"].get("rehearsal_mode") == mode
        ]
        if zero:
            pts.append((0, float(sum(zero) / len(zero))))
        if pts:
            lines[mode] = sorted(pts)
    return lines


def plot_accuracy_vs_rehearsal(summaries: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Overall accuracy vs rehearsal budget N, one line per mode (module docstring).

    Args:
        summaries: ``summary.json`` documents of `agents.evaluation.evaluate` runs (``--fidelity`` runs are ignored).
        path: the PNG to write.

    Raises:
        ValueError: no non-fidelity summary.
    """
    lines = _accuracy_points(summaries)
    if not lines:
        raise ValueError("no evaluation summaries to plot")
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, pts in lines.items():
        ax.plot([n for n, _ in pts], [a for _, a in pts], marker="o", label=mode)
    ax.set_xlabel("rehearsal attempts per turn (N)")
    ax.set_ylabel("overall accuracy (mean over categories)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xticks(sorted({n for pts in lines.values() for n, _ in pts}))
    ax.legend()
    ax.set_title("Test-time rehearsal")
    fig.tight_layout()
    return _save(fig, path)


def plot_fidelity_per_tool(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Grouped bars of the fidelity metrics (`wrappers.fidelity.METRICS`) per tool (rows of ``fidelity_per_tool.csv``;
    a metric the rows lack, in a CSV written before it existed, is left out).

    Raises:
        ValueError: no rows.
    """
    if not rows:
        raise ValueError("no fidelity rows to plot")
    from wrappers.fidelity import METRICS

    metrics = [m for m in METRICS if m in rows[0]]
    names = [f"{r['group']} ({r['n_calls']})" for r in rows]
    width = 0.8 / len(metrics)
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(rows) + 2), 4))
    for j, m in enumerate(metrics):
        ax.bar([i + j * width for i in range(len(rows))], [float(r[m]) for r in rows], width, label=m)
    ax.set_xticks([i + width * (len(metrics) - 1) / 2 for i in range(len(rows))])  # each group's centre
    ax.set_xticklabels(names, rotation=45, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("mean over calls")
    ax.set_title("Rehearsal fidelity per tool (calls)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def report(run_dir: str | Path) -> list[Path]:
    """Write every applicable plot for `run_dir` into ``run_dir/plots/``; returns the written paths.

    Looks (recursively, outside ``plots/``) for ``metrics.jsonl`` (training curves; the shallowest file),
    ``summary.json`` (accuracy vs N over all of them) and ``fidelity_per_tool.csv`` (one bar plot each,
    named after its folder). Nothing found: returns ``[]``.

    Raises:
        FileNotFoundError: `run_dir` is not a folder.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a folder")
    plots = run_dir / "plots"

    def found(name):
        return sorted(
            (p for p in run_dir.rglob(name) if plots not in p.parents),
            key=lambda p: (len(p.parts), str(p)),
        )

    written = []
    metrics_files = found("metrics.jsonl")
    if metrics_files:
        metrics = load_metrics(metrics_files[0])
        if metrics:
            written.append(plot_training_curves(metrics, plots / "training_curves.png"))
    summaries = []
    for p in found("summary.json"):
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except ValueError:
            continue
        if isinstance(doc, dict) and "config" in doc and "overall_accuracy" in doc:
            summaries.append(doc)
    if _accuracy_points(summaries):
        written.append(plot_accuracy_vs_rehearsal(summaries, plots / "accuracy_vs_rehearsal_n.png"))
    for p in found("fidelity_per_tool.csv"):
        with open(p, newline="", encoding="utf-8") as f:
            rows = [r for r in csv.DictReader(f) if r.get("group") != "all"]
        if rows:
            name = "fidelity_per_tool.png" if p.parent == run_dir else f"fidelity_per_tool_{p.parent.name}.png"
            written.append(plot_fidelity_per_tool(rows, plots / name))
    return written
