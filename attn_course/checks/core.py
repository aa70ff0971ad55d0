"""What every check shares: the :func:`check` decorator and the API check modules are written with.

A check is a function of one :class:`~.boundary.Learner` (the learner's exercise, reached only through
the learner boundary) that either returns a one-line summary of what it verified, or ends with
:func:`~.compare.fail` (a diagnosis in the course's template). The decorator turns that into a
:class:`~.result.CheckResult` and guarantees the contract the notebooks, the tests and the grader rely on:

* ``check_attention()`` in a notebook looks ``attention`` up in the notebook's namespace (so a check
  run before its exercise cell, or after a kernel restart, says which cell to run) and shows the
  verdict line and the result as data. It never grades a definition older than the exercise cell's
  last run: when that run failed (a syntax error, or an exception), the check says so, with the line,
  and asks to fix and rerun (:mod:`.cells` records each cell's outcome);
* when the exercise is not passed, the check shows the diagnosis in a red box and lets the notebook
  go on (Run All reaches the end in every front-end, tags or not), but *raises* with the diagnosis
  wherever something judges the cell by its error: the course's grader (``ATTN_COURSE_RECORD_DIR``),
  nbgrader (``NBGRADER_EXECUTION``), ``ATTN_COURSE_STRICT=1``, and outside IPython. Under pytest the
  course's plugin reads the result data instead (:mod:`attn_course.pytest_plugin`);
* ``check_attention.evaluate(fn)`` returns the result without showing or raising (tests, tools);
* a function still raising ``NotImplementedError`` is *not attempted*; an exception, a time-out or a
  strange value from the learner's code is a diagnosis that shows the learner's own line; a bug in the
  check itself is an *error* verdict, never the learner's failure (and so is a machine too busy to tell,
  :class:`~.boundary.MachineBusy`: a check keeps no learner waiting more than twice its time limit);
* under the grader (``ATTN_COURSE_RECORD_DIR`` set) every operation is also logged, and the grader
  replays the same check on that log in its own process to reach the verdict it trusts.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

from . import cells
from .boundary import (DEFAULT_TIMEOUT, RECORD_ENV, WALL_FACTOR, Clock, Learner, LearnerChangedSettings,
                       LearnerNotAttempted, LearnerRaised, LearnerTimedOut, LocalSession, MachineBusy, RecordingSession,
                       ReplayMismatch, ReplaySession, Session, capped_timeout)
from .compare import Failure, Mistake, as_tensor, expect_close, expect_equal, expect_finite, expect_shape, fail, fmt
from .exceptions import explain_exception
from .result import CheckResult, Diagnosis, Status

__all__ = [
    "check",
    "Check",
    "Learner",
    "LearnerRaised",
    "LearnerTimedOut",
    "LearnerNotAttempted",
    "Mistake",
    "fail",
    "fmt",
    "as_tensor",
    "expect_shape",
    "expect_finite",
    "expect_close",
    "expect_equal",
    "Failure",
    "learner_error",
]

_MISSING = object()
#: Set by the course's pytest plugin and by the grader: no live progress (outputs must be reproducible).
QUIET_ENV = "ATTN_COURSE_QUIET"
#: Set (to anything but "" or "0"), a check that is not passed raises in a notebook too (see :func:`raises`).
STRICT_ENV = "ATTN_COURSE_STRICT"
#: Set by nbgrader (``autograde``, ``validate``) in the kernels it runs: it scores a cell by its error.
NBGRADER_ENV = "NBGRADER_EXECUTION"
#: A check still running after this many seconds shows live progress in its cell.
PROGRESS_AFTER = 2.0
#: Names a notebook's set-up cell defines; a NameError for one of them means the kernel was restarted.
_IMPORTED_NAMES = {"torch", "F", "nn", "math", "np", "numpy", "plt"}
#: The cell that holds a notebook's imports, as a learner finds it (every notebook is laid out this way:
#: tests/checks/test_core.py holds them to it). The first code cell is Colab's set-up cell.
IMPORTS_CELL = ("the imports cell (the second code cell from the top, just below the \"On Google Colab only\" "
                "cell; it imports `attn_course`)")


def _a(word: str) -> str:
    return f"an {word}" if word[:1].lower() in "aeiou" else f"a {word}"


def _seconds(seconds: float) -> str:
    """``0.4``, ``3``, ``21``: seconds as a learner reads them (whole seconds from one second on)."""
    return f"{seconds:.2f}" if seconds < 0.095 else f"{seconds:.1f}" if seconds < 0.95 else f"{seconds:.0f}"


def machine_busy(exc: MachineBusy) -> Diagnosis:
    """The diagnosis when a check stopped the learner's code on a machine too busy to tell anything."""
    stopped = exc.timeout
    return Diagnosis("not checked: the computer was too busy", tried=stopped.call,
                     got=f"after {_seconds(stopped.waited)} s your code had computed for only "
                         f"{_seconds(stopped.computed)} s (other programs had the processor), so the check stopped "
                         "it before it could tell",
                     expected=f"{_seconds(stopped.seconds)} s of computing within "
                              f"{_seconds(WALL_FACTOR * stopped.seconds)} s",
                     cause="other programs, or the kernels of other open notebooks, kept the processor busy: this "
                           "says nothing about your code",
                     fix="close what you do not need (Kernel ▸ Shut Down Kernel in other notebooks), then run this "
                         "check again")


