"""Where a measured result comes from: the date and the code it ran on, recorded in every ``results.json``.

A results file names the command that measured it; the command's outcome also depends on the code and the
recipes at the time (a recipe's SFT settings, a world's mistakes), so the page (`benchmarks.results`) shows the
commit beside the date, and whether the working tree had uncommitted changes then.

Which commit: the one checked out when the process started (when it imported this module, as every measuring
script does at its top), since that is the code it runs; a run of hours writes its ``results.json`` long after,
when ``HEAD`` may have moved on. When the checkout at write time differs, it is recorded too
(``commit_at_write``, ``dirty_at_write``), so a result never names only a commit it did not run on. A job that
resumes (`agents.pipeline.StageRunner`) reads back stages that earlier processes ran, perhaps at other commits:
each stage of an experiment records the checkout it ran at (the runner's ``stamp``), and when they are not all
this process's checkout the result lists them (``stages``). Stages from before they recorded it are counted, and
the commit named by the folder's previous ``results.json`` is kept beside them.
"""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["provenance", "stamp", "mark_start"]

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):  # no git, not a checkout (an installed copy), a git error
        return None
    return done.stdout.strip()


def _checkout() -> tuple[str | None, bool | None]:
    """(``HEAD``, whether the tree differs from it: changed tracked files or new files git does not ignore), both
    None outside a git checkout."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain") if commit else None  # ignored files (runs/) do not count
    return commit, None if status is None else bool(status)


_started: dict[Path, tuple[str | None, bool | None]] = {}


def mark_start() -> None:
    """Record the checkout as this process's start (done when this module is first imported; call it again where
    a process starts another measurement)."""
    _started[ROOT] = _checkout()


def provenance(stages: Any = None) -> dict[str, Any]:
    """``{"date": "YYYY-MM-DD", "commit": <40 hex digits> | None, "dirty": bool | None}``: today's date and the
    checkout at the start of this process (`mark_start`: ``HEAD``, and whether the tree had changed tracked
    files or new files git does not ignore; both None outside a git checkout), plus ``commit_at_write`` and
    ``dirty_at_write`` when the checkout now differs from it.

    Args:
        stages: the job's `agents.pipeline.StageRunner` (None: the result has no stages). When one of its stages
            ran at another checkout, or before stages recorded theirs, ``stages`` is added: ``ran_at`` (one entry
            per checkout, ``{"commit", "dirty", "stages"}``: how many stages ran there, this process's included),
            ``unrecorded`` (stages whose checkout is unknown) and, with unrecorded stages, ``earlier``: the
            ``{"commit", "dirty"}`` of the process that wrote the folder's previous ``results.json`` (its own
            ``earlier`` if it had one; None without such a file), the best witness of the unrecorded stages' code.
    """
    now = _checkout()
    commit, dirty = _started.setdefault(ROOT, now)
    out: dict[str, Any] = {"date": datetime.date.today().isoformat(), "commit": commit, "dirty": dirty}
    if now != (commit, dirty):
        out |= {"commit_at_write": now[0], "dirty_at_write": now[1]}
    if stages is not None:
        ran_at: dict[tuple[str | None, bool | None], int] = {}
        for stamp in stages.stamps.values():
            if stamp:
                key = (stamp.get("commit"), stamp.get("dirty"))
                ran_at[key] = ran_at.get(key, 0) + 1
        unrecorded = sum(1 for stamp in stages.stamps.values() if not stamp)
        if unrecorded or set(ran_at) - {(commit, dirty)}:
            out["stages"] = {
                "ran_at": [{"commit": c, "dirty": d, "stages": n} for (c, d), n in ran_at.items()],
                "unrecorded": unrecorded,
            }
            if unrecorded:
                out["stages"]["earlier"] = _earlier(Path(stages.run) / "results.json")
    return out


def _earlier(path: Path) -> dict[str, Any] | None:
    """The checkout named by a previous ``results.json`` (`provenance`'s ``earlier``), or None."""
    try:
        previous = json.loads(path.read_text())
    except (OSError, ValueError):  # no earlier results, or a file cut short
        return None
    if not isinstance(previous, dict):
        return None
    carried = (previous.get("stages") or {}).get("earlier")
    if carried:
        return carried
    return {"commit": previous["commit"], "dirty": previous.get("dirty")} if previous.get("commit") else None


def stamp() -> dict[str, Any]:
    """What a stage records about the code that ran it (`agents.pipeline.StageRunner`'s ``stamp``): this process's
    starting checkout, ``{"commit", "dirty"}`` as in `provenance`."""
    commit, dirty = _started.setdefault(ROOT, _checkout())
    return {"commit": commit, "dirty": dirty}


mark_start()
