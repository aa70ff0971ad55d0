"""What the learner's code did, as a check receives it: it raised (:class:`LearnerRaised`, told as data by
:func:`raised_info`), ran past its time, was not attempted yet, left PyTorch's global settings changed, or the
machine was too busy to tell; and
:class:`ReplayMismatch`, a replay that found no record."""

from __future__ import annotations

import linecache
import os
import sys
from pathlib import Path
from typing import Any

from .limits import MAX_TEXT, TimeUp


class LearnerRaised(Exception):
    """The learner's code raised. ``type_name``, ``message``; ``line``/``code`` locate it in their cell."""

    def __init__(self, info: dict[str, Any], call: str):
        self.type_name = str(info.get("type", "Exception"))
        self.message = str(info.get("message", ""))
        self.line = info.get("line")
        self.code = str(info.get("code", ""))
        self.function = str(info.get("function", ""))
        self.phase = str(info.get("phase", "call"))
        self.call = call
        super().__init__(f"{self.type_name}: {self.message}")

    def where(self) -> str:
        """``line 7 of your cell: scores = Q @ K.T`` (empty when the error came from inside a library)."""
        if self.line is None:
            return ""
        function = f", in {self.function}()" if self.function and not self.function.startswith("<") else ""
        return f"line {self.line} of your cell{function}: {self.code.strip()}" if self.code else \
            f"line {self.line} of your cell{function}"


class LearnerTimedOut(Exception):
    """The learner's code ran past its time limit and was stopped. ``seconds`` is the check's limit (of
    computing); ``waited`` the seconds the learner had waited since the check started; ``computed`` the
    seconds the learner's code computed in that time; ``by`` which limit struck (``"cpu"`` or ``"wall"``)."""

    def __init__(self, seconds: float, call: str, *, waited: float | None = None, computed: float | None = None,
                 by: str = "cpu", queued: float | None = None):
        self.seconds, self.call, self.by = seconds, call, by
        self.waited = float(waited) if waited is not None else float(seconds)
        self.computed = float(computed) if computed is not None else float(seconds)
        self.queued = float(queued) if queued is not None else None  # runnable, waiting for a processor
        super().__init__(f"{call} was stopped after {self.waited:.1f} s")

    @property
    def waiting(self) -> bool:
        """The code neither computed nor wanted to while the learner waited: it sleeps or waits for
        something: it was neither running nor ready to run for most of the wait. (Where the time spent
        ready to run is unknown, computing for less than a tenth of the wait counts.)"""
        if self.by != "wall":
            return False
        if self.queued is None:
            return self.computed < 0.1 * self.waited
        return self.computed + self.queued < 0.5 * self.waited


class MachineBusy(BaseException):
    """The wall-clock limit struck while the learner's code had computed for less than half its limit:
    the processor was busy with other work, so nothing is known about the code. A BaseException, so
    that a check's ``except Exception`` (or ``except LearnerTimedOut``) never turns it into a verdict on
    the learner: :class:`~..core.Check` reports it as an error verdict ("not checked")."""

    def __init__(self, timeout: LearnerTimedOut):
        self.timeout = timeout
        super().__init__(str(timeout))


class LearnerChangedSettings(BaseException):
    """The learner's code left PyTorch's global settings changed (the default dtype, gradient mode): the settings
    were put back, and ``changes`` says what they had become. A BaseException like :class:`MachineBusy`, so that
    no check's ``except Exception`` (or ``except LearnerRaised``) passes over it: it is a verdict of its own."""

    def __init__(self, changes: list[str], call: str):
        self.changes, self.call = [str(c) for c in changes], call
        super().__init__("; ".join(self.changes))


class LearnerNotAttempted(Exception):
    """The learner's code still raises NotImplementedError, or the exercise is not defined yet."""

    def __init__(self, reason: str = "stub"):
        self.reason = reason
        super().__init__(reason)


class ReplayMismatch(Exception):
    """A replayed check asked for something the log does not hold (or the log is malformed)."""


_COURSE_DIR = str(Path(__file__).resolve().parents[2])
_LIBRARY_DIRS = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})


def _is_learner_frame(filename: str) -> bool:
    if not filename or filename.startswith("<frozen") or filename == "<string>":
        return False
    real = os.path.realpath(filename) if not filename.startswith("<") else filename
    return not real.startswith(_COURSE_DIR) and not real.startswith(_LIBRARY_DIRS)


def raised_info(exc: BaseException, phase: str) -> dict[str, Any]:
    """What the learner needs to see of an exception: its type, message and the last line of *their* code."""
    info: dict[str, Any] = {"type": type(exc).__name__, "message": _safe_str(exc)[:MAX_TEXT], "phase": phase}
    frame_info = None
    tb = exc.__traceback__
    while tb is not None:
        if _is_learner_frame(tb.tb_frame.f_code.co_filename):
            frame_info = (tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    if isinstance(exc, SyntaxError) and exc.lineno:
        frame_info = (exc.filename or "", exc.lineno, "")
    if frame_info:
        filename, line, function = frame_info
        info.update(line=line, function=function, code=linecache.getline(filename, line).rstrip()[:300])
    return info


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except TimeUp:
        raise
    except BaseException:  # noqa: BLE001
        return f"({type(exc).__name__} with an unprintable message)"


def is_stub(exc: BaseException) -> bool:
    """True for the exercise stub's ``raise NotImplementedError()``: raised by a ``raise`` statement in the
    learner's own code, not by a library call on their line (torch raises NotImplementedError for an
    operation a dtype lacks, e.g. softmax of a bool tensor: that is a mistake to diagnose)."""
    tb, last = exc.__traceback__, None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None or not _is_learner_frame(last.tb_frame.f_code.co_filename):
        return False
    line = linecache.getline(last.tb_frame.f_code.co_filename, last.tb_lineno).strip()
    return line.startswith("raise") and "NotImplementedError" in line or not line
