"""Both sides of every notebook: the exercise copies are generated from the solutions and up to date,
and an unfilled exercise notebook runs top to bottom with every check failing as "not attempted".

(That every solution passes its checks and reproduces its stored outputs is proven by nbval, which
runs solutions/ in strict mode as part of the same test command.)
"""

import io
from pathlib import Path

import nbformat
import pytest

from attn_course.exercises import BEGIN, END, generate
from attn_course.grading import NOT_ATTEMPTED, check_cells, outcome
from attn_course.runner import execute

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


def read(path):
    return nbformat.read(path, as_version=4)


def test_there_are_solution_notebooks():
    assert SOLUTIONS, "no notebooks in solutions/"


def test_exercise_notebooks_are_up_to_date():
    report = io.StringIO()
    code = generate(ROOT / "solutions", ROOT / "notebooks", check_only=True, out=report)
    assert code == 0, "notebooks/ is stale; run `python -m attn_course exercises`\n" + report.getvalue()


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_solutions_ship_executed_in_order(solution):
    counts = [c.execution_count for c in read(solution).cells if c.cell_type == "code" and c.source.strip()]
    assert None not in counts, f"{solution.name}: some code cells were never executed"
    assert counts == sorted(counts), f"{solution.name}: cells were not executed top to bottom"


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_exercise_copies_ship_clean(solution):
    nb = read(ROOT / "notebooks" / solution.name)
    for index, cell in enumerate(nb.cells):
        assert BEGIN not in cell.source and END not in cell.source, f"cell {index} still holds a solution marker"
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"cell {index} has stored output"


WITH_EXERCISES = [p for p in SOLUTIONS if check_cells(read(p))]


@pytest.mark.slow
@pytest.mark.parametrize("solution", WITH_EXERCISES, ids=lambda p: p.stem)
def test_unfilled_exercises_fail_every_check_as_not_attempted(solution, tmp_path):
    exercise = read(ROOT / "notebooks" / solution.name)
    expected = [name for _, name in check_cells(read(solution))]
    checks = check_cells(exercise)
    assert [name for _, name in checks] == expected

    run = execute(exercise, cwd=tmp_path, cell_timeout=120)
    assert run.problem is None, run.problem
    results = {name: outcome(run.notebook.cells[i], name) for i, name in checks}
    wrong = {name: r for name, r in results.items() if r[0] != NOT_ATTEMPTED}
    assert not wrong, f"checks that did not report 'not attempted': {wrong}"
    # Only check cells may fail: demonstrations use the course's reference code, so an unfinished
    # exercise never breaks another cell.
    other_errors = sorted(set(run.errors) - {i for i, _ in checks})
    sources = [run.notebook.cells[i].source.splitlines()[0] for i in other_errors]
    assert not other_errors, f"non-check cells raised in the unfilled notebook: {list(zip(other_errors, sources))}"
