"""What the tests share (fixtures): running a check on a function and asserting on its verdict.

``rejects(check, fn, *phrases)`` asserts the check fails ``fn`` and that every phrase appears in its
diagnosis (summary, got, expected, cause, to do); ``accepts(check, fn)`` asserts it passes, and
``unfinished`` is an exercise stub. In the whole suite every result is also pushed through record →
replay, so each pitfall test proves as well that the grader, replaying the log, reaches the same
verdict; the quick loop (``-m "not slow"``) leaves that round trip out (about a fifth of its time).

A learner's answer written in a test may raise a warning (``.var()`` of one sample, ``np.dot`` on a
tensor): that warning is the learner's, shown to them in the notebook, and is not shown here. A
warning from the course's own code is an error everywhere (``filterwarnings`` in pyproject.toml).

No test leaves global state behind for the next one (the suite runs in any order: ``-p randomly``):
a learner-side probe a test registers is removed after it.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from attn_course.checks.boundary import PROBES, ReplaySession
from attn_course.checks.result import CheckResult, Status


# Tests use small tensors: one thread each avoids oversubscribing the cores when pytest-xdist runs
# several test processes (2 workers × 2 torch threads on a 2-core machine was 4× slower).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _probes_restored():
    """Probes a test registers (or replaces) do not outlive it; probes a check module registers when a
    test first imports it stay, as they would in a notebook."""
    before = dict(PROBES)
    yield
    for name, fn in list(PROBES.items()):
        if name in before:
            PROBES[name] = before[name]
        elif not getattr(fn, "__module__", "").startswith("attn_course."):
            del PROBES[name]


def _quick_loop(config) -> bool:
    """True in the quick loop (``-m "not slow"``)."""
    return "not slow" in (config.getoption("markexpr", default="") or "")


def _evaluate(check, fn, tmp_path_factory, replay: bool = True) -> CheckResult:
    if not replay:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"tests\.")  # the learner's answer, written in a test
            return check.evaluate(fn)
    log = tmp_path_factory.mktemp("log") / f"{check.exercise}.npz"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"tests\.")  # the learner's answer, written in a test
        live = check.evaluate(fn, record=log)
    replayed = check.evaluate(session=ReplaySession(log))
    assert replayed.to_json() == live.to_json(), f"replay differs from the live run:\n{live.text()}\n---\n{replayed.text()}"
    return live


@pytest.fixture
def rejects(request, tmp_path_factory):
    replay = not _quick_loop(request.config)

    def run(check, fn, *phrases: str, status: Status = Status.FAILED) -> CheckResult:
        result = _evaluate(check, fn, tmp_path_factory, replay)
        assert result.status is status, f"expected {status}, got:\n{result.text()}"
        text = result.text()
        said = _said_without_the_echoed_line(result)
        for phrase in phrases:
            assert phrase in text, f"{phrase!r} not in:\n{text}"
            # A test's own line, echoed as "line N of your cell: …", holds the phrases it asks for: a phrase
            # quoted there must also be said by the check itself.
            assert phrase in said or not _quoted_in_the_echo(result, phrase), (
                f"{phrase!r} is only in the echo of the test's own line, not in what the check says:\n{text}")
        return result

    return run


def _echo(result: CheckResult) -> str:
    got = result.diagnosis.got if result.diagnosis else ""
    return got.split(" of your cell", 1)[1] if " of your cell" in got else ""


def _quoted_in_the_echo(result: CheckResult, phrase: str) -> bool:
    echo = _echo(result)
    return f'"{phrase}' in echo or f"'{phrase}" in echo


def _said_without_the_echoed_line(result: CheckResult) -> str:
    d = result.diagnosis
    if d is None:
        return result.text()
    got = d.got.split(" of your cell", 1)[0]
    return "\n".join([result.headline(), d.summary, d.tried, got, d.expected, d.cause, d.fix])


@pytest.fixture
def accepts(request, tmp_path_factory):
    replay = not _quick_loop(request.config)

    def run(check, fn) -> CheckResult:
        result = _evaluate(check, fn, tmp_path_factory, replay)
        assert result.status is Status.PASSED, result.text()
        return result

    return run


@pytest.fixture
def unfinished():
    def stub(*args, **kwargs):
        raise NotImplementedError()

    return stub
