"""Results written as they come: a killed grader leaves what it graded and resumes; shards graded by
separate processes merge into one class table (attn_course.tools.grading.journal)."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from attn_course.tools.grading.journal import JOURNAL, ClassInfo, Journal, key_for, read_journals, shard_of
from attn_course.tools.grading.model import Row

from ._grading import ATTENTION, BYTES, NOTEBOOK_05, course_dir, learner_notebook, write


def test_the_journal_survives_a_cut_off_line_and_knows_what_is_done(tmp_path):
    journal = Journal(tmp_path)
    journal.describe_class(ClassInfo(learners=["ada", "bob"], assigned=[NOTEBOOK_05],
                                     exercises={NOTEBOOK_05: ["attention"]}, shards=["1/1"]))
    key = key_for("ada", "ada/05_attention.ipynb", "sha")
    journal.graded(key, [Row("ada", NOTEBOOK_05, "attention", "passed")], sha="s", code="c", attempted=1)
    journal.close()
    with (tmp_path / JOURNAL).open("a") as fh:
        fh.write('{"kind": "graded", "key": "cut off')  # the grader died mid-line
    again = Journal(tmp_path)
    assert again.done(key)[0].status == "passed" and again.done("other") is None
    info, entries = read_journals([tmp_path])
    assert info.learners == ["ada", "bob"] and len(entries) == 1
    assert Journal(tmp_path, fresh=True).done(key) is None


def test_lines_written_by_anyone_but_the_grader_are_removed_and_named(tmp_path):
    (tmp_path / JOURNAL).write_text('{"kind": "graded", "key": "cut off')  # an earlier grader died mid-line
    journal = Journal(tmp_path)
    key = key_for("ada")
    journal.graded(key, [Row("ada", NOTEBOOK_05, "attention", "failed")])
    assert journal.verify() is None
    forged = {"kind": "graded", "key": "x", "rows": [Row("ada", "03_softmax", "stable_softmax", "passed").to_json()]}
    with (tmp_path / JOURNAL).open("a") as fh:  # what a submission's subprocess could do without Landlock
        fh.write(json.dumps(forged) + "\n")
    warning = journal.verify()
    assert warning and "changed by something other than the grader" in warning
    journal.graded(key_for("bob"), [Row("bob", NOTEBOOK_05, "attention", "passed")])  # still appends after
    assert journal.close() is None
    _, entries = read_journals([tmp_path])
    assert sorted((e["rows"][0]["learner"], e["rows"][0]["notebook"]) for e in entries) == \
        [("ada", NOTEBOOK_05), ("bob", NOTEBOOK_05)]


@pytest.mark.parametrize("spec, expected", [(None, (1, 1)), ("2/3", (2, 3)), ("1/1", (1, 1))])
def test_shard_specs(spec, expected):
    assert shard_of(spec) == expected


@pytest.mark.parametrize("spec", ["0/2", "3/2", "a/b", "2"])
def test_bad_shard_specs_say_how_to_write_them(spec):
    with pytest.raises(ValueError, match="--shard"):
        shard_of(spec)


def _cli(*args: str, cwd: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "attn_course", "grade", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kwargs)


def _class(root: Path, learners: list[str], slow: str = "") -> None:
    for who in learners:
        answer = f"# {who}\n" + ATTENTION
        if who == slow:
            answer = "import time\ntime.sleep(8)\n" + answer
        write(learner_notebook(answers={"attention": answer, "score_matrix_bytes": BYTES}),
              root / who / f"{NOTEBOOK_05}.ipynb")


def _grades(out: Path) -> dict[tuple[str, str], str]:
    text = (out / "grades.csv").read_text(encoding="utf-8-sig")
    return {(r["learner"], r["exercise"]): r["status"] for r in csv.DictReader(io.StringIO(text))}


@pytest.mark.slow
def test_a_killed_grader_leaves_what_it_graded_and_the_same_command_resumes(tmp_path):
    root, out = tmp_path / "class", tmp_path / "grades"
    _class(root, ["ada", "bob", "cy"], slow="bob")
    args = ["--class", str(root), "--out", str(out), "--jobs", "1", "--assigned", "05",
            "--solutions", str(course_dir() / "solutions")]
    first = _cli(*args, cwd=tmp_path)
    journal = out / JOURNAL
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and '"kind": "graded"' not in (journal.read_text() if journal.exists() else ""):
        time.sleep(0.2)
    below = [p.pid for p in psutil.Process(first.pid).children(recursive=True)]  # fork servers, learner processes
    os.kill(first.pid, signal.SIGKILL)  # while bob's notebook sleeps
    first.wait()
    gone = psutil.wait_procs([psutil.Process(p) for p in below if psutil.pid_exists(p)], timeout=30)[1]
    assert not [p for p in gone if p.status() != psutil.STATUS_ZOMBIE], "processes outlived the killed grader"
    graded_before = journal.read_text().count('"kind": "graded"')
    assert graded_before >= 1
    if graded_before == 1:  # only ada's: bob's notebook, never graded, loses the sleep that held it while killed
        _class(root, ["bob"])
    second = _cli(*args, cwd=tmp_path)
    output, _ = second.communicate(timeout=600)
    assert second.returncode == 0, output
    assert f"({graded_before} already in the journal)" in output
    grades = _grades(out)
    assert {grades[(who, "attention")] for who in ("ada", "bob", "cy")} == {"passed"}, grades
    assert journal.read_text().count('"kind": "graded"') == 3  # nothing graded twice
    leftovers = [d for d in Path(tempfile.gettempdir()).glob("attn-grade-*")
                 if (d / "owner").is_file() and (d / "owner").read_text() == str(first.pid)]
    assert leftovers == [], "the killed grader's temporary folder was not cleaned up by the next run"


@pytest.mark.slow
def test_shards_graded_by_separate_processes_merge_into_one_table(tmp_path):
    root = tmp_path / "class"
    _class(root, ["ada", "bob", "cy", "dee"])
    (root / "bob" / f"{NOTEBOOK_05}.ipynb").write_bytes((root / "ada" / f"{NOTEBOOK_05}.ipynb").read_bytes())
    solutions = str(course_dir() / "solutions")
    shards = [_cli("--class", str(root), "--out", str(tmp_path / f"part{i}"), "--shard", f"{i}/2", "--jobs", "1", "--assigned", "05",
                   "--solutions", solutions, cwd=tmp_path) for i in (1, 2)]
    for shard in shards:
        output, _ = shard.communicate(timeout=600)
        assert shard.returncode == 0, output
    assert set(_grades(tmp_path / "part1")) == {(w, e) for w in ("ada", "cy") for e in ("attention", "score_matrix_bytes")}
    merged = _cli("--merge", str(tmp_path / "part1"), str(tmp_path / "part2"), "--out", str(tmp_path / "all"),
                  cwd=tmp_path)
    output, _ = merged.communicate(timeout=300)
    assert merged.returncode == 0, output
    grades = _grades(tmp_path / "all")
    assert {learner for learner, _ in grades} == {"ada", "bob", "cy", "dee"} and set(grades.values()) == {"passed"}
    summary = (tmp_path / "all" / "summary.md").read_text(encoding="utf-8")
    assert "Merged from shards 1/2, 2/2" in summary
    assert "byte-identical file to bob's 05_attention" in summary  # ada and bob were in different shards
    assert "no exercises" not in summary  # nobody handed in 00_setup: nothing to say about it
