"""run-solutions: a solution notebook is written back only when every cell that must pass did."""

from __future__ import annotations

import pytest

import io

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from attn_course.tools.solutions import run_in_place


def _notebook(path, *cells):
    nbformat.write(new_notebook(cells=list(cells)), path)
    return path.read_text()


@pytest.mark.slow  # a fresh process, kernel or fork server: seconds
def test_a_demonstration_tagged_raises_exception_may_raise_and_the_notebook_is_written(tmp_path):
    path = tmp_path / "00_demo.ipynb"
    _notebook(path, new_code_cell("x = 1"),
              new_code_cell("raise ValueError('shown on purpose')", metadata={"tags": ["raises-exception"]}),
              new_code_cell("print(x + 1)"))
    out = io.StringIO()
    assert run_in_place(path, out), out.getvalue()
    cells = nbformat.read(path, as_version=4).cells
    assert cells[1].outputs[0]["ename"] == "ValueError" and cells[2].outputs[0]["text"] == "2\n"


@pytest.mark.slow  # a fresh process, kernel or fork server: seconds
def test_an_exercise_that_raises_fails_even_with_the_tag_and_the_file_is_left_alone(tmp_path):
    path = tmp_path / "01_demo.ipynb"
    exercise = new_code_cell("def f():\n    raise NotImplementedError()\nf()",
                             metadata={"tags": ["exercise", "raises-exception"]})
    before = _notebook(path, new_code_cell("x = 1"), exercise)
    out = io.StringIO()
    assert not run_in_place(path, out)
    assert "FAILED" in out.getvalue() and "[1]" in out.getvalue()
    assert path.read_text() == before


@pytest.mark.slow  # a fresh process, kernel or fork server: seconds
def test_an_untagged_cell_that_raises_fails(tmp_path):
    path = tmp_path / "02_demo.ipynb"
    before = _notebook(path, new_code_cell("1 / 0"))
    out = io.StringIO()
    assert not run_in_place(path, out) and path.read_text() == before
