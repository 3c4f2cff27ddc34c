"""Crash-safe run folders: one writer at a time, metrics trimmed back on resume, no silent config changes.

* `RunLock`: ``run_dir/.lock`` holds the writer's PID and host; a second trainer on the same folder is
  refused with a message (a lock left by a killed process, whose PID no longer runs on this host, is taken
  over).
* `trim_jsonl`: on resume from step s, ``metrics.jsonl`` keeps only its lines with ``step <= s``, so a run
  killed after logging step s + 1 but before its checkpoint does not log that step twice; a cut last line (a
  writer killed mid-line) is dropped with a warning.
* `changed_fields`: the result-affecting config fields whose value differs from the checkpoint's; resuming
  with any of them refuses unless ``run.allow_config_change`` is set.
* `read_jsonl`: JSON Lines reading that skips a cut last line with a warning (any other bad line raises).
"""

from __future__ import annotations

import json
import os
import socket
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "RunLock",
    "RunFolderError",
    "filter_jsonl",
    "trim_jsonl",
    "drop_cut_last_line",
    "changed_fields",
    "read_jsonl",
    "append_jsonl",
    "check_resume_config",
]


class RunFolderError(RuntimeError):
    """The run folder is in use by another process, or a resume would change result-affecting settings."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process we may not signal still exists
        return True
    return True


_HOLDERS: dict[str, int] = {}
"""How many `RunLock` objects of this process hold each lock file (the file goes when the last lets go)."""


class RunLock:
    """An exclusive writer lock on a run folder (``run_dir/.lock``); a context manager, or `acquire`/`release`.

    Raises:
        RunFolderError: another live process on this host holds the lock, or one on another host does.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / ".lock"
        self.held = False

    def acquire(self) -> RunLock:
        """Take the lock (create the file exclusively; take over a stale one)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    owner = json.loads(self.path.read_text() or "{}")
                except (OSError, json.JSONDecodeError):
                    owner = {}
                pid, host = int(owner.get("pid", 0) or 0), owner.get("host")
                if pid == me["pid"] and host == me["host"]:  # this process again: count the holders
                    _HOLDERS[str(self.path)] = _HOLDERS.get(str(self.path), 0) + 1
                    self.held = True
                    return self
                if host == me["host"] and pid and not _alive(pid):
                    self.path.unlink(missing_ok=True)  # left by a killed process
                    continue
                raise RunFolderError(
                    f"{self.path.parent} is being written by another process (pid {pid} on {host}, {self.path}); "
                    "wait for it to finish, use another --run-dir, or delete the lock file if that process is gone"
                ) from None
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            _HOLDERS[str(self.path)] = 1
            self.held = True
            return self
        raise RunFolderError(f"could not take the lock {self.path}")

    def release(self) -> None:
        """Drop the lock (only if this object holds it)."""
        if self.held:
            self.held = False
            left = _HOLDERS.get(str(self.path), 1) - 1
            _HOLDERS[str(self.path)] = left
            if left <= 0:
                _HOLDERS.pop(str(self.path), None)
                self.path.unlink(missing_ok=True)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:  # a trainer that is garbage-collected lets the folder go
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def read_jsonl(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The records of a JSON Lines file; a cut last line (no newline, not JSON) is skipped with a warning.

    Raises:
        ValueError: a line other than a cut last one is not JSON (the message gives path and line number).
    """
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    ends_cut = lines[-1] != ""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as err:
            if ends_cut and n == len(lines):
                warnings.warn(f"{path}:{n}: skipped a cut last line (its writer was interrupted)", stacklevel=2)
                return
            raise ValueError(f"{path}:{n}: not a JSON record ({err})") from err


def append_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Append whole lines and flush them to disk (a crash leaves at most the line being written cut)."""
    with open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())


def drop_cut_last_line(path: str | Path) -> None:
    """Remove a cut last line (no final newline) from a JSON Lines file, so that appended lines start clean."""
    path = Path(path)
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        if text and not text.endswith("\n"):
            path.write_text(text[: text.rfind("\n") + 1], encoding="utf-8")


def filter_jsonl(path: str | Path, keep: Callable[[dict[str, Any]], bool]) -> int:
    """Keep only the records for which ``keep(record)`` is true (and drop a cut last line); returns how many went.

    The file is rewritten atomically (a temporary file renamed into place); a missing file is left missing.
    """
    path = Path(path)
    if not path.is_file():
        return 0
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        records = list(read_jsonl(path))
    raw = [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    kept = [r for r in records if keep(r)]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
    os.replace(tmp, path)
    return len(raw) - len(kept)


def trim_jsonl(path: str | Path, max_step: int, key: str = "step") -> int:
    """Keep only the records with ``record[key] <= max_step`` (and drop a cut last line); returns how many went.

    The file is rewritten atomically (a temporary file renamed into place).
    """
    return filter_jsonl(path, lambda r: int(r.get(key, 0)) <= max_step)


FIELDS_ADDED: dict[str, Any] = {"rehearsal_memory": "trace", "rehearsal_restate_request": False}
"""Config fields added after run folders existed, with the value every run saved before then ran with
(`TrainConfig`'s rehearsal-aware RL layout: always the trace, never restated). `changed_fields` compares a saved
config that lacks one of them as if it held this value, so a run with another value never resumes an old one."""


def changed_fields(saved: dict[str, Any], current: dict[str, Any], ignore: Iterable[str]) -> dict[str, tuple[Any, Any]]:
    """``{field: (saved, current)}`` for every field outside `ignore` whose value differs (a field `saved` lacks
    is not compared, except those of `FIELDS_ADDED`, read as their value then). A nested config's fields are
    compared one by one and named ``<group>.<field>`` (`agents.config.flat_fields`); a group's name in `ignore`
    ignores each of its fields."""
    from agents.config import flat_fields

    skip = set(ignore)
    new = flat_fields(current)
    old = {**{k: v for k, v in FIELDS_ADDED.items() if k in new}, **flat_fields(saved)}

    def ignored(name: str) -> bool:
        parts = name.split(".")
        return any(".".join(parts[:i]) in skip for i in range(1, len(parts) + 1))

    return {k: (old[k], v) for k, v in new.items() if not ignored(k) and k in old and old[k] != v}


def check_resume_config(
    run_dir: str | Path, current: dict[str, Any], ignore: Iterable[str], allow_change: bool, log: Any = print
) -> None:
    """Refuse to resume when a result-affecting field differs from the newest checkpoint's config.

    Reads only ``trainer_state.json`` (no model is needed), so it runs before anything heavy is built.

    Raises:
        RunFolderError: fields differ and `allow_change` is False; the message lists them with both values.
    """
    from agents.training.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return
    try:
        saved = json.loads((ckpt / "trainer_state.json").read_text()).get("config", {})
    except (OSError, json.JSONDecodeError):
        return  # an unreadable checkpoint is reported (and skipped) when it is loaded
    diff = changed_fields(saved, current, ignore)
    if not diff:
        return
    listed = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in sorted(diff.items()))
    if not allow_change:
        raise RunFolderError(
            f"{run_dir} holds a run whose checkpoint {ckpt.name} was trained with other settings ({listed}); "
            "resuming would mix them. Use a new --run-dir, --run.resume false to start over in this folder, or "
            "--run.allow-config-change true to continue with the new values"
        )
    if log is not None:
        log(f"[resume] continuing {ckpt.name} with changed settings: {listed}")