def _caret(code: str, offset: int | None, prefix: str) -> str:
    """``code`` without its indentation, and under it a caret at ``offset`` (1-based, in ``code``)."""
    stripped = code.lstrip()
    shown = f"{prefix}{stripped}"
    if not offset:
        return shown
    column = len(prefix) + max(offset - 1 - (len(code) - len(stripped)), 0)
    return f"{shown}\n{' ' * min(column, len(shown))}^"


def failed_cell(run: "cells.CellRun", defined: bool) -> CheckResult:
    """The result for an exercise whose cell's last run failed: the check grades nothing older."""
    name, error = run.name, run.error or {}
    kind, message, line = str(error.get("type", "an error")), str(error.get("message", "")), error.get("line")
    code = str(error.get("code", ""))
    at = f"line {line}" if line else "your exercise cell"
    if error.get("syntax"):
        summary = f"syntax error in your exercise cell (line {line})" if line else "syntax error in your exercise cell"
        got = f"SyntaxError: {message}" + (f"\n{_caret(code, error.get('offset'), f'line {line}: ')}" if line and code else "")
        cause = "Python could not read the cell, so none of it ran: " + (
            f"`{name}` is still the version from an earlier run, which this check does not grade" if defined
            else f"`{name}` was never defined")
        fix = "fix that line (a bracket, a quote or a colon is often missing), run the exercise cell again, then this one"
    else:
        summary = f"your exercise cell raised {kind} ({at})"
        where = f"\nat line {line} of your exercise cell" + (f", in {error['function']}()" if error.get("function") else "") \
            + (f": {code.strip()}" if code else "") if line else ""
        got = f"{kind}: {message}{where}"
        if run.rebound:
            cause = f"the cell stopped at that line, after it defined `{name}`"
        elif defined:
            cause = (f"the cell stopped at that line before it defined `{name}`: `{name}` is still the version from "
                     "an earlier run, which this check does not grade")
        else:
            cause = f"the cell stopped at that line, before it defined `{name}`"
        fix = "fix that line, run the exercise cell again (it must run without an error), then this one"
        missing = message.split("'")[1] if kind == "NameError" and message.count("'") >= 2 else ""
        if missing in _IMPORTED_NAMES:  # the exercise cell ran in a kernel without the notebook's imports
            cause = "the kernel was restarted (or the imports cell never ran), so the notebook's imports are gone"
            fix = f"run {IMPORTS_CELL}, then your exercise cell, then this one"
    d = Diagnosis(summary, tried=f"finding `{name}`: the last run of its exercise cell", got=got,
                  expected="the exercise cell to run without an error", cause=cause, fix=fix)
    return CheckResult(run.name, Status.FAILED, summary, d)


