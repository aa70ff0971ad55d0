"""The grader holds a check to the same rule as a notebook: it grades a definition only from a clean run of
its exercise cell (attn_course.checks.cells). An older definition the learner's process still holds (an
earlier attempt in a cell the learner added) is never graded when the exercise cell failed: the verdict is
"failed", naming the error and its line — never "not attempted", never the older attempt's verdict."""

from __future__ import annotations

import pytest

from ._grading import ATTENTION, WRONG_ATTENTION, grade_notebook, learner_notebook, rows_text

pytestmark = pytest.mark.slow  # each test runs a notebook in the grader's forked learner process


def test_an_exception_before_the_definition_never_grades_an_older_one(tmp_path):
    # An earlier, right attempt sits in an added cell; the exercise cell stops at line 1.
    nb = learner_notebook(answers={"attention": "import no_such_module\n" + WRONG_ATTENTION},
                          added=[("before:attention", ATTENTION)])
    row = grade_notebook(nb, tmp_path)["attention"]
    assert row.status == "failed", rows_text([row])
    assert "ModuleNotFoundError in line 1" in row.message and "run it again" in row.message, row.message


def test_a_syntax_error_never_grades_an_older_definition(tmp_path):
    nb = learner_notebook(answers={"attention": WRONG_ATTENTION.replace("scores = ", "scores = (", 1)},
                          added=[("before:attention", ATTENTION)])
    row = grade_notebook(nb, tmp_path)["attention"]
    assert row.status == "failed" and "syntax" in row.message.lower(), rows_text([row])


def test_an_exercise_cell_that_raises_after_its_definition_fails_with_its_line(tmp_path):
    nb = learner_notebook(answers={"attention": ATTENTION + "attention(None, None, None)\n"})
    row = grade_notebook(nb, tmp_path)["attention"]
    assert row.status == "failed", rows_text([row])
    assert "AttributeError in line 3" in row.message and "run it again" in row.message, row.message


def test_an_exercise_cell_calling_its_own_stub_is_not_attempted(tmp_path):
    stub = "def attention(Q, K, V, mask=None):\n    raise NotImplementedError()\n\n\nattention(None, None, None)\n"
    row = grade_notebook(learner_notebook(answers={"attention": stub}), tmp_path)["attention"]
    assert row.status == "not attempted", rows_text([row])
