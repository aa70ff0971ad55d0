"""Grading one learner: reading verdicts off check cells, the solution's checks replacing edited ones,
the table and files written, and the limits and guard a class grading relies on (on tiny notebooks)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from attn_course.grading import (
    ERROR,
    FAILED,
    GUARD_MARK,
    NOT_ATTEMPTED,
    PASSED,
    ClassRow,
    Row,
    Submission,
    _GUARD_SOURCE,
    check_cells,
    class_summary,
    collect_class,
    expand,
    format_table,
    grade_notebook,
    main,
    outcome,
    run_submission,
    with_reference_checks,
    write_rows,
)


def _cell(source, *, tags=(), outputs=(), count=1):
    cell = nbformat.v4.new_code_cell(source, execution_count=count, outputs=list(outputs))
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def _error(ename, evalue):
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[])


def _stream(text):
    return nbformat.v4.new_output("stream", name="stdout", text=text)


@pytest.mark.parametrize("outputs, status, phrase", [
    ([_stream("✓ stable softmax: matches torch.softmax\n")], PASSED, ""),
    ([_error("CheckFailed", "stable_softmax: not attempted yet")], NOT_ATTEMPTED, "not attempted"),
    ([_error("AssertionError", "stable_softmax: rows sum to 2 — divide by the sum")], FAILED, "rows sum to 2"),
    ([_error("KeyboardInterrupt", "")], FAILED, "timed out"),
    ([_error("NameError", "name 'stable_softmax' is not defined")], FAILED, "deleted"),
    ([_error("ZeroDivisionError", "division by zero")], FAILED, "ZeroDivisionError"),
    ([_stream("all fine\n")], FAILED, "no verdict"),
])
def test_outcome_reads_the_verdict(outputs, status, phrase):
    got, message = outcome(_cell("check_stable_softmax(stable_softmax)", outputs=outputs), "stable_softmax")
    assert got == status and phrase in message
    assert not message.startswith("stable_softmax:")  # the exercise's name is not repeated


def test_a_check_that_never_ran_is_an_error():
    assert outcome(_cell("check_x(x)", count=None), "x")[0] == ERROR


def test_check_cells_prefers_tags_and_falls_back_to_calls():
    tagged = nbformat.v4.new_notebook(cells=[_cell("check_a(a)", tags=["check"]), _cell("check_b(b)")])
    assert check_cells(tagged) == [(0, "a")]
    untagged = nbformat.v4.new_notebook(cells=[_cell("x = 1"), _cell("check_b(b)")])
    assert check_cells(untagged) == [(1, "b")]


def test_reference_checks_replace_edited_and_restore_deleted_cells():
    solution = nbformat.v4.new_notebook(cells=[_cell("check_a(a)", tags=["check"]), _cell("check_b(b)", tags=["check"])])
    learner = nbformat.v4.new_notebook(cells=[_cell("check_a(a)  # and print('✓')", tags=["check"])])
    fixed = with_reference_checks(learner, solution)
    assert [c.source for c in fixed.cells] == ["check_a(a)", "check_b(b)"]


def test_expand_skips_checkpoints_and_backups(tmp_path):
    for rel in ["a.ipynb", "sub/b.ipynb", ".ipynb_checkpoints/a-checkpoint.ipynb", "backups/a-1.ipynb", "c.txt"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    assert [p.relative_to(tmp_path).as_posix() for p in expand([str(tmp_path)])] == ["a.ipynb", "sub/b.ipynb"]


def test_table_and_files(tmp_path):
    rows = [Row("01.ipynb", "a", PASSED), Row("01.ipynb", "b", FAILED, "wrong axis"), Row("01.ipynb", "c", NOT_ATTEMPTED)]
    table = format_table(rows)
    assert "failed: wrong axis" in table and "Total: 1 of 3 exercises passed (1 failed, 1 not attempted, 0 errors)" in table
    write_rows(rows, tmp_path / "g.csv")
    write_rows(rows, tmp_path / "g.json")
    assert list(csv.DictReader((tmp_path / "g.csv").open()))[1]["message"] == "wrong axis"
    assert json.loads((tmp_path / "g.json").read_text())[2]["status"] == NOT_ATTEMPTED


def test_guard_refuses_writes_outside_the_working_folder(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("original")
    script = _GUARD_SOURCE + f"""
import os, shutil
results = []
for name, attempt in [
    ("write", lambda: open({str(outside)!r}, "w")),
    ("append", lambda: open({str(outside)!r}, "a")),
    ("os.open", lambda: os.open({str(outside)!r}, os.O_WRONLY)),
    ("remove", lambda: os.remove({str(outside)!r})),
    ("rename", lambda: os.rename({str(outside)!r}, "stolen.txt")),
    ("parent", lambda: open("../escaped.txt", "w")),
    ("rmtree", lambda: shutil.rmtree({str(tmp_path)!r})),
]:
    try:
        attempt()
        results.append(name + " allowed")
    except PermissionError as exc:
        assert {GUARD_MARK!r} in str(exc)
        results.append(name + " refused")