def learner_error(exc: LearnerRaised | LearnerTimedOut, *, tried: str = "", expected: str = "a result",
                  cause: str = "", fix: str = "") -> Diagnosis:
    """The diagnosis for an exception raised by (or a time-out of) the learner's code.

    ``cause``/``fix`` may add what the check knows about the usual reason; they are used only when
    nothing more specific is known (a NameError after a kernel restart is always named as such)."""
    tried = tried or exc.call
    if isinstance(exc, LearnerTimedOut):
        waited, computed = _seconds(exc.waited), _seconds(exc.computed)
        if exc.waiting:
            return Diagnosis(f"stopped after {waited} s without a result", tried=tried,
                             got=f"no result after {waited} s, and your code computed for only {computed} s of "
                                 "them: it was waiting, not computing",
                             expected="an answer within a fraction of a second on these small inputs",
                             cause="your code waits for something (time.sleep, input(), a lock, a file)",
                             fix="remove the waiting from your function: it only needs to compute")
        return Diagnosis(f"stopped after {waited} s without a result", tried=tried,
                         got=f"no result after {waited} s ({computed} s of computing), so the check stopped your "
                             f"code (it allows {_seconds(exc.seconds)} s of computing, and "
                             f"{_seconds(WALL_FACTOR * exc.seconds)} s of waiting at most)",
                         expected="an answer within a fraction of a second on these small inputs",
                         cause=cause or "an endless loop, or far more work than the exercise needs",
                         fix=fix or "look at your loops: does each one end, and does it run over the sizes you meant?")
    where = exc.where()
    got = f"{exc.type_name}: {exc.message}" + (f"\nat {where}" if where else "")
    if exc.phase == "backward":
        got = f"the backward pass raised {got}"
    if exc.type_name == "NameError" and exc.message.split("'")[1:2] and exc.message.split("'")[1] in _IMPORTED_NAMES:
        name = exc.message.split("'")[1]
        return Diagnosis(f"`{name}` is not defined in this kernel", tried=tried, got=got, expected=expected,
                         cause="the kernel was restarted (or the imports cell never ran), so the notebook's imports "
                               "are gone",
                         fix=f"run {IMPORTS_CELL}, then your exercise cell, then this one (or select this cell and "
                             "use Run ▸ Run All Above Selected Cell)")
    if exc.type_name in ("SystemExit", "KeyboardInterrupt") or not exc.type_name.endswith(("Error", "Exception", "Warning")):
        cause = cause or f"your code raised {exc.type_name}, which stops programs rather than reporting a problem"
    if not cause and (known := explain_exception(exc.type_name, exc.message)):
        cause, fix = known[0], fix or known[1]
    return Diagnosis(f"your code raised {exc.type_name}", tried=tried, got=got, expected=expected,
                     cause=cause, fix=fix or ("fix the line shown above" if where else "read the error message: it names what went wrong"))


