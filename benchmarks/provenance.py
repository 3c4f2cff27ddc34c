"""Where a measured result comes from: the date and the code it ran on, recorded in every ``results.json``.

A results file names the command that measured it; the command's outcome also depends on the code and the
recipes at the time (a recipe's SFT settings, a world's mistakes), so the page (`benchmarks.results`) shows the
commit beside the date, and whether the working tree had uncommitted changes then.
"""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["provenance"]

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):  # no git, not a checkout (an installed copy), a git error
        return None
    return done.stdout.strip()


def provenance() -> dict[str, Any]:
    """``{"date": "YYYY-MM-DD", "commit": <40 hex digits> | None, "dirty": bool | None}``: today's date, the
    checkout's ``HEAD`` and whether the tree differs from it: changed tracked files or new files git does not
    ignore (both None outside a git checkout)."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain") if commit else None  # ignored files (runs/) do not count
    return {
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "dirty": None if status is None else bool(status),
    }
