"""Both sides of every notebook: the exercise copies are generated from the solutions and up to date,
and an unfilled exercise notebook runs top to bottom — with no error allowed outside exercise and check
cells — while every check reports "not attempted" (read from the result data, never from text).

(That every solution passes its checks and reproduces its stored outputs is proven by nbval, which runs
solutions/ in strict mode as part of the same test command.)
"""

from __future__ import annotations

import io
from pathlib import Path

import nbformat
import pytest

from attn_course import registry
from attn_course.checks.result import MIME, Status, result_from_output
from attn_course.tools import nbmeta
from attn_course.tools.exercises import BEGIN, END, generate, make_exercise
from attn_course.tools.runner import execute

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


def read(path):
    return nbformat.read(path, as_version=4)


def test_exercise_notebooks_are_up_to_date():
    report = io.StringIO()
    code = generate(ROOT / "solutions", ROOT / "notebooks", check_only=True, out=report)
    assert code == 0, "notebooks/ is stale; run `python -m attn_course exercises`\n" + report.getvalue()


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_solutions_ship_executed_in_order_and_normalised(solution):
    nb = read(solution)
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    assert None not in counts, f"{solution.name}: some code cells were never executed"
    assert counts == sorted(counts), f"{solution.name}: cells were not executed top to bottom"
    before = nbformat.writes(nb)
    assert nbmeta.normalize(nb, solution.name) == []
    assert nbformat.writes(nb) == before, f"{solution.name}: nbgrader metadata is stale; run `python -m attn_course exercises`"
    assert any(nbmeta.role(c) == nbmeta.SETUP for c in nb.cells), f"{solution.name}: no cell is tagged setup"


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_exercise_copies_ship_clean(solution):
    nb = read(ROOT / "notebooks" / solution.name)
    for index, cell in enumerate(nb.cells):
        assert BEGIN not in cell.source and END not in cell.source, f"cell {index} still holds a solution marker"
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"cell {index} has stored output"


WITH_EXERCISES = [p for p in SOLUTIONS if registry.by_slug(p.stem).exercises]


@pytest.mark.slow
@pytest.mark.parametrize("solution", WITH_EXERCISES, ids=lambda p: p.stem)
def test_unfilled_notebook_runs_to_the_end_and_reports_not_attempted(solution, tmp_path):
    # Generated afresh: a learner's edits to notebooks/ never decide this test.
    exercise = make_exercise(read(solution), f"solutions/{solution.name}")
    run = execute(exercise, cwd=tmp_path, cell_timeout=120, allow_errors=False)
    assert run.problem is None, f"Run All stopped early: {run.problem}"
    executed = [c for c in run.notebook.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in executed if c.source.strip()), "a cell was never run"
    expected = list(registry.by_slug(solution.stem).exercises)
    results = {}
    for ex in nbmeta.exercises(run.notebook):
        found = [r for r in map(result_from_output, run.notebook.cells[ex.check_cell].outputs) if r]
        assert len(found) == 1, f"{ex.id}: its check cell carries {len(found)} results ({MIME})"
        results[ex.id] = found[0]
    assert list(results) == expected
    wrong = {k: r.status for k, r in results.items() if r.status is not Status.NOT_ATTEMPTED}
    assert not wrong, f"checks that did not report 'not attempted': {wrong}"
    # Only check cells may raise: demonstrations use the course's reference code.
    allowed = {ex.check_cell for ex in nbmeta.exercises(run.notebook)}
    others = sorted(set(run.errors) - allowed)
    assert not others, [run.notebook.cells[i].source.splitlines()[0] for i in others]