def changed_settings(exc: LearnerChangedSettings) -> Diagnosis:
    """The diagnosis for code that left PyTorch's default dtype or gradient mode changed (now put back)."""
    dtype = any(c.startswith("torch.get_default_dtype") for c in exc.changes)
    grad = any(c.startswith("torch.is_grad_enabled") for c in exc.changes)
    calls = ["the default dtype (torch.set_default_dtype)"] * dtype + [
        "the gradient mode (torch.set_grad_enabled, or a torch.no_grad() entered and never left)"] * grad
    block = "torch.no_grad" if any(c.startswith("torch.is_grad_enabled() is False") for c in exc.changes) else \
        "torch.enable_grad"
    fixes = ["ask for a dtype where you make a tensor (dtype=torch.float64, x.double())"] * dtype + [
        f"switch the mode only inside a `with {block}():` block, which puts it back when it ends"] * grad
    return Diagnosis("changed PyTorch's global settings", tried=exc.call, got="after the call, " + "; ".join(exc.changes),
                     expected="PyTorch's settings as they were: the function only computes its result",
                     cause=f"your code changes {' and '.join(calls)} and leaves it so: every later cell of your "
                           "notebook would run with that setting (the check has put it back)",
                     fix="; ".join(fixes))


def _syntax_error_in_history(name: str, namespace: dict) -> Diagnosis | None:
    """If the last cell this kernel ran that defines ``name`` does not compile, a result saying so.

    IPython keeps every cell it ran in ``In`` (``_ih``); a cell with a syntax error defines nothing, which
    otherwise reads like a cell never run."""
    history = namespace.get("_ih") or namespace.get("In")
    if not isinstance(history, list):
        return None
    import re

    pattern = re.compile(rf"^\s*(def|class)\s+{re.escape(name)}\b", re.M)
    source = next((cell for cell in reversed(history) if isinstance(cell, str) and pattern.search(cell)), None)
    if source is None:
        return None
    try:
        compile(source, "<exercise cell>", "exec")
    except SyntaxError as exc:
        line = (exc.text or "").strip()
        d = Diagnosis(f"syntax error in your exercise cell (line {exc.lineno})", tried=f"finding `{name}`",
                      got=f"SyntaxError: {exc.msg}, line {exc.lineno}: {line}",
                      expected=f"the exercise cell to define `{name}`",
                      cause="Python could not read the cell, so nothing in it was defined",
                      fix="fix that line in the exercise cell (a bracket or a colon is often missing), run the "
                          "cell, then this one")
        return None if exc.lineno is None else d
    return None


def _not_attempted(exercise: str, name: str, reason: str) -> CheckResult:
    if reason == "undefined":
        d = Diagnosis("not defined yet", tried=f"finding `{name}` in this notebook",
                      got=f"no `{name}` is defined in this kernel",
                      fix=f"run the exercise cell above (the one defining `{name}`), then this one; after a kernel "
                          "restart, run the cells above first (Run ▸ Run All Above Selected Cell)")
        return CheckResult(exercise, Status.NOT_ATTEMPTED, "not defined yet: run the exercise cell first", d)
    d = Diagnosis("not attempted yet", got=f"`{name}` still raises NotImplementedError",
                  fix="replace `raise NotImplementedError()` in the exercise cell with your code, run that cell, "
                      "then this one")
    return CheckResult(exercise, Status.NOT_ATTEMPTED, "not attempted yet", d)


