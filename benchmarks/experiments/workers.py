"""Worker processes for the experiment scripts: a script runs copies of itself with the same options plus its
own worker flags, waits for them, and stops them when it is stopped (`run_workers`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_worker_options(ap: argparse.ArgumentParser, share: str) -> None:
    """Add ``--workers`` (processes that run the script's stages in parallel; `share` says which each takes and
    after what) and the hidden ``--worker`` that `run_workers` sets for each of them."""
    ap.add_argument(
        "--workers",
        type=int,
        default=1,
        help=f"processes that {share}; then this process reads every stage back and writes the results. On 2 "
        "cores: --workers 2 --threads 1",
    )
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)  # set by --workers for a worker


def check_worker_options(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Stop the parser `ap` (``ap.error``) unless ``--workers`` >= 1 and ``--worker`` lies in [0, --workers)."""
    if args.workers < 1 or (args.worker is not None and not 0 <= args.worker < args.workers):
        ap.error("--workers must be >= 1 (and --worker, set by --workers, in [0, --workers))")


def run_workers(
    args: argparse.Namespace,
    out: Path,
    log: Any = print,
    jobs: list[tuple[str, list[str], str]] | None = None,
    *,
    module: str,
) -> None:
    """Run processes of the script `module` (``python -m``) with the same options and wait for them: by
    default ``--workers`` of them, worker k on the seeds s with s % W == k, each logging to
    ``<out>/worker<k>.log``; or one per `jobs` entry ``(label, extra options, log file name under out)``. Log
    lines start with the script's name (``[lab_ablations]``). Stopping this process (an exception, Ctrl-C, or
    SIGTERM while it waits) stops them; finished stages stay on disk, so a rerun resumes.

    Raises:
        RuntimeError: a process failed (its exit code and log named).
    """
    import signal
    import subprocess
    import threading

    tag = f"[{module.rsplit('.', 1)[-1]}]"

    def stop(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a repeated SIGTERM must not cut the cleanup below short
        raise SystemExit(f"{tag} stopped by signal {signum}")

    if jobs is None:
        jobs = [
            (f"worker {k}: seeds {list(range(k, args.seeds, args.workers))}", ["--worker", str(k)], f"worker{k}.log")
            for k in range(args.workers)
        ]
    argv = list(getattr(args, "argv", []))
    procs = []
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set a signal handler
    previous = signal.signal(signal.SIGTERM, stop) if main_thread else None
    try:
        for label, extra, name in jobs:
            path = out / name
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w") as handle:
                cmd = [sys.executable, "-m", module, *argv, *extra]
                procs.append((label, path, subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT)))
            log(f"{tag} {label}, log {path}")
        for label, path, proc in procs:
            if proc.wait() != 0:
                raise RuntimeError(f"{tag} {label} exited with {proc.returncode}; its log: {path}")
    finally:
        for _, _, proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
        if main_thread:  # (None: the handler was not set from Python; the default then)
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
