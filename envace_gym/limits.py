"""Limits on one tool-backend call: wall-clock time, memory, argument bounds, and process-wide numeric state.

A backend runs model-chosen arguments through real code. Some arguments make a call run for hours or fill
memory (BFCL's ``power(base=10, exponent=100000000)``, ``square_root(number=2, precision=100000000)``), and
some calls change process-wide state (``decimal.getcontext().prec``, ``mpmath.mp.dps``) that every later
computation in the process inherits. `run_limited` runs one call under a `CallLimits`, in one of two modes:

``isolation="process"`` (the default where ``os.fork`` and ``RLIMIT_AS`` exist, i.e. Linux)
    The call is pickled (the function with the objects it may change) to a call server, a small
    single-threaded helper process (``python -m envace_gym.limits``, started on first use, one per process),
    which forks a child per call. The child's address space may grow by at most ``memory_mb``
    (``resource.RLIMIT_AS``, set to its size at the fork plus the limit); the server waits at most
    ``seconds`` and then kills the child (``SIGKILL``), which stops even a single long C-level operation, from
    whichever thread the call came. The child sends back the result and the new state (``__dict__``) of the
    objects in `run_limited`'s ``state``; a call that goes over a limit changes no state. Calls from several
    threads take turns on the one server (a call that runs to its limit delays the others). About 3 ms a call,
    independent of the caller's memory (``benchmarks/perf/call_isolation.py`` measures it); forking the caller
    itself would cost about 90 ms at 2 GB resident.
``isolation="none"``
    The call runs in this process. The time limit is enforced with ``SIGALRM`` only when the call runs on
    the main thread (elsewhere nothing can interrupt it), the alarm interrupts Python code but not a single
    C-level operation, and there is no memory limit. Microseconds per call.

In both modes ``decimal``'s context and ``mpmath.mp`` precision are saved before and restored after each
call, and suites also bound the arguments that drive single huge C-level operations (``max_precision`` and
``max_result_digits``, checked by the suite's backend before the call) so that such a call is refused with a
precise message instead of running into a limit.

A call over a limit raises `CallLimitExceeded`, which backends turn into an error observation (the env and
the verifier replay see the same error, since both run calls through the same backend code).
"""

from __future__ import annotations

import atexit
import decimal
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, TypeVar

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

__all__ = ["CallLimits", "CallLimitExceeded", "CallIsolationError", "run_limited", "DEFAULT_LIMITS", "ISOLATION_MODES"]

T = TypeVar("T")

ISOLATION_MODES = ("auto", "process", "none")
_CAN_FORK = hasattr(os, "fork") and resource is not None and hasattr(resource, "RLIMIT_AS") and sys.platform == "linux"
_OUT_OF_MEMORY_EXIT = 86


@dataclass(frozen=True)
class CallLimits:
    """Per-call limits of a tool backend (see the module docstring).

    Attributes:
        seconds: wall-clock limit per call, > 0 (default 5.0 s; a BFCL call takes microseconds to milliseconds).
        memory_mb: how much the call may grow its process's address space, in MiB, >= 1 (default 1024; enforced
            only with process isolation).
        isolation: ``"process"`` (a forked child per call: time and memory limits always hold), ``"none"``
            (in this process: fast, time limit on the main thread only, no memory limit) or ``"auto"``
            (default: ``"process"`` on Linux, else ``"none"``).
        max_precision: the largest precision argument in decimal digits (default 10,000).
        max_result_digits: the largest integer power result in decimal digits (default 100,000).

    Raises:
        ValueError: a limit out of range, an unknown isolation mode, or ``"process"`` where ``os.fork`` or
            ``RLIMIT_AS`` is missing.
    """

    seconds: float = 5.0
    memory_mb: int = 1024
    isolation: str = "auto"
    max_precision: int = 10_000
    max_result_digits: int = 100_000

    def __post_init__(self) -> None:
        if not self.seconds > 0 or self.memory_mb < 1 or self.max_precision < 1 or self.max_result_digits < 1:
            raise ValueError(
                f"CallLimits need seconds > 0 and memory_mb, max_precision, max_result_digits >= 1, got {self}"
            )
        if self.isolation not in ISOLATION_MODES:
            raise ValueError(f"CallLimits.isolation must be one of {ISOLATION_MODES}, got {self.isolation!r}")
        if self.isolation == "process" and not _CAN_FORK:
            raise ValueError(
                "CallLimits(isolation='process') needs os.fork and resource.RLIMIT_AS (Linux); "
                "use isolation='none' or 'auto' on this platform"
            )

    @property
    def isolated(self) -> bool:
        """Whether calls run in a forked child (``isolation`` resolved for this platform)."""
        return self.isolation == "process" or (self.isolation == "auto" and _CAN_FORK)