class Check:
    """A decorated check: call it in a notebook, or ``evaluate`` it in code."""

    def __init__(self, body: Callable[[Learner], str | None], exercise: str, *, name: str, kind: str,
                 expects: str, timeout: float):
        functools.update_wrapper(self, body)
        self.body, self.exercise, self.name, self.kind = body, exercise, name, kind
        self.expects, self.timeout = expects, timeout

    # ---------------------------------------------------------------- evaluation (no display, no raise)
    def evaluate(self, target: Any = _MISSING, *, session: Session | None = None, namespace: dict | None = None,
                 record: Path | None = None, runs: dict[str, "cells.CellRun"] | None = None,
                 clock: Clock | None = None) -> CheckResult:
        """Run the check and return its result. The exercise is ``target``, else ``self.name`` looked up in
        ``namespace``; then ``runs`` (:func:`.cells.outcomes`) says how the last run of the cell that defines
        it ended, and a failed run is reported instead of grading an older definition. ``session`` replaces
        the live exercise (a :class:`~.boundary.ReplaySession`); ``record`` also logs every operation to
        that file; ``clock`` is the check's time (default: from now, with the check's limit)."""
        if session is None:
            if target is _MISSING:
                namespace = namespace if namespace is not None else {}
                run = (runs or {}).get(self.name)
                if run is not None and run.failed and not (run.rebound and run.error.get("type") == "NotImplementedError"):
                    result = failed_cell(run, defined=self.name in namespace)
                    result.exercise = self.exercise
                    return result
                if self.name not in namespace:
                    syntax = _syntax_error_in_history(self.name, namespace)
                    if syntax is not None:
                        return CheckResult(self.exercise, Status.FAILED, syntax.summary, syntax)
                    return _not_attempted(self.exercise, self.name, "undefined")
                target = namespace[self.name]
            session = RecordingSession(lambda: target, record) if record else LocalSession(lambda: target)
        learner = Learner(session, self.name, timeout=self.timeout, clock=clock)
        try:
            result = self._run(learner)
        finally:
            try:
                session.finish()
            except OSError:
                pass  # a log that cannot be written is the grader's problem, never the learner's
        return result

    def _run(self, learner: Learner) -> CheckResult:
        try:
            with torch.enable_grad():  # checks that differentiate work after set_grad_enabled(False)
                self._preflight(learner)
                summary = self.body(learner)
        except LearnerNotAttempted:
            return _not_attempted(self.exercise, self.name, "stub")
        except Failure as exc:
            return CheckResult(self.exercise, Status.FAILED, exc.diagnosis.summary, exc.diagnosis)
        except (LearnerRaised, LearnerTimedOut) as exc:
            d = learner_error(exc, expected=self.expects)
            return CheckResult(self.exercise, Status.FAILED, d.summary, d)
        except LearnerChangedSettings as exc:
            d = changed_settings(exc)
            return CheckResult(self.exercise, Status.FAILED, d.summary, d)
        except MachineBusy as exc:
            d, t = machine_busy(exc), exc.timeout  # what the learner's process reported, for the grader to weigh
            return CheckResult(self.exercise, Status.ERROR, d.summary, d,
                               details={"busy": {"waited": t.waited, "computed": t.computed, "queued": t.queued}})
        except ReplayMismatch as exc:
            d = Diagnosis("not graded: the check's record is incomplete", got=str(exc),
                          cause="the notebook's run stopped or was interfered with before this check finished",
                          fix="grade this notebook again; if it repeats, run it yourself and look at this check's cell")
            return CheckResult(self.exercise, Status.ERROR, d.summary, d)
        except Exception as exc:  # noqa: BLE001 - a bug in the check: say so, never blame the learner
            d = Diagnosis("the check itself failed (not your fault)", tried=learner.last_call,
                          got=f"{type(exc).__name__} inside the course's check: {exc}",
                          cause="a bug in the course's check (or an answer of a kind it did not foresee)",
                          fix=f"tell your instructor or the course's maintainers; meanwhile compare with the solution. "
                              f"Expected {self.expects}.")
            return CheckResult(self.exercise, Status.ERROR, d.summary, d)
        return CheckResult(self.exercise, Status.PASSED, summary or "passed")

    def _preflight(self, learner: Learner) -> None:
        info = learner.inspect()
        what = info.get("type", "value")
        if self.kind == "class":
            if info.get("kind") != "class":
                fail(f"`{self.name}` is a {what}, not a class", tried=f"checking `{self.name}`",
                     got=f"a {what}", expected=self.expects,
                     fix=f"define `class {self.name}(...)` in the exercise cell and run it")
        elif not info.get("callable"):
            fail(f"`{self.name}` is {_a(what)}, not a function", tried=f"checking `{self.name}`", got=_a(what),
                 expected=self.expects,
                 cause=f"the name `{self.name}` was given a value after the exercise cell ran",
                 fix=f"run the exercise cell again so that `{self.name}` is your function")

    # ---------------------------------------------------------------- in a notebook
    def __call__(self, target: Any = _MISSING) -> None:
        """Check the exercise: in a notebook, show the verdict (and the diagnosis unless passed); raise with
        the diagnosis where something judges the cell by its error (:func:`raises`)."""
        shell = _ipython()
        cells.install(shell)  # (already done when the notebook imported attn_course)
        namespace = shell.user_ns if shell is not None else sys._getframe(1).f_globals
        folder = os.environ.get(RECORD_ENV)
        record = Path(folder) / f"{self.exercise}.npz" if folder else None
        clock = Clock(capped_timeout(self.timeout))
        live = _Progress(self.name, clock) if shell is not None and not os.environ.get(QUIET_ENV) else None
        try:
            result = self.evaluate(target, namespace=namespace, record=record, runs=cells.outcomes(shell), clock=clock)
        finally:
            handle = live.stop() if live else None
        present(result, shell, handle)


