"""Exercise generation (attn_course.tools.exercises): one source, nbgrader metadata written from tags,
and a learner's edited notebook never overwritten."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import nbformat
import pytest

from attn_course.tools import nbmeta
from attn_course.tools.exercises import (
    CODE_STUB,
    MARKDOWN_STUB,
    MarkerError,
    generate,
    make_exercise,
    strip_solution,
    updated_path,
)

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


def _learner_edits(target: Path) -> str:
    nb = nbformat.read(target, as_version=4)
    nb.cells[1].source = nb.cells[1].source.replace("raise NotImplementedError()", "return x  # my answer", 1)
    nbformat.write(nb, target)
    return target.read_text()


def test_a_learners_edits_survive_regeneration_whatever_the_solution_does(course):
    sol, ex = course
    _generate(sol, ex)
    target = ex / "01_x.ipynb"
    edited = _learner_edits(target)

    # The solution has not changed: the edited notebook is left alone, and --check does not call it stale.
    code, text = _generate(sol, ex)
    assert code == 0 and "kept" in text and target.read_text() == edited
    assert not updated_path(target).exists()
    assert _generate(sol, ex, check_only=True)[0] == 0

    # The maintainer changes the solution: the learner's notebook is still untouched, the new version
    # is written beside it, and the message says where.
    solution = nbformat.read(sol / "01_x.ipynb", as_version=4)
    solution.cells[0].source += "\nNew hint."
    nbformat.write(solution, sol / "01_x.ipynb")
    code, text = _generate(sol, ex)
    assert code == 0 and target.read_text() == edited
    beside = updated_path(target)
    assert beside.name == "01_x.updated.ipynb" and "New hint." in beside.read_text()
    assert str(beside) in text
    assert "reset" not in text.lower() and "overwr" not in text.lower()
    code, text = _generate(sol, ex, check_only=True)
    assert code == 0 and "EDITED" in text  # reported, not stale: nothing the learner should "fix"
    assert not any(p.name.endswith(".updated.updated.ipynb") for p in ex.iterdir())

    # An untouched generated notebook is simply rewritten.
    other = _generate(sol, ex)
    assert other[0] == 0


def test_generation_writes_nbgrader_metadata_into_the_solutions(course):
    sol, ex = course
    solution = nbformat.read(sol / "01_x.ipynb", as_version=4)
    assert "nbgrader" not in solution.cells[1].metadata
    code, text = _generate(sol, ex, check_only=True)
    assert code == 1 and "metadata" in text  # --check reports it, writes nothing
    assert "nbgrader" not in nbformat.read(sol / "01_x.ipynb", as_version=4).cells[1].metadata
    _generate(sol, ex)
    for folder in (sol, ex):
        cell = nbformat.read(folder / "01_x.ipynb", as_version=4).cells[1]
        assert cell.metadata["nbgrader"]["grade_id"] == "softmax" and cell.metadata["nbgrader"]["solution"]
        assert nbmeta.RAISES in cell.metadata["tags"]


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
