"""Both sides of every notebook: the exercise copies are generated from the solutions and up to date,
and an unfilled exercise notebook runs top to bottom as front-ends that ignore the ``raises-exception``
tag run it (VS Code, Colab) — with no error in any cell — while every check reports "not attempted"
(read from the result data, never from text). Of an unfilled notebook, the run needs only the cells that
can run differently from the solution (:mod:`tests.notebooks.differ`); nbval runs all the others. A check
never grades a definition older than its exercise cell's last run, and under ``pytest --nbval-lax`` a
wrong answer still fails (the course's plugin).

(That every solution passes its checks and reproduces its stored outputs is proven by nbval, which runs
solutions/ in strict mode as part of the same test command.)
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from attn_course import registry
from attn_course.checks.result import MIME, Status, result_from_output
from attn_course.tools import nbmeta
from attn_course.tools.exercises import BEGIN, END, generate, make_exercise
from attn_course.tools.runner import execute
from tests.notebooks.differ import cells_that_can_differ
from tests.tools._grading import ATTENTION, BYTES, graded_cells_only

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


def read(path):
    return nbformat.read(path, as_version=4)


@pytest.mark.slow
def test_exercise_notebooks_are_up_to_date():
    report = io.StringIO()
    code = generate(ROOT / "solutions", ROOT / "notebooks", check_only=True, out=report)
    assert code == 0, "notebooks/ is stale; run `python -m attn_course exercises`\n" + report.getvalue()


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
@pytest.mark.slow
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


#: A kernel as a learner's front-end starts it: nothing asks checks to raise (see attn_course.checks.core.raises).
FRONT_END = {"ATTN_COURSE_STRICT": "0"}


def without_raises_tags(nb):
    """The notebook as VS Code and Colab run it: they ignore the `raises-exception` tag, so drop it."""
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags")
        if tags and nbmeta.RAISES in tags:
            cell.metadata["tags"] = [t for t in tags if t != nbmeta.RAISES]
    return nb


@pytest.mark.slow
@pytest.mark.parametrize("solution", WITH_EXERCISES, ids=lambda p: p.stem)
def test_unfilled_notebook_runs_to_the_end_and_reports_not_attempted(solution, tmp_path):
    # Generated afresh: a learner's edits to notebooks/ never decide this test. Run: the cells whose run can
    # differ from the solution's (tests/notebooks/differ.py; nbval runs every other cell, in the solution,
    # with no error allowed). Every `raises-exception` tag removed and errors not allowed: Run All must reach
    # the last cell where no front-end honours tags.
    solved = read(solution)
    exercise = make_exercise(solved, f"solutions/{solution.name}")
    kept = cells_that_can_differ(solved, exercise)
    exercise.cells = [c for i, c in enumerate(exercise.cells) if i in kept or c.cell_type != "code"]
    exercise = without_raises_tags(exercise)
    assert not any(nbmeta.RAISES in c.get("metadata", {}).get("tags", []) for c in exercise.cells)
    run = execute(exercise, cwd=tmp_path, cell_timeout=120, allow_errors=False, env=FRONT_END)
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
    # No cell raises: a check shows its verdict without raising, demonstrations use the course's code.
    assert not run.errors, [run.notebook.cells[i].source.splitlines()[0] for i in run.errors]
    check_cells = [run.notebook.cells[ex.check_cell] for ex in nbmeta.exercises(run.notebook)]
    for cell in check_cells:  # what the learner sees at once: the diagnosis, in a box with a red edge
        shown = [o for o in cell.outputs if MIME in o.get("data", {})][0]["data"]
        assert "text/html" in shown and "#c62828" in shown["text/html"] and "to do" in shown["text/plain"]


def _answered(source: str, answers: dict[str, str]) -> nbformat.NotebookNode:
    """The exercise notebook with these answers, cut to what grading runs: its set-up, exercise and check
    cells, in order (the demonstrations between them are other tests' business, and cost a minute)."""
    nb = graded_cells_only(without_raises_tags(make_exercise(read(source), f"solutions/{source.name}")))
    for ex in nbmeta.exercises(nb):
        if ex.id in answers:
            nb.cells[ex.cell].source = answers[ex.id]
    return nb


STUB_ATTENTION = "def attention(Q, K, V, mask=None):\n    raise NotImplementedError()\n"
SYNTAX_ATTENTION = ("def attention(Q, K, V, mask=None):\n    scores = (Q @ K.transpose(-2, -1)\n"
                    "    return torch.softmax(scores, dim=-1) @ V\n")
WRONG_BYTES = BYTES.replace("* itemsize)", "* itemsize * 2)")  # twice the bytes


@pytest.mark.slow
def test_a_check_never_grades_a_definition_older_than_its_cells_last_run(tmp_path):
    """In one kernel: the stub, then a syntax error in a second run of the exercise cell; a right answer,
    then a run that raises before redefining it. Each check names the failed run, with its line."""
    source = ROOT / "solutions" / "05_attention.ipynb"
    nb = _answered(source, {"attention": STUB_ATTENTION, "score_matrix_bytes": BYTES})
    index = {ex.id: ex for ex in nbmeta.exercises(nb)}
    # The second run of each exercise cell, right after its first (as a learner's edit and Shift+Enter).
    nb.cells.insert(index["score_matrix_bytes"].cell + 1,
                    nbformat.v4.new_code_cell("import no_such_module\n" + WRONG_BYTES))
    nb.cells.insert(index["attention"].cell + 1, nbformat.v4.new_code_cell(SYNTAX_ATTENTION))
    run = execute(nb, cwd=tmp_path, cell_timeout=120, allow_errors=True, env=FRONT_END)
    assert run.problem is None, run.problem
    results = {r.exercise: r for c in run.notebook.cells if c.cell_type == "code"
               for r in map(result_from_output, c.outputs) if r}
    attention, nbytes = results["attention"], results["score_matrix_bytes"]
    assert attention.status is Status.FAILED, attention.text()  # not "not attempted" (the stub)
    assert attention.summary == "syntax error in your exercise cell (line 2)"
    assert "'(' was never closed" in attention.diagnosis.got and "^" in attention.diagnosis.got
    assert nbytes.status is Status.FAILED, nbytes.text()  # not "passed" (the earlier right answer)
    assert nbytes.summary == "your exercise cell raised ModuleNotFoundError (line 1)"
    assert "import no_such_module" in nbytes.diagnosis.got and "earlier run" in nbytes.diagnosis.cause
    # Only the two failed runs raised; the check cells did not.
    assert [run.notebook.cells[i].source.split("\n")[0] for i in run.errors] == [
        SYNTAX_ATTENTION.split("\n")[0], "import no_such_module"]


@pytest.mark.slow
def test_a_wrong_answer_still_fails_pytest_nbval_lax(tmp_path):
    """The course's pytest plugin judges each check cell by the result it displayed."""
    nb = _answered(ROOT / "solutions" / "05_attention.ipynb",
                   {"attention": ATTENTION, "score_matrix_bytes": WRONG_BYTES})
    nbformat.write(nb, tmp_path / "answered.ipynb")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTN_COURSE_", "PYTEST_"))}
    done = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "-p",
                           "no:randomly", "--nbval-lax", "--nbval-current-env", "answered.ipynb", "-q"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "check not passed: ✗ score_matrix_bytes" in out and "1 failed" in out, out
    assert "check not passed: ✗ attention" not in out, out
