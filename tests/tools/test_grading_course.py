"""The course a submission is graded against (attn_course.tools.grading.course)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from attn_course.checks.core import Check
from attn_course.tools.grading.course import SOLUTIONS_ENV, Course, CourseNotFound, find_solutions

from ._grading import NOTEBOOK_03, NOTEBOOK_05, course, course_dir


def test_the_solutions_are_found_from_the_course_folder_or_named(tmp_path, monkeypatch):
    monkeypatch.delenv(SOLUTIONS_ENV, raising=False)
    monkeypatch.delenv("ATTN_COURSE_ROOT", raising=False)
    assert find_solutions(cwd=course_dir() / "notebooks") == (course_dir() / "solutions").resolve()
    assert find_solutions(course_dir() / "solutions", cwd=tmp_path) == (course_dir() / "solutions").resolve()
    monkeypatch.setenv(SOLUTIONS_ENV, str(course_dir() / "solutions"))
    assert find_solutions(cwd=tmp_path) == (course_dir() / "solutions").resolve()


def test_no_solutions_gives_a_message_saying_what_to_pass(tmp_path, monkeypatch):
    monkeypatch.delenv(SOLUTIONS_ENV, raising=False)
    monkeypatch.delenv("ATTN_COURSE_ROOT", raising=False)
    with pytest.raises(CourseNotFound, match="--solutions FOLDER"):
        find_solutions(cwd=tmp_path)
    with pytest.raises(CourseNotFound, match="not a folder of the course's solution notebooks"):
        find_solutions(tmp_path / "nowhere", cwd=tmp_path)


@pytest.mark.slow  # a fresh process, kernel or fork server: seconds
def test_installed_outside_a_checkout_the_grade_command_says_what_to_do(tmp_path):
    """A non-editable install has no notebooks: the command must say so, not grade everything wrong."""
    done = subprocess.run([sys.executable, "-m", "attn_course", "grade", "x.ipynb"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--solutions FOLDER" in done.stdout and "does not include the notebooks" in done.stdout


def test_checks_are_resolved_from_the_course_check_cells_and_imported_first():
    nb = course().notebooks[NOTEBOOK_05]
    assert list(nb.exercises) == ["attention", "score_matrix_bytes"]
    assert all(isinstance(ex.check, Check) and ex.check.exercise == ex.id for ex in nb.exercises.values())
    assert nb.exercises["attention"].name == "attention"
    assert "raise NotImplementedError()" in nb.exercises["attention"].stub
    assert "attn_course.checks.attention" in sys.modules and "attn_course.dot" in sys.modules
    assert course().ungraded == ["00_setup"]
    assert set(course().notebooks) == {NOTEBOOK_03, NOTEBOOK_05}


def test_assigned_notebooks_can_be_chosen_by_number(tmp_path):
    assert Course(course_dir() / "solutions", assigned=["05"]).assigned == [NOTEBOOK_05]
    with pytest.raises(CourseNotFound, match="--assigned 07"):
        Course(course_dir() / "solutions", assigned=["07"])


def test_a_check_that_cannot_be_replayed_is_named(tmp_path):
    import nbformat

    shutil.copytree(course_dir() / "solutions", tmp_path / "solutions")
    path = tmp_path / "solutions" / f"{NOTEBOOK_05}.ipynb"
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if "check_score_matrix_bytes()" in cell.source:
            cell.source = "from attn_course.checks.core import fail as check_score_matrix_bytes\ncheck_score_matrix_bytes()"
    nbformat.write(nb, path)
    fresh = Course(tmp_path / "solutions")
    assert "not a check that can be replayed" in fresh.notebooks[NOTEBOOK_05].exercises["score_matrix_bytes"].problem
    assert not fresh.changed()
    path.write_text(path.read_text() + " ")
    assert fresh.changed()
