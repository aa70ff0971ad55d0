"""What the tests share (fixtures): running a check on a function and asserting on its verdict.

``rejects(check, fn, *phrases)`` asserts the check fails ``fn`` and that every phrase appears in its
diagnosis (summary, got, expected, cause, to do); ``accepts(check, fn)`` asserts it passes, and
``unfinished`` is an exercise stub. Every result is also pushed through record → replay, so each
pitfall test proves as well that the grader, replaying the log, reaches the same verdict.
"""

from __future__ import annotations

import pytest
import torch

from attn_course.checks.boundary import ReplaySession
from attn_course.checks.result import CheckResult, Status


# Tests use small tensors: one thread each avoids oversubscribing the cores when pytest-xdist runs
# several test processes (2 workers × 2 torch threads on a 2-core machine was 4× slower).
torch.set_num_threads(1)


def _evaluate(check, fn, tmp_path_factory) -> CheckResult:
    log = tmp_path_factory.mktemp("log") / f"{check.exercise}.npz"
    live = check.evaluate(fn, record=log)
    replayed = check.evaluate(session=ReplaySession(log))
    assert replayed.to_json() == live.to_json(), f"replay differs from the live run:\n{live.text()}\n---\n{replayed.text()}"
    return live


@pytest.fixture
def rejects(tmp_path_factory):
    def run(check, fn, *phrases: str, status: Status = Status.FAILED) -> CheckResult:
        result = _evaluate(check, fn, tmp_path_factory)
        assert result.status is status, f"expected {status}, got:\n{result.text()}"
        text = result.text()
        for phrase in phrases:
            assert phrase in text, f"{phrase!r} not in:\n{text}"
        return result

    return run


@pytest.fixture
def accepts(tmp_path_factory):
    def run(check, fn) -> CheckResult:
        result = _evaluate(check, fn, tmp_path_factory)
        assert result.status is Status.PASSED, result.text()
        return result

    return run


@pytest.fixture
def unfinished():
    def stub(*args, **kwargs):
        raise NotImplementedError()

    return stub