DEFAULT_LIMITS = CallLimits()


class CallLimitExceeded(RuntimeError):
    """A backend call went over one of its `CallLimits` (the message says which, fit to show the model)."""


class CallIsolationError(RuntimeError):
    """Process isolation itself failed (the call server cannot start, or the call cannot be sent to it):
    a setup problem, not the model's doing, so backends let it propagate instead of showing it to the model.
    ``CallLimits(isolation="none")`` runs calls in-process instead."""


def run_limited(fn: Callable[[], T], limits: CallLimits = DEFAULT_LIMITS, state: Sequence[Any] = ()) -> T:
    """``fn()`` under `limits`, with ``decimal``/``mpmath`` precision restored afterwards.

    Args:
        fn: the call, no arguments. With process isolation its result must pickle.
        limits: the limits; ``limits.isolated`` picks the mode (module docstring).
        state: objects whose ``__dict__`` `fn` may change. With process isolation the child's versions are
            copied back into them after the call (also when `fn` raised); in-process they change in place.

    Returns:
        What `fn` returned.

    Raises:
        CallLimitExceeded: the call ran longer than ``limits.seconds``, or (process isolation) needed more
            than ``limits.memory_mb`` or its process died; `state` is then unchanged.
        CallIsolationError: process isolation itself failed (module docstring); not the call's fault.
        Exception: whatever `fn` raised.
    """
    context = decimal.getcontext().copy()
    mp = sys.modules.get("mpmath")
    dps = mp.mp.dps if mp is not None else None
    try:
        return _run_in_child(fn, limits, state) if limits.isolated else _run_here(fn, limits)
    finally:
        decimal.setcontext(context)
        mp = sys.modules.get("mpmath")
        if mp is not None:
            mp.mp.dps = dps if dps is not None else 15


def _alarm(signum: int, frame: Any) -> None:
    raise CallLimitExceeded("the call ran past its time limit")


def _run_here(fn: Callable[[], T], limits: CallLimits) -> T:
    timed = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    previous = None
    if timed:
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, limits.seconds)
    try:
        return fn()
    except CallLimitExceeded:
        raise CallLimitExceeded(f"the call ran past its time limit of {limits.seconds:g} s") from None
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)


def _address_space_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


_SERVER_FD: int | None = None  # the call server's own socket: closed in every call process


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent (the call server) dies (Linux prctl)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass  # without it, RLIMIT_CPU still ends a runaway call


