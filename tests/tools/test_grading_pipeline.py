"""One submission from file to rows (attn_course.tools.grading.pipeline) — and the row itself (.model)."""

from __future__ import annotations

from attn_course.tools.grading import collect, files
from attn_course.tools.grading.model import STATUSES, Row

from ._grading import NOTEBOOK_05, course, grader


def test_an_unreadable_course_notebook_gets_one_error_row_per_exercise(tmp_path):
    (tmp_path / "ada").mkdir()
    (tmp_path / "ada" / f"{NOTEBOOK_05}.ipynb").write_text('{"cells": [')
    chosen, _, _ = collect.collect("ada", files.scan_class(tmp_path).learners["ada"], course())
    rows = grader().grade(chosen[0])
    assert [(r.exercise, r.status) for r in rows] == [("attention", "error"), ("score_matrix_bytes", "error")]
    assert rows[0].message.startswith("not valid JSON")


def test_a_file_that_is_no_course_notebook_gives_no_rows(tmp_path):
    sub = collect.Submission("ada", tmp_path / "x.ipynb", "ada/x.ipynb")
    assert grader().grade(sub) == []


def test_rows_cross_json_unchanged():
    row = Row("José", NOTEBOOK_05, "attention", "failed", "off by 2", ["a flag"], "a note", "ada/x.ipynb",
              seconds=1.5, cpu_seconds=1.2, peak_mb=200.0)
    assert Row.from_json(row.to_json()) == row
    assert STATUSES == ("passed", "failed", "not attempted", "error", "not submitted")