def check(exercise: str, *, name: str | None = None, kind: str = "function", expects: str,
          timeout: float = DEFAULT_TIMEOUT) -> Callable[[Callable[[Learner], str | None]], Check]:
    """Make a check for the exercise ``exercise`` (its grade id). ``name`` is what the learner defines
    (default: the exercise id), ``kind`` "function" or "class", ``expects`` says what it should be
    (used when something else is found), ``timeout`` bounds every call of the learner's code."""

    def decorate(body: Callable[[Learner], str | None]) -> Check:
        return Check(body, exercise, name=name or exercise, kind=kind, expects=expects, timeout=timeout)

    return decorate


def _ipython():
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with the course
        return None
    return get_ipython()


class _Progress:
    """After :data:`PROGRESS_AFTER` seconds, a line in the cell saying the check is still running; the
    verdict later replaces that very line, so a cell always ends with exactly one output."""

    def __init__(self, name: str, clock: Clock):
        self.name, self.clock, self.start, self.handle = name, clock, time.monotonic(), None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from IPython.display import display

        if self._done.wait(PROGRESS_AFTER):
            return
        self.handle = display({"text/plain": f"… checking `{self.name}`"}, raw=True, display_id=True)
        while not self._done.wait(1.0):
            seconds = time.monotonic() - self.start
            self.handle.update({"text/plain": f"… checking `{self.name}`: {seconds:.0f} s so far (it stops your "
                                              f"code after {_seconds(WALL_FACTOR * self.clock.limit)} s at the "
                                              "latest)"}, raw=True)

    def stop(self):
        self._done.set()
        self._thread.join()
        return self.handle


def raises(shell: Any = None) -> bool:
    """Whether a check that is not passed raises (else it only shows its diagnosis).

    It raises outside IPython, and wherever something judges a cell by its error: the course's grader
    (:data:`~.boundary.RECORD_ENV`), nbgrader (:data:`NBGRADER_ENV`) and :data:`STRICT_ENV`. In a
    notebook it does not: Run All then reaches the last cell in every front-end, including those that
    ignore the ``raises-exception`` tag (VS Code, Colab)."""
    if shell is None:
        return True
    return any(os.environ.get(key, "") not in ("", "0") for key in (STRICT_ENV, RECORD_ENV, NBGRADER_ENV))


def present(result: CheckResult, shell: Any = None, handle: Any = None) -> None:
    """Show a result where the check ran (in place of a progress line, if one is showing): the data and
    the verdict line, and, when the check does not raise, the diagnosis in a red box; then raise unless
    passed where :func:`raises` says so."""
    strict = raises(shell)
    if shell is not None:
        from IPython.display import display

        bundle = result.mimebundle(diagnosis=not strict)
        if handle is not None:
            handle.update(bundle, raw=True)
        else:
            display(bundle, raw=True)
    elif result.passed:
        print(result.headline())
    exc = result.exception()
    if exc is not None and strict:
        raise exc
