"""The learner process's runner (attn_course.tools.grading.learner): it reports each cell, interrupts
one that runs too long, and survives what learner code raises."""

from __future__ import annotations

import time

import pytest

from attn_course.checks.boundary import CALL_TIMEOUT_ENV, Learner, LearnerTimedOut, LocalSession, capped_timeout
from attn_course.tools.grading.learner import _cell_error
from attn_course.tools.grading.plan import PlanCell
from attn_course.tools.grading.sandbox import Limits

from ._grading import TEST_LIMITS, grader


def test_a_cells_error_names_the_line_in_the_cell():
    try:
        exec(compile("x = 1\ny = 1 / 0\n", "<ipython-input-3-abc>", "exec"), {})
    except ZeroDivisionError as exc:
        assert _cell_error(exc) == {"type": "ZeroDivisionError", "message": "division by zero", "line": 2}
    assert _cell_error(SyntaxError("bad", ("<cell>", 4, 1, "x ="))) == {"type": "SyntaxError", "message": "bad",
                                                                        "line": 4}


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_sleeping_cells_are_interrupted_and_exits_do_not_end_the_run():
    limits = Limits(**{**TEST_LIMITS.__dict__, "cell_timeout": 1.0})
    cells = [PlanCell("added", "import time\ntime.sleep(600)"), PlanCell("added", "raise SystemExit(3)"),
             PlanCell("added", "import sys\nsys.exit()"), PlanCell("added", "x = 1")]
    run = grader().runner.run(cells, [], limits=limits)
    entries = [e for e in run.progress if "cell" in e]
    assert entries[0].get("timeout") and entries[0]["error"]["type"] == "KeyboardInterrupt"
    assert entries[1]["error"]["type"] == "SystemExit" and entries[2]["error"]["type"] == "SystemExit"
    assert "error" not in entries[3] and run.finished()


@pytest.mark.slow
def test_the_instructors_call_limit_caps_every_checks_own(monkeypatch):
    """Set in the learner process's environment (``grade --call-timeout``), the lower limit is the one
    every operation of every check runs under; a higher one changes nothing."""
    def waits(x):
        time.sleep(60)

    monkeypatch.setenv(CALL_TIMEOUT_ENV, "0.2")
    with pytest.raises(LearnerTimedOut) as stopped:
        Learner(LocalSession(lambda: waits), "waits", timeout=10.0)(1)
    assert stopped.value.seconds == 0.2
    monkeypatch.setenv(CALL_TIMEOUT_ENV, "100")
    assert capped_timeout(10.0) == 10.0
    monkeypatch.setenv(CALL_TIMEOUT_ENV, "not a number")
    assert capped_timeout(10.0) == 10.0
