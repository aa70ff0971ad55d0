"""Exercise identity in cell metadata (attn_course.tools.nbmeta): written from tags the nbgrader way."""

from __future__ import annotations

import nbformat

from attn_course.tools import nbmeta


def _nb(*cells):
    out = []
    for source, tags in cells:
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["tags"] = list(tags)
        out.append(cell)
    return nbformat.v4.new_notebook(cells=out)


def test_tags_become_nbgrader_metadata_and_raises_exception():
    nb = _nb(("import torch", ["setup"]),
             ("def attention(Q, K, V):\n    ### BEGIN SOLUTION\n    pass\n    ### END SOLUTION", ["exercise"]),
             ("from m import check_attention\ncheck_attention()", ["check"]),
             ("class Net:\n    pass", ["exercise", "extra"]),
             ("check_Net()", ["check"]))
    assert nbmeta.normalize(nb, "nb") == []
    ex, check = nb.cells[1].metadata, nb.cells[2].metadata
    assert ex["nbgrader"] == {"grade": False, "grade_id": "attention", "locked": False, "schema_version": 3,
                              "solution": True, "task": False}
    assert check["nbgrader"]["grade"] and check["nbgrader"]["grade_id"] == "check_attention"
    assert check["nbgrader"]["points"] == 1 and check["nbgrader"]["locked"]
    assert ex["tags"] == ["exercise", "raises-exception"] and check["tags"] == ["check", "raises-exception"]
    assert nb.cells[3].metadata["tags"] == ["exercise", "extra", "raises-exception"]
    assert "nbgrader" not in nb.cells[0].metadata and nbmeta.role(nb.cells[0]) == nbmeta.SETUP
    assert [(e.id, e.cell, e.check_cell) for e in nbmeta.exercises(nb)] == [("attention", 1, 2), ("Net", 3, 4)]
    assert nbmeta.exercise_id(nb.cells[2]) == "attention"
    before = nbformat.writes(nb)
    nbmeta.normalize(nb)
    assert nbformat.writes(nb) == before  # idempotent


def test_problems_are_reported():
    nb = _nb(("x = 1", ["exercise"]), ("check_x()", ["check"]),
             ("def f():\n    pass", ["exercise"]), ("def f():\n    pass", ["exercise"]))
    problems = nbmeta.normalize(nb, "nb")
    assert any("must define a function" in p for p in problems)
    assert any("no exercise cell above" in p for p in problems)
    assert any("second exercise named 'f'" in p for p in problems)


def test_defined_name_survives_a_syntax_error():
    assert nbmeta.defined_name("import x\n\ndef attention(Q, K:\n    pass") == "attention"
    assert nbmeta.defined_name("x = 1") is None