def _child(fn: Callable[[], Any], seconds: float, memory_mb: int, state: Sequence[Any], write_fd: int) -> None:
    """Body of the forked call process: runs `fn` under the memory limit, writes the pickled outcome, exits."""
    code = 0
    try:
        _die_with_parent()
        if _SERVER_FD is not None:
            os.close(_SERVER_FD)  # so a dead server's client sees EOF at once, whatever this call is doing
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        soft = _address_space_bytes() + memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
        # A backstop if the call server dies mid-call: the kernel stops a call that outlives its CPU time.
        cpu = int(seconds) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        try:
            outcome: tuple = ("ok", fn())
        except MemoryError:
            os._exit(_OUT_OF_MEMORY_EXIT)
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the caller
            outcome = ("raised", e)
        try:
            payload = pickle.dumps((outcome, [vars(o) for o in state]), protocol=pickle.HIGHEST_PROTOCOL)
        except MemoryError:
            os._exit(_OUT_OF_MEMORY_EXIT)
        except Exception as e:  # an unpicklable result or exception: send its text
            outcome = ("raised", RuntimeError(f"{type(e).__name__}: {e}"))
            payload = pickle.dumps((outcome, [vars(o) for o in state]), protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(payload)
        while view:
            view = view[os.write(write_fd, view) :]
    except MemoryError:
        code = _OUT_OF_MEMORY_EXIT
    except BaseException:  # noqa: BLE001 - a broken pipe (the server gave up): nothing to report to
        code = 1
    os._exit(code)


def _fork_call(fn: Callable[[], Any], seconds: float, memory_mb: int, state: Sequence[Any]) -> tuple:
    """Run `fn` in a forked child of this (small, single-threaded) process; the reply tuple for the client."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(fn, seconds, memory_mb, state, write_fd)
    os.close(write_fd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + seconds
    finished = False
    try:
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([read_fd], [], [], left)[0]:
                continue
            chunk = os.read(read_fd, 1 << 20)
            if not chunk:
                finished = True
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)
        if not finished:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    _, status = os.waitpid(pid, 0)
    if not finished:
        return ("over", f"the call ran past its time limit of {seconds:g} s")
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == _OUT_OF_MEMORY_EXIT:
        return ("over", f"the call ran out of its memory limit of {memory_mb} MiB")
    if not chunks or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        if os.WIFSIGNALED(status):
            how = f"signal {os.WTERMSIG(status)}"
        else:
            how = f"exit code {os.WEXITSTATUS(status)}"
        return ("over", f"the call's process died ({how}) before it returned")
    return ("done", b"".join(chunks))


def _serve(fd: int) -> None:
    """The call server's loop (``python -m envace_gym.limits FD``): one request, one forked call, one reply.

    The server stays small and single-threaded, so a fork per call is cheap (a few ms) and safe. It unpickles
    each request itself, so the modules a call needs are imported once, here, and every child inherits them.
    It exits when the client's end of the socket closes.
    """
    global _SERVER_FD
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client decides; it kills this server if it must
    _SERVER_FD = fd
    conn = Connection(fd)
    while True:
        try:
            seconds, memory_mb, body = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            fn, state = pickle.loads(body)
        except Exception as e:  # noqa: BLE001 - a class this interpreter cannot import
            reply: tuple = (
                "broken",
                f"the call server cannot load the call ({type(e).__name__}: {e}); a backend "
                "class defined in __main__ or a notebook is not importable there",
            )
        else:
            reply = _fork_call(fn, seconds, memory_mb, state)
        del body
        fn = state = None
        conn.send_bytes(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))


class _CallServer:
    """The client's handle on its call server: started on first use, restarted after it dies or is killed."""

    def __init__(self) -> None:
        self._after_fork()
        if hasattr(os, "register_at_fork"):  # a forked client starts its own server, with a fresh lock
            os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._pid = -1
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None

    def _start(self) -> Connection:
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join([root, *sys.path])
        env.setdefault("OPENBLAS_NUM_THREADS", "1")  # keep the server single-threaded, so forking it is safe
        env.setdefault("OMP_NUM_THREADS", "1")
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "envace_gym.limits", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except OSError as e:
            raise CallIsolationError(f"cannot start the call server ({e}); use CallLimits(isolation='none')") from e
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        self._pid = os.getpid()
        return self._conn

    def _stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._proc is not None and self._pid == os.getpid():
            try:  # the server leads its own process group, with any call process it forked
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self._proc.wait()
        self._proc = self._conn = None

    def call(self, fn: Callable[[], Any], limits: CallLimits, state: Sequence[Any]) -> tuple:
        """One call through the server (calls from several threads take turns: one server, one lock)."""
        try:
            body = pickle.dumps((fn, list(state)), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - a lambda or a local function cannot cross processes
            raise CallIsolationError(
                f"the call does not pickle ({type(e).__name__}: {e}); give a module-level "
                "function, or use CallLimits(isolation='none')"
            ) from e
        request = pickle.dumps((limits.seconds, limits.memory_mb, body), protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked copy of this process: its own server
                self._proc = self._conn = None
            conn = (
                self._conn
                if self._conn is not None and self._proc is not None and self._proc.poll() is None
                else self._start()
            )
            try:
                conn.send_bytes(request)
                # The server always answers within the call's limit; the margin covers its own start-up.
                if not conn.poll(limits.seconds + 60):
                    raise TimeoutError("the call server did not answer")
                return pickle.loads(conn.recv_bytes())
            except BaseException as e:
                # Out of step with the server (Ctrl-C while waiting, or it died): replace it next call.
                self._stop()
                if isinstance(e, (EOFError, OSError, TimeoutError)):
                    return ("over", f"the call's process died before it returned ({type(e).__name__})")
                raise


_SERVER = _CallServer()
atexit.register(_SERVER._stop)


def _run_in_child(fn: Callable[[], T], limits: CallLimits, state: Sequence[Any]) -> T:
    kind, value = _SERVER.call(fn, limits, state)
    if kind == "over":
        raise CallLimitExceeded(value)
    if kind == "broken":
        raise CallIsolationError(value)
    # The bytes come from our own call process running the backend's code, never from the model's text.
    try:
        (result_kind, result), new_state = pickle.loads(value)
    except Exception as e:  # noqa: BLE001 - e.g. an exception class whose constructor cannot be replayed
        raise CallIsolationError(f"the call's outcome cannot be read back ({type(e).__name__}: {e})") from e
    for obj, attrs in zip(state, new_state):
        obj.__dict__.clear()
        obj.__dict__.update(attrs)
    if result_kind == "raised":
        raise result
    return result


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
