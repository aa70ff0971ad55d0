"""Only what a verdict needs runs in the learner's process (attn_course.tools.grading.plan)."""

from __future__ import annotations

import nbformat
import pytest

from attn_course import registry
from attn_course.tools import nbmeta
from attn_course.tools.grading import collect, files
from attn_course.tools.grading.course import Course
from attn_course.tools.grading.plan import plan

from ._grading import (ATTENTION, BYTES, CONSTANT_DEMO, FATAL_DEMO, NOTEBOOK_05, REPO, course, grader, learner_notebook,
                       rows_text)


def _kinds(cells):
    return [(c.kind, c.exercise) for c in cells]


def test_setup_exercises_course_checks_and_added_cells_run_demonstrations_do_not():
    nb = learner_notebook(answers={"attention": ATTENTION}, added=[("attention", "helper = 1")],
                          check_sources={"attention": "print('✓ passed')"})
    cells = plan(nb, course().notebooks[NOTEBOOK_05])
    # two set-up cells: the Colab one (it does nothing anywhere else) and the imports
    assert _kinds(cells) == [("setup", None), ("setup", None), ("exercise", "attention"), ("check", "attention"),
                             ("added", None), ("exercise", "score_matrix_bytes"), ("check", "score_matrix_bytes")]
    ours = course().notebooks[NOTEBOOK_05].exercises["attention"].check_source
    assert cells[3].source == ours and cells[3].name == "attention"  # the course's check, not the learner's
    assert not any(FATAL_DEMO in c.source or CONSTANT_DEMO in c.source for c in cells)


def test_a_deleted_check_cell_is_run_all_the_same_and_a_missing_exercise_is_checked_last():
    nb = learner_notebook(drop=("attention",))
    nb.cells = [c for c in nb.cells if nbmeta.role(c) != nbmeta.CHECK]
    cells = plan(nb, course().notebooks[NOTEBOOK_05])
    assert _kinds(cells)[-3:] == [("exercise", "score_matrix_bytes"), ("check", "score_matrix_bytes"),
                                  ("check", "attention")]


def test_a_demonstration_an_answer_needs_is_run():
    answer = ATTENTION.replace("scale = 1.0 /", "scale = SCALE_FLOOR + 1.0 /")
    cells = plan(learner_notebook(answers={"attention": answer}), course().notebooks[NOTEBOOK_05])
    assert ("demo", None) in _kinds(cells) and any(c.source == CONSTANT_DEMO for c in cells)
    assert not any(FATAL_DEMO in c.source for c in cells)


def test_a_notebook_without_metadata_is_planned_by_what_its_cells_define():
    nb = learner_notebook(answers={"attention": ATTENTION, "score_matrix_bytes": BYTES})
    for cell in nb.cells:
        cell.metadata.pop("nbgrader", None)
        cell.metadata.pop("tags", None)
    kinds = _kinds(plan(nb, course().notebooks[NOTEBOOK_05]))
    assert ("exercise", "attention") in kinds and ("check", "score_matrix_bytes") in kinds


def test_running_only_the_marked_cells_of_the_test_course_passes(tmp_path):
    solution = nbformat.read(course().notebooks[NOTEBOOK_05].path, as_version=4)
    cells = plan(solution, course().notebooks[NOTEBOOK_05], dependencies=False)
    assert {c.kind for c in cells} == {"setup", "exercise", "check"}


@pytest.mark.slow
@pytest.mark.parametrize("slug", [nb.slug for nb in registry.assigned()])
def test_the_marking_of_every_solution_notebook_is_complete(slug, tmp_path):
    """Set-up, exercise and check cells alone — no demonstration — pass every check of the solution."""
    real = _real_course()
    if slug not in real.notebooks:
        pytest.skip(f"{slug} is not among the course's solutions yet")
    path = REPO / "solutions" / f"{slug}.ipynb"
    sub = collect.read_submission(files.Found("solution", path, path.name), real)
    cells = plan(sub.nb, sub.notebook, dependencies=False)
    assert {c.kind for c in cells} <= {"setup", "exercise", "check"}
    run = grader().runner.run(cells, sub.notebook.exercise_ids())
    from attn_course.tools.grading.verdict import judge

    rows = judge(sub, cells, run)
    grader().runner.forget(run)
    assert [r.status for r in rows] == ["passed"] * len(rows), rows_text(rows)


_REAL: list[Course] = []


def _real_course() -> Course:
    if not _REAL:
        _REAL.append(Course(REPO / "solutions"))
    return _REAL[0]
