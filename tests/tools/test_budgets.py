"""bench-course (attn_course.tools.budgets): time and peak memory of a notebook against the budgets."""

from __future__ import annotations

import io
import json

import nbformat
import pytest

from attn_course.tools import budgets


def _tiny(cells: list[str]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


@pytest.mark.slow
def test_bench_course_on_a_tiny_notebook(tmp_path):
    path = tmp_path / "tiny.ipynb"
    nbformat.write(_tiny(["big = bytearray(50 * 2**20)", "print(len(big))"]), path)
    out = io.StringIO()
    target = tmp_path / "bench.json"
    status = budgets.main([str(path)], repeats=1, json_path=str(target), out=out)
    (row,) = json.loads(target.read_text())
    # "over time" only where this machine is too busy to run two cells in 30 s: the verdict is no test of its speed
    assert row["notebook"] == "tiny.ipynb" and row["verdict"] in ("ok", "over time"), out.getvalue()
    assert status == (0 if row["verdict"] == "ok" else 1)
    assert 50 < row["peak_rss_mb"] < 1024  # the 50 MB block is seen
    assert "tiny.ipynb" in out.getvalue() and "budgets: 30 s, 1 GB" in out.getvalue()

    failing = tmp_path / "failing.ipynb"
    nbformat.write(_tiny(["raise RuntimeError('boom')"]), failing)
    assert budgets.main([str(failing)], repeats=1, json_path=None, out=io.StringIO()) == 1
