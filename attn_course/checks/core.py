"""What every check shares: the :func:`check` decorator and the API check modules are written with.

A check is a function of one :class:`~.boundary.Learner` (the learner's exercise, reached only through
the learner boundary) that either returns a one-line summary of what it verified, or ends with
:func:`~.compare.fail` (a diagnosis in the course's template). The decorator turns that into a
:class:`~.result.CheckResult` and guarantees the contract the notebooks, the tests and the grader rely on:

* ``check_attention()`` in a notebook looks ``attention`` up in the notebook's namespace (so a check
  run before its exercise cell, or after a kernel restart, says which cell to run), shows the verdict
  line and the result as data, and raises with the diagnosis when the exercise is not passed;
* ``check_attention.evaluate(fn)`` returns the result without showing or raising (tests, tools);
* a function still raising ``NotImplementedError`` is *not attempted*; an exception, a time-out or a
  strange value from the learner's code is a diagnosis that shows the learner's own line; a bug in the
  check itself is an *error* verdict, never the learner's failure;
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

from .boundary import (DEFAULT_TIMEOUT, RECORD_ENV, Learner, LearnerNotAttempted, LearnerRaised, LearnerTimedOut,
                       LocalSession, RecordingSession, ReplayMismatch, ReplaySession, Session)
from .compare import Failure, Mistake, as_tensor, expect_close, expect_equal, expect_finite, expect_shape, fail, fmt
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
#: A check still running after this many seconds shows live progress in its cell.
PROGRESS_AFTER = 2.0
#: Names a notebook's first cell defines; a NameError for one of them means the kernel was restarted.
_IMPORTED_NAMES = {"torch", "F", "nn", "math", "np", "numpy", "plt"}


def _a(word: str) -> str:
    return f"an {word}" if word[:1].lower() in "aeiou" else f"a {word}"


def learner_error(exc: LearnerRaised | LearnerTimedOut, *, tried: str = "", expected: str = "a result",
                  cause: str = "", fix: str = "") -> Diagnosis:
    """The diagnosis for an exception raised by (or a time-out of) the learner's code.

    ``cause``/``fix`` may add what the check knows about the usual reason; they are used only when
    nothing more specific is known (a NameError after a kernel restart is always named as such)."""
    tried = tried or exc.call
    if isinstance(exc, LearnerTimedOut):
        return Diagnosis(f"stopped after {exc.seconds:g} s of computing", tried=tried,
                         got=f"no result after {exc.seconds:g} s of computing, so the check stopped your code",
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
                         cause="the kernel was restarted (or the first cell never ran), so the notebook's imports are gone",
                         fix="run the notebook's first code cell (the imports), then your exercise cell, then this one")
    if exc.type_name in ("SystemExit", "KeyboardInterrupt") or not exc.type_name.endswith(("Error", "Exception", "Warning")):
        cause = cause or f"your code raised {exc.type_name}, which stops programs rather than reporting a problem"
    return Diagnosis(f"your code raised {exc.type_name}", tried=tried, got=got, expected=expected,
                     cause=cause, fix=fix or ("fix the line shown above" if where else "read the error message: it names what went wrong"))


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
                 record: Path | None = None) -> CheckResult:
        """Run the check and return its result. The exercise is ``target``, else ``self.name`` looked up in
        ``namespace``. ``session`` replaces the live exercise (a :class:`~.boundary.ReplaySession`);
        ``record`` also logs every operation to that file."""
        if session is None:
            if target is _MISSING:
                namespace = namespace if namespace is not None else {}
                if self.name not in namespace:
                    syntax = _syntax_error_in_history(self.name, namespace)
                    if syntax is not None:
                        return CheckResult(self.exercise, Status.FAILED, syntax.summary, syntax)
                    return _not_attempted(self.exercise, self.name, "undefined")
                target = namespace[self.name]
            session = RecordingSession(lambda: target, record) if record else LocalSession(lambda: target)
        learner = Learner(session, self.name, timeout=self.timeout)
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
            self._preflight(learner)
            summary = self.body(learner)
        except LearnerNotAttempted:
            return _not_attempted(self.exercise, self.name, "stub")
        except Failure as exc:
            return CheckResult(self.exercise, Status.FAILED, exc.diagnosis.summary, exc.diagnosis)
        except (LearnerRaised, LearnerTimedOut) as exc:
            d = learner_error(exc, expected=self.expects)
            return CheckResult(self.exercise, Status.FAILED, d.summary, d)
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
        """Check the exercise: in a notebook, show the verdict and raise with the diagnosis unless passed."""
        shell = _ipython()
        namespace = shell.user_ns if shell is not None else sys._getframe(1).f_globals
        folder = os.environ.get(RECORD_ENV)
        record = Path(folder) / f"{self.exercise}.npz" if folder else None
        live = _Progress(self.name) if shell is not None and not os.environ.get(QUIET_ENV) else None
        try:
            result = self.evaluate(target, namespace=namespace, record=record)
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

    def __init__(self, name: str):
        self.name, self.start, self.handle = name, time.monotonic(), None
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
            self.handle.update({"text/plain": f"… checking `{self.name}`: {seconds:.0f} s so far "
                                              "(each call of your code may compute for at most "
                                              f"{DEFAULT_TIMEOUT:g} s)"}, raw=True)

    def stop(self):
        self._done.set()
        self._thread.join()
        return self.handle


def present(result: CheckResult, shell: Any = None, handle: Any = None) -> None:
    """Show a result where the check ran: the data and the verdict line (in place of a progress line,
    if one is showing), then raise unless passed."""
    if shell is not None:
        from IPython.display import display

        if handle is not None:
            handle.update(result.mimebundle(), raw=True)
        else:
            display(result.mimebundle(), raw=True)
    elif result.passed:
        print(result.headline())
    exc = result.exception()
    if exc is not None:
        raise exc