open("inside.txt", "w").write("ok")
os.makedirs("sub", exist_ok=True)
os.rename("inside.txt", "sub/moved.txt")
print(open({str(outside)!r}).read())  # reading stays allowed
print(";".join(results))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=work, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "original"
    assert all(r.endswith("refused") for r in lines[1].split(";")), lines[1]
    assert outside.read_text() == "original" and not (tmp_path / "escaped.txt").exists()
    assert (work / "sub" / "moved.txt").read_text() == "ok"


def _course(tmp_path) -> Path:
    """A one-notebook course with a check that needs no torch, so a kernel run takes seconds."""
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    cells = [
        _cell("def check_double(fn):\n"
              "    from attn_course.checks._core import NotAttempted\n"
              "    try:\n"
              "        got = fn(3)\n"
              "    except NotImplementedError:\n"
              "        raise NotAttempted('double: not attempted yet') from None\n"
              "    assert got == 6, f'double(3) returned {got!r}, expected 6'\n"
              "    print('✓ double works')", count=None),
        _cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
              tags=["exercise"], count=None),
        _cell("check_double(double)", tags=["check"], count=None),
    ]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, solutions / "01_double.ipynb")
    return solutions


@pytest.mark.slow
def test_grade_command_on_a_tiny_notebook(tmp_path):
    solutions = _course(tmp_path)
    out = io.StringIO()
    assert main([str(solutions / "01_double.ipynb")], cell_timeout=30, json_path=None,
                csv_path=str(tmp_path / "g.csv"), out=out) == 0
    assert "Total: 1 of 1 exercises passed" in out.getvalue()
    learner = tmp_path / "learner" / "01_double.ipynb"
    learner.parent.mkdir()
    nb = nbformat.read(solutions / "01_double.ipynb", as_version=4)
    nb.cells[1].source = "def double(x):\n    return x + 2"
    nb.cells[2].source = "print('✓ trust me')"  # an edited check: the solution's check is used
    nbformat.write(nb, learner)
    before = learner.read_bytes()
    rows = grade_notebook(learner, cell_timeout=30)
    assert [(r.exercise, r.status) for r in rows] == [("double", FAILED)]
    assert "returned 5" in rows[0].message
    assert learner.read_bytes() == before


@pytest.mark.slow
def test_class_submission_over_the_memory_limit_is_stopped(tmp_path):
    solutions = _course(tmp_path)
    nb = nbformat.read(solutions / "01_double.ipynb", as_version=4)
    nb.cells.insert(1, _cell("hog = []\nfor _ in range(40):\n    hog.append(bytearray(50 * 2**20))", count=None))
    path = tmp_path / "hog.ipynb"
    nbformat.write(nb, path)
    (row,) = run_submission(Submission("hog", path, solutions / "01_double.ipynb"), cell_timeout=30,
                            notebook_timeout=60, memory_limit_mb=300, address_space_mb=None)
    assert row.status == ERROR and "more than 300 MB" in row.message
    assert 250 < row.peak_mb < 1000 and row.seconds < 60


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="RLIMIT_AS is a POSIX limit")
def test_class_submission_address_space_limit(tmp_path):
    solutions = _course(tmp_path)
    nb = nbformat.read(solutions / "01_double.ipynb", as_version=4)
    nb.cells.insert(1, _cell("import mmap\nblock = mmap.mmap(-1, 6 * 2**30)", count=None))
    path = tmp_path / "01_double.ipynb"
    nbformat.write(nb, path)
    (row,) = run_submission(Submission("big", path, solutions / "01_double.ipynb"), cell_timeout=30,
                            notebook_timeout=60, memory_limit_mb=2048, address_space_mb=2048)
    assert row.status == PASSED  # the rest of the notebook ran
    assert "cell 1 raised OSError" in row.note and "allocate memory" in row.note


def test_collect_class_identifies_each_notebook(tmp_path):
    solutions = _course(tmp_path)
    klass = tmp_path / "class"
    (klass / "ann").mkdir(parents=True)
    (klass / "ann" / "01_double.ipynb").write_text("{}")  # by its file name, even unreadable
    nb = nbformat.read(solutions / "01_double.ipynb", as_version=4)
    nbformat.write(nb, klass / "ben.ipynb")  # by its check calls
    nb.metadata["attn_course"] = {"generated_from": "solutions/01_double.ipynb"}
    nb.cells = nb.cells[:1]
    nbformat.write(nb, klass / "cat.ipynb")  # by the generator's record
    nbformat.write(nbformat.v4.new_notebook(), klass / "dan.ipynb")  # not a course notebook
    found = {s.learner: s.solution for s in collect_class(klass, solutions)}
    target = solutions / "01_double.ipynb"
    assert found == {"ann": target, "ben": target, "cat": target, "dan": None}


def test_class_summary_names_the_most_common_diagnosis():
    rows = [ClassRow(f"l{i}", "01.ipynb", "softmax", FAILED, f"row {i} sums to {i + 2} — divide by the sum")
            for i in range(3)]
    rows += [ClassRow("l3", "01.ipynb", "softmax", FAILED, "NaN for large scores — subtract the max"),
             ClassRow("l4", "01.ipynb", "softmax", PASSED)]
    text = class_summary(rows, [])
    most = text.split("## Most often failed")[1]
    assert "| softmax (01.ipynb) | 4 |" in most and "divide by the sum (3)" in most
    assert "| l4 | 1 of 1 |" in text
