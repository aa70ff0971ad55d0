"""The maintainers' tools: exercise generation (one source), the notebook runner and bench-course."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import nbformat
import pytest

from attn_course import budgets
from attn_course.exercises import (
    CODE_STUB,
    MARKDOWN_STUB,
    MarkerError,
    generate,
    make_exercise,
    strip_solution,
)
from attn_course.runner import execute

SOLUTION_CELL = '''\
def softmax(x, dim=-1):
    """x: (..., n) -> (..., n)"""
    ### BEGIN SOLUTION
    shifted = x - x.max(dim, keepdim=True).values
    return shifted.exp() / shifted.exp().sum(dim, keepdim=True)
    ### END SOLUTION


class Net:
    def forward(self, x):
        if x is not None:
            ### BEGIN SOLUTION
            return x
            ### END SOLUTION'''


def _solution_notebook() -> nbformat.NotebookNode:
    code = nbformat.v4.new_code_cell(SOLUTION_CELL, execution_count=3,
                                     outputs=[nbformat.v4.new_output("stream", text="hi\n")])
    code.metadata["tags"] = ["exercise"]
    code.metadata["execution"] = {"iopub.status.busy": "2024-01-01"}
    md = nbformat.v4.new_markdown_cell("Why?\n\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION")
    nb = nbformat.v4.new_notebook(cells=[md, code])
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {}}
    return nb


def test_markers_become_stubs_at_their_indentation():
    out = strip_solution(SOLUTION_CELL, "code")
    lines = out.splitlines()
    assert lines[:2] == ["def softmax(x, dim=-1):", '    """x: (..., n) -> (..., n)"""']
    assert lines[2:4] == ["    " + CODE_STUB[0], "    " + CODE_STUB[1]]
    assert "            " + CODE_STUB[1] in lines  # the nested block keeps its deeper indentation
    assert "class Net:" in lines and "    def forward(self, x):" in lines
    assert "shifted" not in out and "BEGIN" not in out
    compile(out, "<stub>", "exec")  # still valid Python


def test_markdown_answers_become_a_prompt():
    assert strip_solution("Why?\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION", "markdown") == f"Why?\n{MARKDOWN_STUB}"


@pytest.mark.parametrize("source, phrase", [
    ("### BEGIN SOLUTION\nx = 1", "never closed"),
    ("x = 1\n### END SOLUTION", "without"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "inside another"),
])
def test_unbalanced_markers_are_reported(source, phrase):
    with pytest.raises(MarkerError, match=phrase):
        strip_solution(source, "code", "nb cell 3")


def test_exercise_has_no_outputs_counts_or_widget_state():
    nb = make_exercise(_solution_notebook(), "solutions/01_x.ipynb")
    code = nb.cells[1]
    assert code.outputs == [] and code.execution_count is None and "execution" not in code.metadata
    assert code.metadata["tags"] == ["exercise"]
    assert "widgets" not in nb.metadata
    assert nb.metadata["attn_course"]["generated_from"] == "solutions/01_x.ipynb"


@pytest.fixture
def course(tmp_path):
    sol, ex = tmp_path / "solutions", tmp_path / "notebooks"
    sol.mkdir()
    nbformat.write(_solution_notebook(), sol / "01_x.ipynb")
    return sol, ex


def _generate(sol, ex, **kw):
    out = io.StringIO()
    code = generate(sol, ex, out=out, **kw)
    return code, out.getvalue()


def test_check_detects_stale_missing_and_orphan_notebooks(course):
    sol, ex = course
    code, text = _generate(sol, ex, check_only=True)
    assert code == 1 and "STALE" in text and "missing" in text
    assert _generate(sol, ex)[0] == 0
    assert _generate(sol, ex, check_only=True)[0] == 0  # up to date, and deterministic

    nb = nbformat.read(sol / "01_x.ipynb", as_version=4)
    nb.cells[0].source += "\nMore text."
    nbformat.write(nb, sol / "01_x.ipynb")
    code, text = _generate(sol, ex, check_only=True)
    assert code == 1 and "differs from" in text

    _generate(sol, ex)
    (ex / "99_old.ipynb").write_text((ex / "01_x.ipynb").read_text())
    code, text = _generate(sol, ex, check_only=True)
    assert code == 1 and "ORPHAN" in text and "99_old.ipynb" in text


def test_learner_edits_are_backed_up_before_overwrite_and_the_path_printed(course):
    sol, ex = course
    _generate(sol, ex)
    target = ex / "01_x.ipynb"
    nb = nbformat.read(target, as_version=4)
    nb.cells[1].source = nb.cells[1].source.replace("raise NotImplementedError()", "return x  # my answer", 1)
    nbformat.write(nb, target)
    edited = target.read_text()

    solution = nbformat.read(sol / "01_x.ipynb", as_version=4)  # the maintainer edits the solution
    solution.cells[0].source += "\nNew hint."
    nbformat.write(solution, sol / "01_x.ipynb")
    code, text = _generate(sol, ex)
    assert code == 0
    match = re.search(r"saved\s+your edited \S+ as (\S+)", text)
    assert match, text
    backup = Path(match.group(1))
    assert backup.parent == ex / "backups" and backup.read_text() == edited
    assert "New hint." in target.read_text()

    # An untouched generated notebook is simply rewritten, with no backup.
    solution.cells[0].source += "\nAnother hint."
    nbformat.write(solution, sol / "01_x.ipynb")
    code, text = _generate(sol, ex)
    assert code == 0 and "saved" not in text and len(list((ex / "backups").iterdir())) == 1


def test_generation_reports_unbalanced_markers_and_unreadable_solutions(course):
    sol, ex = course
    bad = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1")])
    nbformat.write(bad, sol / "02_bad.ipynb")
    (sol / "03_broken.ipynb").write_text("{not json")
    code, text = _generate(sol, ex)
    assert code == 1
    assert "ERROR" in text and "02_bad.ipynb" in text and "never closed" in text
    assert "03_broken.ipynb" in text and "not a readable notebook" in text
    assert (ex / "01_x.ipynb").exists()  # the good one is still written


def _tiny(cells: list[str]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


@pytest.mark.slow
def test_runner_interrupts_a_cell_past_its_timeout_and_goes_on(tmp_path):
    nb = _tiny(["x = 1", "while True:\n    pass", "1 / 0", "import os\nprint(os.getcwd())"])
    run = execute(nb, cwd=tmp_path, cell_timeout=3, measure_memory=True)
    assert run.problem is None
    assert run.errors == [1, 2]
    assert run.notebook.cells[1].outputs[0]["ename"] == "KeyboardInterrupt"
    assert run.notebook.cells[3].outputs[0]["text"].strip() == str(tmp_path)
    assert run.peak_rss_bytes and 10 * 2**20 < run.peak_rss_bytes < 2**30
    assert len(run.notebook.cells) == 4  # the memory probe is removed again


@pytest.mark.slow
def test_bench_course_on_a_tiny_notebook(tmp_path):
    path = tmp_path / "tiny.ipynb"
    nbformat.write(_tiny(["big = bytearray(50 * 2**20)", "print(len(big))"]), path)
    out = io.StringIO()
    target = tmp_path / "bench.json"
    assert budgets.main([str(path)], repeats=1, json_path=str(target), out=out) == 0
    (row,) = json.loads(target.read_text())
    assert row["notebook"] == "tiny.ipynb" and row["verdict"] == "ok"
    assert 50 < row["peak_rss_mb"] < 1024  # the 50 MB block is seen
    assert "tiny.ipynb" in out.getvalue() and "budgets: 30 s, 1 GB" in out.getvalue()

    failing = tmp_path / "failing.ipynb"
    nbformat.write(_tiny(["raise RuntimeError('boom')"]), failing)
    assert budgets.main([str(failing)], repeats=1, json_path=None, out=io.StringIO()) == 1
