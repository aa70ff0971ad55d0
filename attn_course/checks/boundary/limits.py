"""The boundary's limits: how long the learner's code may compute and keep the learner waiting (one
check's :class:`Clock`, enforced inside the code by :func:`time_limit`), and how much of its results may cross."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any, Iterator

#: Seconds of computing (CPU time) the learner's code may use in one check, in all its calls; the check
#: also stops it once the learner has waited ``WALL_FACTOR`` times that long (see :class:`Clock`).
DEFAULT_TIMEOUT = 10.0
#: Set in a kernel's environment (seconds), no call of the learner's code may compute longer than this,
#: whatever its check allows (an instructor's limit for a whole class: ``grade --call-timeout``).
CALL_TIMEOUT_ENV = "ATTN_COURSE_CALL_TIMEOUT"
#: The largest tensor or array a learner's result may hold (elements); larger ones are refused.
MAX_ELEMENTS = 1 << 24
#: The largest log the grader reads back, in bytes (its arrays, uncompressed).
MAX_LOG_BYTES = 256 * 2**20
#: Of one value crossing: the most items in a list or dict, levels of nesting, characters of text.
MAX_ITEMS, MAX_DEPTH, MAX_TEXT = 10_000, 16, 2_000


class TimeUp(BaseException):
    """Raised inside the learner's code when its time is up (a BaseException: ``except Exception`` in the
    learner's code does not swallow it)."""


#: The longest a learner waits for one check, as a multiple of its limit of computing: on a machine busy
#: with other work, the check stops the learner's code after this much waiting even if it computed less.
WALL_FACTOR = 2


class Clock:
    """One check's time. The learner's code may compute (CPU time, all its calls together) for ``limit``
    seconds, and the learner waits at most ``WALL_FACTOR × limit`` seconds from the check's start.

    CPU time is what says "endless": a first call that imports a library pays only for the import's own
    work, and on a busy machine a correct answer is not stopped early. The wall-clock limit is what the
    learner lives through: however busy the machine, no check keeps them waiting longer. An operation
    that asks for a longer limit (``observe(..., timeout=60)``: a slow probe) raises the check's limit
    to that from then on."""

    def __init__(self, limit: float):
        self.limit = float(limit)
        self.start = time.monotonic()
        self.computed = 0.0
        self.queued: float | None = 0.0  # seconds the learner's code was ready to run but had no processor

    def waited(self) -> float:
        return time.monotonic() - self.start

    def allow(self, timeout: float | None = None) -> tuple[float, float]:
        """Seconds of computing and of waiting left for the next call (raising the limit to ``timeout``)."""
        if timeout is not None and timeout > self.limit:
            self.limit = float(timeout)
        return self.limit - self.computed, WALL_FACTOR * self.limit - self.waited()

    def outcome(self, by: str) -> dict[str, Any]:
        """A time-out, as the data a log keeps (the grader's replay shows the very same numbers)."""
        outcome = {"timeout": self.limit, "waited": round(self.waited(), 2), "computed": round(self.computed, 2),
                   "by": by}
        if self.queued is not None:
            outcome["queued"] = round(self.queued, 2)
        return outcome


def queued_seconds() -> float | None:
    """Seconds this thread has spent ready to run but waiting for a processor (Linux); None elsewhere."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def time_limit(seconds: float, wall: float | None = None) -> Iterator[dict]:
    """Stop the code inside after ``seconds`` of CPU time, or after ``wall`` seconds of wall-clock time
    (default ``WALL_FACTOR × seconds``).

    On POSIX (main thread) SIGPROF and SIGALRM timers raise inside the learner's code; elsewhere a timer
    thread interrupts the main thread after the wall-clock limit. Yields a dict whose ``"fired"`` says
    which limit struck (``"cpu"`` or ``"wall"``; False while none has)."""
    state: dict[str, Any] = {"fired": False}
    wall = seconds * WALL_FACTOR if wall is None else wall
    main = threading.current_thread() is threading.main_thread()
    if main and hasattr(signal, "setitimer") and hasattr(signal, "SIGPROF"):
        def on_limit(signum, frame):
            state["fired"] = "cpu" if signum == signal.SIGPROF else "wall"
            raise TimeUp()

        previous = {sig: signal.signal(sig, on_limit) for sig in (signal.SIGPROF, signal.SIGALRM)}
        signal.setitimer(signal.ITIMER_PROF, max(seconds, 1e-3))
        signal.setitimer(signal.ITIMER_REAL, max(wall, 1e-3))
        try:
            yield state
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.setitimer(signal.ITIMER_REAL, 0)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return
    if not main:  # no way to interrupt another thread's Python code: run without a limit
        yield state
        return
    import _thread

    def fire():
        state["fired"] = "wall"
        _thread.interrupt_main()

    timer = threading.Timer(wall, fire)
    timer.daemon = True
    timer.start()
    try:
        yield state
    finally:
        timer.cancel()


def capped_timeout(seconds: float) -> float:
    """``seconds``, or the limit :data:`CALL_TIMEOUT_ENV` sets when that is lower."""
    try:
        return min(seconds, float(os.environ.get(CALL_TIMEOUT_ENV) or "inf"))
    except ValueError:
        return seconds
