"""``python -m attn_course grade``: a hostile class gets a row or a named warning for everything, and
a learner's table fits a terminal (attn_course.tools.grading.commands)."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys

import nbformat
import pytest

from attn_course.tools.grading.commands import grade_class
from attn_course.tools.grading.sandbox import landlock_abi

from ._grading import (ATTENTION, BYTES, NOTEBOOK_03, NOTEBOOK_05, SOFTMAX, TEST_LIMITS, WRONG_ATTENTION, correct,
                       course_dir, grader, learner_notebook, write)

NAME = "José María Ñúñez"


def _read_csv(path):
    data = path.read_bytes()
    assert data.startswith(b"\xef\xbb\xbf"), f"{path.name} has no byte-order mark (Excel would garble accents)"
    return list(csv.DictReader(io.StringIO(data.decode("utf-8-sig"))))


def _mine(who: str):
    """A correct 05 written by ``who`` (their own comment: no two learners' files are the same)."""
    return learner_notebook(answers={"attention": f"# {who}'s answer\n" + ATTENTION, "score_matrix_bytes": BYTES})


def _hostile_class(root):
    write(_mine("ada"), root / "ada" / f"{NOTEBOOK_05}.ipynb")
    write(correct(NOTEBOOK_03), root / "ada" / f"{NOTEBOOK_03}.ipynb")
    (root / "bob").mkdir()
    write(learner_notebook(answers={"attention": WRONG_ATTENTION}), root / "cy" / f"{NOTEBOOK_05}.IPYNB")
    (root / "cy" / "work.zip").write_bytes(b"PK\x03\x04")
    (root / "cy" / "zero.ipynb").symlink_to("/dev/zero")
    (root / "cy" / f"{NOTEBOOK_03}.ipynb").symlink_to(course_dir() / "solutions" / f"{NOTEBOOK_03}.ipynb")
    if hasattr(os, "mkfifo"):
        os.mkfifo(root / "cy" / "pipe.ipynb")
    write(correct(NOTEBOOK_03), root / "dee" / ".ipynb_checkpoints" / f"{NOTEBOOK_03}-checkpoint.ipynb")
    write(_mine("eve"), root / "eve.ipynb")
    (root / "fay.ipynb").write_bytes((root / "eve.ipynb").read_bytes())
    write(_mine("gus"), root / "gus" / f"{NOTEBOOK_03}.ipynb")  # 05's work under 03's name
    write(nbformat.read(course_dir() / "solutions" / "00_setup.ipynb", as_version=4), root / "gus" / "00_setup.ipynb")
    write(learner_notebook(answers={"attention": ATTENTION}), root / "hal" / f"{NOTEBOOK_05} (1).ipynb")
    write(_mine("hal"), root / "hal" / f"{NOTEBOOK_05}-Copy1.ipynb")
    for slug in (NOTEBOOK_05, NOTEBOOK_03):
        write(nbformat.read(course_dir() / "solutions" / f"{slug}.ipynb", as_version=4),
              root / "ivy" / "course" / "solutions" / f"{slug}.ipynb")
    write(learner_notebook(answers={
        "attention": ATTENTION.replace("    scale =", "    raise KeyboardInterrupt\n    scale ="),
        "score_matrix_bytes": BYTES.replace("    itemsize", "    raise ValueError('not attempted')\n    itemsize")}),
        root / "kim" / f"{NOTEBOOK_05}.ipynb")
    plant = ("import subprocess\n"
             f"subprocess.run(['sh', '-c', 'echo planted > {root}/ada/planted.ipynb'])")
    write(learner_notebook(answers={"attention": ATTENTION}, added=[("attention", plant)]),
          root / "lou" / f"{NOTEBOOK_05}.ipynb")
    write(_mine(NAME), root / NAME / f"{NOTEBOOK_05}.ipynb")
    (root / "notes.txt").write_text("instructor's notes")


@pytest.mark.slow  # a fresh process, kernel or fork server: seconds
def test_a_hostile_class_gets_a_row_or_a_named_warning_for_everything(tmp_path):
    root = tmp_path / "srv" / "backups" / "class"  # an absolute path holding a folder named backups
    _hostile_class(root)
    out = tmp_path / "grades"
    log = io.StringIO()
    assert grade_class(root, out=out, solutions=str(course_dir() / "solutions"), stdout=log,
                       runner=grader().runner) == 0, log.getvalue()  # the shared runner: TEST_LIMITS, confined
    grades = _read_csv(out / "grades.csv")
    table = {r["learner"]: r for r in _read_csv(out / "table.csv")}
    summary = (out / "summary.md").read_text(encoding="utf-8")
    by = {(r["learner"], r["exercise"]): r for r in grades}
    learners = {"ada", "bob", "cy", "dee", "eve", "fay", "gus", "hal", "ivy", "kim", "lou", NAME}
    assert set(table) == learners and all(f"| {name} |" in summary for name in learners)
    assert table["ada"]["passed"] == "3" and table["ada"]["of"] == "3" and table[NAME]["passed"] == "2", \
        [r for r in grades if r["learner"] in ("ada", NAME)]
    assert list(table["ada"]) == ["learner", "passed", "of", "03_softmax:stable_softmax", "05_attention:attention",
                                  "05_attention:score_matrix_bytes", "flagged"]
    assert {r["status"] for r in grades if r["learner"] == "bob"} == {"not submitted"}
    assert by[("cy", "attention")]["status"] == "failed" and by[("cy", "stable_softmax")]["status"] == "not submitted"
    assert by[("dee", "stable_softmax")]["status"] == "passed" and "checkpoint" in by[("dee", "stable_softmax")]["flags"]
    assert "byte-identical file to fay's 05_attention" in by[("eve", "attention")]["flags"]
    assert "identical" not in by[("ada", "attention")]["flags"]
    assert by[("gus", "attention")]["status"] == "passed" and "saved as 03_softmax.ipynb" in by[("gus", "attention")]["flags"]
    assert not any(r["notebook"] == "00_setup" for r in grades)
    assert "2 copies: graded hal/05_attention-Copy1.ipynb" in by[("hal", "attention")]["flags"]
    assert {r["status"] for r in grades if r["learner"] == "ivy"} == {"not submitted"}
    assert by[("kim", "attention")]["status"] == "failed" and "KeyboardInterrupt" in by[("kim", "attention")]["message"]
    assert by[("kim", "score_matrix_bytes")]["status"] == "failed"
    assert by[("lou", "attention")]["status"] == "passed" and "starts subprocesses" in by[("lou", "attention")]["flags"]
    warnings = summary.split("## Warnings")[1]
    for entry in ("cy/work.zip", "cy/zero.ipynb: a symbolic link", "cy/03_softmax.ipynb: a symbolic link", "bob: no notebook",
                  "ivy/course/solutions/05_attention.ipynb: the course's own solution", "notes.txt",
                  "not graded, no exercises: 00_setup"):
        assert entry in warnings, entry
    if hasattr(os, "mkfifo"):
        assert "cy/pipe.ipynb: a FIFO" in warnings
    if landlock_abi() >= 1:
        assert not (root / "ada" / "planted.ipynb").exists()  # the kernel refused the subprocess's write


@pytest.mark.slow  # a fresh process, kernel or fork server: seconds
def test_a_file_planted_by_a_subprocess_is_noticed_and_attributed(tmp_path):
    """Without Landlock (forced off here) a subprocess can write; the grader notices and says where."""
    root = tmp_path / "class"
    write(correct(), root / "ada" / f"{NOTEBOOK_05}.ipynb")
    plant = f"import subprocess\nsubprocess.run(['sh', '-c', 'echo x > {root}/ada/planted.ipynb'])"
    write(learner_notebook(answers={"attention": ATTENTION}, added=[("attention", plant)]),
          root / "zed" / f"{NOTEBOOK_05}.ipynb")
    out = tmp_path / "grades"
    assert grade_class(root, out=out, solutions=str(course_dir() / "solutions"), limits=TEST_LIMITS, jobs=1,
                       confine=False, stdout=io.StringIO()) == 0
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert "ada/planted.ipynb was created while grading ran (in ada's folder; running then: zed/05_attention.ipynb)" \
        in summary, summary


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_assigned_notebooks_decide_the_table_and_an_extra_notebook_adds_no_rows(tmp_path):
    root = tmp_path / "class"
    write(correct(), root / "ada" / f"{NOTEBOOK_05}.ipynb")
    write(correct(NOTEBOOK_03), root / "ada" / f"{NOTEBOOK_03}.ipynb")
    write(correct(), root / "bob" / f"{NOTEBOOK_05}.ipynb")
    out = tmp_path / "grades"
    assert grade_class(root, out=out, solutions=str(course_dir() / "solutions"), runner=grader().runner,
                       assigned=["05"], stdout=io.StringIO()) == 0
    grades = _read_csv(out / "grades.csv")
    assert {r["notebook"] for r in grades} == {NOTEBOOK_05} and len(grades) == 4
    assert "ada/03_softmax.ipynb: 03_softmax is not assigned" in (out / "summary.md").read_text(encoding="utf-8")


def test_grading_refuses_to_write_into_the_class_folder(tmp_path):
    (tmp_path / "class").mkdir()
    log = io.StringIO()
    assert grade_class(tmp_path / "class", out=tmp_path / "class" / "grades", stdout=log) == 2
    assert "outside the submissions folder" in log.getvalue()


@pytest.mark.slow
def test_a_learners_table_fits_a_terminal_and_shows_no_library_warnings(tmp_path):
    broken = ATTENTION.replace("scale = 1.0 / math.sqrt(K.shape[-1])", "scale = (1.0 / math.sqrt(K.shape[-1])")
    write(learner_notebook(answers={"attention": broken, "score_matrix_bytes": BYTES}),
          tmp_path / "notebooks" / f"{NOTEBOOK_05}.ipynb")
    write(learner_notebook(NOTEBOOK_03, answers={"stable_softmax": SOFTMAX}),
          tmp_path / "notebooks" / f"{NOTEBOOK_03}.ipynb")
    done = subprocess.run([sys.executable, "-m", "attn_course", "grade", "--solutions", str(course_dir() / "solutions"),
                           "notebooks"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "WARNING" not in output and "Warning" not in output, output
    assert max(len(line) for line in done.stdout.splitlines()) <= 100, done.stdout
    assert "failed: syntax error in line 3" in done.stdout
    assert "── 1 of 2 passed" in done.stdout and "── 1 of 1 passed" in done.stdout
    assert "Total: 2 of 3 exercises passed (1 failed, 0 not attempted, 0 errors)" in done.stdout
    assert "run that cell" not in output


def test_exit_status_an_unattempted_exercise_is_not_a_failure_of_grading():
    from attn_course.tools.grading.commands import EXIT_STATUS, exit_status
    from attn_course.tools.grading.model import Row

    def rows(*statuses):
        return [Row("you", NOTEBOOK_05, f"ex{i}", status) for i, status in enumerate(statuses)]

    assert exit_status(rows("passed", "passed")) == 0
    assert exit_status(rows("passed", "not attempted")) == 0
    assert exit_status(rows("not attempted")) == 0
    assert exit_status(rows("passed", "failed", "not attempted")) == 1
    assert exit_status(rows("passed", "error")) == 1
    assert exit_status([]) == 2
    flat = " ".join(EXIT_STATUS.split())
    assert "0 when no exercise failed" in flat and "1 when at least one failed" in flat  # what --help says
